#!/usr/bin/env python3
"""Checks that code compiled for a specific ISA holds functions only.

A static object, thread_local, function-local static or namespace-scope constant object
whose initializer is compiled inside a `#pragma GCC target` region or a function with a
`target` attribute runs that ISA's instructions where the object is built: at start-up
on every CPU for a global (the AVX-512 kGroupIndex constructor killed slim with SIGILL
before main on AVX2 machines), or behind the dispatcher's back for a local one. Tables
that SIMD code loads are constexpr, kernel-set structs are built outside the regions.
The emulated-CPU tests catch such an object when it runs; this catches it in the source.

usage: check_target_regions.py SOURCE_ROOT...   (exit 1 and one line per finding)
"""
import pathlib
import re
import sys

PUSH = re.compile(r"#\s*pragma\s+GCC\s+push_options")
TARGET = re.compile(r"#\s*pragma\s+GCC\s+target\s*\(")
POP = re.compile(r"#\s*pragma\s+GCC\s+pop_options")
ATTR = re.compile(r"__attribute__\s*\(\(\s*target\s*\(|\[\[\s*gnu::target\s*\(")
# Objects with storage that outlives a call, except compile-time constants.
STORAGE = re.compile(r"\b(static|thread_local)\b(?!\s+(inline|constexpr)\b)(?!_)")
NS_CONST = re.compile(r"^(const|inline\s+const)\s+[\w:<>, ]+\s+k[A-Z]\w*\s*(\[[^\]]*\])?\s*[;({=]")


def strip_comments(text):
    text = re.sub(r"/\*.*?\*/", lambda m: "\n" * m.group(0).count("\n"), text, flags=re.S)
    return [re.sub(r"//.*", "", line) for line in text.split("\n")]


def attribute_bodies(lines):
    """Line ranges of functions (or lambdas) that carry a target attribute."""
    spans = []
    for i, line in enumerate(lines):
        m = ATTR.search(line)
        if not m:
            continue
        depth, start, j, col = 0, None, i, m.end()
        while j < len(lines):
            for ch in lines[j][col:]:
                if ch == "{":
                    depth += 1
                    start = j if start is None else start
                elif ch == "}":
                    depth -= 1
                    if start is not None and depth == 0:
                        break
                elif ch == ";" and start is None:
                    break  # a declaration, no body
            else:
                j, col = j + 1, 0
                continue
            break
        if start is not None:
            spans.append((i, j))
    return spans


def check(path):
    lines = strip_comments(path.read_text(errors="replace"))
    in_region = [False] * len(lines)
    stack = []
    for i, line in enumerate(lines):
        if PUSH.search(line):
            stack.append(False)
        elif TARGET.search(line) and stack:
            stack[-1] = True
        elif POP.search(line) and stack:
            stack.pop()
        in_region[i] = any(stack)
    for a, b in attribute_bodies(lines):
        for k in range(a, b + 1):
            in_region[k] = True
    findings = []
    for i, line in enumerate(lines):
        if not in_region[i]:
            continue
        if STORAGE.search(line) and not re.search(r"\bstatic\s+[\w:<>\s\*&]+\s*\w+\s*\(", line):
            findings.append((i + 1, line.strip()))
        elif NS_CONST.search(line.strip()) and not line.startswith((" ", "\t")):
            findings.append((i + 1, line.strip()))
    return findings


def main(roots):
    bad = 0
    for root in roots:
        for path in sorted(pathlib.Path(root).rglob("*")):
            if path.suffix not in (".cc", ".h"):
                continue
            for line_no, text in check(path):
                print(f"{path}:{line_no}: object with storage inside an ISA target region: {text}")
                bad += 1
    print(f"check_target_regions: {bad} finding(s)")
    return 1 if bad else 0


if __name__ == "__main__":
    if len(sys.argv) < 2 or sys.argv[1] in ("-h", "--help"):
        print(__doc__)
        sys.exit(0 if len(sys.argv) > 1 else 2)
    sys.exit(main(sys.argv[1:]))
