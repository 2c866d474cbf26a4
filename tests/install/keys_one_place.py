"""Every store key a layer writes is formatted in one file of that layer
(CONVENTIONS.md): no string literal under src/ or lab/ spells a ferry/<kind>/ key
outside src/rl/keys.c (the rl layer) and src/sparse/object.c (sparse
objects). Comments are not code and are skipped. Prints each literal found
elsewhere; exits 1 if any."""
import glob
import os
import re
import sys

root = sys.argv[1]
OWNERS = {"src/rl/keys.c", "src/sparse/object.c"}
key = re.compile(r"ferry/(w|wk|wb|wc|wg|wl|pv|rl|kv|sp)(/|$)|^ferry/")


def literals(text):
    """(line, literal) of every string literal outside comments and #include lines."""
    i, n, line = 0, len(text), 1
    while i < n:
        c = text[i]
        if c == "\n":
            line += 1
            i += 1
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            line += text.count("\n", i, j)
            i = j
        elif text.startswith("//", i):
            j = text.find("\n", i)
            i = n if j < 0 else j
        elif c == "#" and text[text.rfind("\n", 0, i) + 1:i].strip() == "" and \
                re.match(r"#\s*include\b", text[i:]):
            j = text.find("\n", i)
            i = n if j < 0 else j
        elif c in "\"'":
            j = i + 1
            while j < n and text[j] != c:
                j += 2 if text[j] == "\\" else 1
            if c == '"':
                yield line, text[i + 1:j]
            i = j + 1
        else:
            i += 1


bad = []
for path in sorted(glob.glob(os.path.join(root, "src", "**", "*.[ch]"), recursive=True) +
                   glob.glob(os.path.join(root, "lab", "**", "*.[ch]"), recursive=True)):
    rel = os.path.relpath(path, root)
    if rel in OWNERS:
        continue
    with open(path, encoding="utf-8") as f:
        text = f.read()
    for line, lit in literals(text):
        if key.search(lit):
            bad.append(f'{rel}:{line}: "{lit}" spells a store key outside its layer\'s keys file')
for b in bad:
    print(b)
print(f"keys_one_place: {len(bad)} key literal(s) outside {', '.join(sorted(OWNERS))}")
sys.exit(1 if bad else 0)
