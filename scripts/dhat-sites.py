#!/usr/bin/env python3
"""Where the bytes live at the heap's peak, from a DHAT profile (`valgrind --tool=dhat`), by
allocation site: each site is named by the first frame of its stack that is not the
allocator or a generic container (Vec, String, BytesMut, ...), with the crate it belongs to.
Usage: scripts/dhat-sites.py DHAT.json [PER=1] [TOP=30]
PER divides the bytes (e.g. the number of parked releases), to read them per release."""
import json, re, sys
from collections import defaultdict

path = sys.argv[1]
per = int(sys.argv[2]) if len(sys.argv) > 2 else 1
top = int(sys.argv[3]) if len(sys.argv) > 3 else 30
profile = json.load(open(path))
frames = profile["ftbl"]

# Frames that only say "memory was allocated": the allocator, and containers that grow.
GENERIC = re.compile(
    r"malloc|calloc|realloc|__rust|alloc::|core::|std::|hashbrown|bytes::|RawVec|"
    r"<alloc|<core|<std|<bytes|<hashbrown|indexmap|smallvec|serde_json::|serde::|"
    r"<serde_json|<&mut serde_json|<serde|futures_util|<futures"
)


def describe(index):
    text = frames[index]
    # "0x...: function (file:line)" or "[root]"
    m = re.match(r"0x[0-9A-Fa-f]+: (.*?)(?: \(.*\))?$", text)
    return m.group(1) if m else text


def site(stack):
    names = [describe(i) for i in stack]
    for name in names:
        if not GENERIC.search(name):
            return name
    return names[-1] if names else "?"


def crate(name):
    m = re.match(r"<?(?:&mut )?([a-z_][a-z0-9_]*)::", name)
    return m.group(1) if m else "?"


at_peak = defaultdict(int)
blocks = defaultdict(int)
by_crate = defaultdict(int)
for pp in profile["pps"]:
    if not pp.get("gb"):
        continue
    name = site(pp["fs"])
    at_peak[name] += pp["gb"]
    blocks[name] += pp.get("gbk", 0)
    by_crate[crate(name)] += pp["gb"]

total = sum(at_peak.values())
# The total holds everything live at the peak, start-up included (certificates, regexes,
# pools): divided by PER it is an upper bound, not a per-release figure. Sites that belong to
# one release each (about 1 block per PER) are.
print(f"bytes live at the heap's peak, start-up included: {total:,} "
      f"({total / per / 1000:.1f} kB / {per}, an upper bound per release)")
print("by crate of the allocating frame:")
for name, size in sorted(by_crate.items(), key=lambda kv: -kv[1])[:12]:
    print(f"  {size / per:10,.0f} B  {name}")
print("by site:")
for name, size in sorted(at_peak.items(), key=lambda kv: -kv[1])[:top]:
    print(f"  {size / per:10,.0f} B  {blocks[name] / per:6.1f} blocks  {name[:150]}")
