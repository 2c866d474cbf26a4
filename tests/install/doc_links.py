"""Every link in README.md and docs/*.md to a file of this repository points
at a file that exists (anchors are not checked), and every docs/*.md named
in a header or source comment exists. Prints each broken link; exits 1 if
any."""
import glob
import os
import re
import sys

root = sys.argv[1]
link = re.compile(r"\]\(([^)\s]+)\)")
bad = []
pages = [os.path.join(root, "README.md")] + sorted(glob.glob(os.path.join(root, "docs", "*.md")))
for page in pages:
    with open(page, encoding="utf-8") as f:
        text = f.read()
    for target in link.findall(text):
        if re.match(r"^[a-z]+:", target) or target.startswith("#"):
            continue   # a URL or an anchor of the page itself
        path = target.split("#", 1)[0]
        if not os.path.exists(os.path.normpath(os.path.join(os.path.dirname(page), path))):
            bad.append(f"{os.path.relpath(page, root)}: ({target}) points at no file")
named = re.compile(r"docs/([A-Za-z0-9_]+\.md)")
sources = glob.glob(os.path.join(root, "include", "ferry", "*.h")) + \
    glob.glob(os.path.join(root, "src", "**", "*.[ch]"), recursive=True) + \
    glob.glob(os.path.join(root, "python", "ferry", "*.py"))
for src in sorted(sources):
    with open(src, encoding="utf-8") as f:
        for doc in sorted(set(named.findall(f.read()))):
            if not os.path.exists(os.path.join(root, "docs", doc)):
                bad.append(f"{os.path.relpath(src, root)}: names docs/{doc}, which does not exist")
print(f"doc_links: {len(pages)} pages and {len(sources)} sources read")
for b in bad:
    print("doc_links:", b)
sys.exit(1 if bad else 0)
