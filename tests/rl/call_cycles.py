"""The rl files that store and read generations call one way, never in a
cycle: from nm of the rl objects (the object files of ferry_obj, given as
arguments, ';'-separated lists too), A -> B when A uses a symbol B defines.
Fails if a strongly connected component holds two of gen*.c,
publish_keep.c, update.c, weights_read.c, or if keys.c (the keys every rl
file builds) calls into any other rl file. Prints every cycle in the layer
either way."""
import collections
import os
import re
import subprocess
import sys

objs = [p for a in sys.argv[1:] for p in a.split(";") if p]
objs = [p for p in objs if re.search(r"[/\\]src[/\\]rl[/\\][^/\\]+\.o$", p)]
if not objs:
    sys.exit("call_cycles: no rl object files given")
defined, used = {}, {}
for o in objs:
    f = os.path.basename(o)[:-2]
    out = subprocess.run(["nm", o], capture_output=True, text=True, check=True).stdout
    used[f] = set()
    for line in out.splitlines():
        p = line.split()
        if len(p) == 3 and p[1] in "TDBRV":
            defined[p[2]] = f
        elif len(p) == 2 and p[0] == "U":
            used[f].add(p[1])
graph = {f: {defined[s] for s in u if s in defined and defined[s] != f} for f, u in used.items()}

index, low, stack, on, comps = {}, {}, [], set(), []


def strong(v):
    index[v] = low[v] = len(index)
    stack.append(v)
    on.add(v)
    for w in sorted(graph[v]):
        if w not in index:
            strong(w)
            low[v] = min(low[v], low[w])
        elif w in on:
            low[v] = min(low[v], index[w])
    if low[v] == index[v]:
        comp = []
        while True:
            w = stack.pop()
            on.discard(w)
            comp.append(w)
            if w == v:
                break
        comps.append(sorted(comp))


sys.setrecursionlimit(10000)
for v in sorted(graph):
    if v not in index:
        strong(v)
watched = re.compile(r"^(gen[a-z_]*|publish_keep|update|weights_read)\.c$")
bad = False
for comp in (c for c in comps if len(c) > 1):
    hit = [f for f in comp if watched.match(f)]
    print(f"call_cycles: cycle {' '.join(comp)}{'  <- not allowed' if len(hit) > 1 else ''}")
    bad |= len(hit) > 1
if graph.get("keys.c"):
    print(f"call_cycles: keys.c calls {' '.join(sorted(graph['keys.c']))}  <- not allowed")
    bad = True
print(f"call_cycles: {len(graph)} rl files, {'a cycle among the generation files' if bad else 'gen*.c, publish_keep.c, update.c, weights_read.c call one way'}")
sys.exit(1 if bad else 0)
