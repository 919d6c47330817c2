#!/usr/bin/env python3
"""Finds import circles between the modules of each crate under crates/.

A module is a source file (`src/foo.rs` or `src/foo/mod.rs` is module
`foo`; `src/foo/bar.rs` is `foo::bar`). An edge a -> b is any path that
names `crate::b...` (or `super::b` resolved against a) in a's non-comment,
non-test text. A circle is a strongly connected component of more than one
module. Parent/child edges (a module naming its own submodule, or a child
naming its parent through `super::`) are how Rust nests code, not circles,
and are ignored. Test code (`tests.rs`, `proptests.rs`, files under tests/,
and everything from a `#[cfg(test)] mod` on) is left out.

Usage: scripts/module-cycles.py [CRATES_DIR]; exits 1 when a circle is found.
"""

import os
import re
import sys

PATH_RE = re.compile(r"\b(crate|super)((?:::\w+)+)")
USE_GROUP_RE = re.compile(r"use\s+(crate|super)::\{([^;]*)\}\s*;", re.S)
COMMENT_RE = re.compile(r"//[^\n]*")
# A test module: `#[cfg(test)]`, maybe more attributes, then `mod NAME`.
TEST_MOD_RE = re.compile(r"#\[cfg\(test\)\]\s*(?:#\[[^\]]*\]\s*)*(?:pub(?:\([^)]*\))?\s+)?mod\s+\w+")
TEST_FILES = {"tests.rs", "proptests.rs", "testsuite.rs"}


def module_of(src_dir, path):
    rel = os.path.relpath(path, src_dir)[: -len(".rs")]
    parts = rel.split(os.sep)
    if parts[-1] == "mod":
        parts = parts[:-1]
    if parts in (["lib"], ["main"]):
        return ()
    return tuple(parts)


def strip(text):
    m = TEST_MOD_RE.search(text)
    if m:
        text = text[: m.start()]
    return COMMENT_RE.sub("", text)


def targets(mod, text, modules):
    """Modules named by paths in `text` of module `mod`."""
    found = set()
    paths = []
    for m in USE_GROUP_RE.finditer(text):
        root = m.group(1)
        for item in re.split(r",", m.group(2)):
            item = item.strip()
            if item:
                paths.append((root, ["", *re.split(r"::", item.split("{")[0].strip())]))
    for m in PATH_RE.finditer(text):
        paths.append((m.group(1), m.group(2).split("::")))
    for root, segs in paths:
        segs = [s for s in segs if s]
        if root == "crate":
            base = ()
        else:
            # super:: inside foo/bar.rs is foo; inside foo.rs or foo/mod.rs is crate.
            base = mod[:-1]
        cand = base + tuple(segs)
        # The longest prefix that is a known module.
        for n in range(len(cand), 0, -1):
            if cand[:n] in modules:
                found.add(cand[:n])
                break
    return found


def related(a, b):
    return a[: len(b)] == b or b[: len(a)] == a


def sccs(graph):
    index, low, stack, on, out = {}, {}, [], set(), []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
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
            out.append(comp)

    sys.setrecursionlimit(10000)
    for v in list(graph):
        if v not in index:
            visit(v)
    return out


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else "crates"
    bad = 0
    for crate in sorted(os.listdir(root)):
        src = os.path.join(root, crate, "src")
        if not os.path.isdir(src):
            continue
        files = {}
        for d, _, names in os.walk(src):
            for n in names:
                if n.endswith(".rs") and n not in TEST_FILES:
                    p = os.path.join(d, n)
                    files[module_of(src, p)] = p
        modules = set(files)
        graph = {}
        for mod, path in files.items():
            with open(path, encoding="utf-8") as f:
                text = strip(f.read())
            graph[mod] = {t for t in targets(mod, text, modules) if t != mod and not related(mod, t)}
        for comp in sccs(graph):
            if len(comp) > 1:
                bad += 1
                names = sorted("::".join(m) or "lib" for m in comp)
                print(f"{crate}: circle between {', '.join(names)}")
    if bad:
        print(f"{bad} import circle(s)")
        return 1
    print("no import circles")
    return 0


if __name__ == "__main__":
    sys.exit(main())
