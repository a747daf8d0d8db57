#!/usr/bin/env python3
"""The module import graph of src/ (not part of CI): which module (file) names which other
module through `crate::...` or `super::...` paths, its circles, and the imports that run
against the layers (domain, then config, telemetry, then the adapters
store and model, then actors, then http and check, then tools: an import goes down only).

Usage: scripts/imports.py [SRC_DIR=src]   prints the edges against the layers, the
strongly connected components and the count of elementary circles (modules = files).
"""
import os
import re
import sys

import networkx as nx

src = sys.argv[1] if len(sys.argv) > 1 else "src"


def module_of(path):
    rel = os.path.relpath(path, src)[:-3].split(os.sep)
    if rel[-1] in ("mod", "lib", "main"):
        rel = rel[:-1]
    return tuple(rel)


modules = {}
for root, _, files in os.walk(src):
    for f in files:
        if f.endswith(".rs"):
            p = os.path.join(root, f)
            modules[module_of(p)] = p
known = set(modules)

PATH = re.compile(r"\b((?:crate|super|self)(?:::[A-Za-z_][A-Za-z0-9_]*)+)")
GROUP = re.compile(r"\b((?:crate|super|self)(?:::[A-Za-z_][A-Za-z0-9_]*)*)::\{([^;]*?)\}\s*;", re.S)


def resolve(me, path):
    parts = path.split("::")
    if parts[0] == "crate":
        base, rest = (), parts[1:]
    else:
        base = list(me)
        # a file `a/b.rs` is module a::b; `super` is a
        while parts and parts[0] in ("super", "self"):
            if parts[0] == "super":
                base = base[:-1]
            parts = parts[1:]
        base, rest = tuple(base), parts
    best = None
    for i in range(len(rest), -1, -1):
        cand = base + tuple(rest[:i])
        if cand in known:
            best = cand
            break
    return best


def strip_tests(text):
    # drop `#[cfg(test)] mod tests { ... }` blocks: tests may reach anywhere
    out, i = [], 0
    for m in re.finditer(r"#\[cfg\(test\)\]\s*mod\s+\w+\s*\{", text):
        if m.start() < i:
            continue
        out.append(text[i:m.start()])
        depth, j = 1, m.end()
        while j < len(text) and depth:
            depth += {"{": 1, "}": -1}.get(text[j], 0)
            j += 1
        i = j
    out.append(text[i:])
    return "".join(out)


g = nx.DiGraph()
for me, p in modules.items():
    g.add_node(me)
    text = strip_tests(open(p, encoding="utf-8").read())
    text = re.sub(r"//[^\n]*", "", text)
    paths = set(PATH.findall(text))
    for prefix, body in GROUP.findall(text):
        for item in re.split(r"[,\s]+", re.sub(r"\{[^}]*\}", "", body)):
            item = item.split(" as ")[0].strip()
            if item and re.match(r"[A-Za-z_]", item):
                paths.add(prefix + "::" + item)
    for path in paths:
        target = resolve(me, path)
        if target is None or target == me:
            continue
        # a module naming its own descendants, or its ancestors' mod.rs re-exports, is
        # structure, not an import: count edges between distinct files only
        g.add_edge(me, target)

name = lambda m: "::".join(m) or "crate"

# The layers, lowest first; an import may only go down (or stay within one module).
LAYER = {"domain": 0, "input_file": 1, "log_writer": 1, "config": 1, "telemetry": 2, "store": 3, "model": 3, "actors": 4,
         "http": 5, "check": 5, "tools": 6, "main": 7}
against = []
for a, b in g.edges():
    if not a or not b or a[0] == b[0]:
        continue
    la, lb = LAYER.get(a[0], 7), LAYER.get(b[0], 7)
    if la < lb or (la == lb and a[0] != b[0]):
        against.append((a, b))
print(f"imports against the layers: {len(against)}")
for a, b in sorted(against):
    print(f"  {name(a)} -> {name(b)}")
sccs = [s for s in nx.strongly_connected_components(g) if len(s) > 1]
cycles = list(nx.simple_cycles(g))
print(f"strongly connected groups: {len(sccs)}")
for s in sccs:
    print("  {" + ", ".join(sorted(name(m) for m in s)) + "}")
print(f"circles (elementary cycles): {len(cycles)}")
for c in sorted(cycles, key=len)[:40]:
    print("  " + " -> ".join(name(m) for m in c + [c[0]]))
