#!/usr/bin/env python3
"""The docs' shell blocks, for the deployment drill (scripts/deploy-drill.sh), which runs them as written.

A block the drill runs is named by the comment on the line above its fence:
    <!-- drill: NAME -->
and a block it cannot run here says why the same way:
    <!-- not run by the drill: REASON -->

    doc-blocks.py show FILE NAME     prints the block NAME of FILE, as written
    doc-blocks.py names FILE...      prints FILE:NAME for every named block
    doc-blocks.py check FILE...      fails, naming each, for a shell block that drives Docker or Compose
                                     (or kubectl) and carries neither comment, a REASON left empty, or
                                     a NAME used twice
"""
import re
import sys
from pathlib import Path

MARK = re.compile(r"^<!--\s*(drill:\s*(?P<name>[a-z0-9-]+)|not run by the drill:(?P<why>.*?))\s*-->\s*$")
FENCE = re.compile(r"^```(sh|bash|shell)\s*$")
DRIVES_CONTAINERS = re.compile(r"\bdocker\b|\bkubectl\b")


def blocks(path):
    """(line number, marker match or None, text) for every shell block of the file."""
    lines = Path(path).read_text().splitlines()
    found, i = [], 0
    while i < len(lines):
        if FENCE.match(lines[i]):
            start = i
            j = i + 1
            while j < len(lines) and lines[j].strip() != "```":
                j += 1
            k = start - 1
            while k >= 0 and not lines[k].strip():
                k -= 1
            mark = MARK.match(lines[k].strip()) if k >= 0 else None
            found.append((start + 1, mark, "\n".join(lines[start + 1:j]) + "\n"))
            i = j + 1
        else:
            i += 1
    return found


def main(argv):
    if len(argv) == 3 and argv[0] == "show":
        for _, mark, text in blocks(argv[1]):
            if mark and mark.group("name") == argv[2]:
                sys.stdout.write(text)
                return 0
        print(f"doc-blocks.py: {argv[1]} has no block marked <!-- drill: {argv[2]} -->", file=sys.stderr)
        return 1
    if len(argv) >= 2 and argv[0] == "names":
        for path in argv[1:]:
            for _, mark, _ in blocks(path):
                if mark and mark.group("name"):
                    print(f"{path}:{mark.group('name')}")
        return 0
    if len(argv) >= 2 and argv[0] == "check":
        problems, seen = [], {}
        for path in argv[1:]:
            for line, mark, text in blocks(path):
                where = f"{path}:{line}"
                if mark is None:
                    if DRIVES_CONTAINERS.search(text):
                        problems.append(f"{where}: a shell block that drives containers is neither run by the drill "
                                        "(<!-- drill: NAME -->) nor marked <!-- not run by the drill: REASON -->")
                    continue
                if mark.group("name"):
                    name = mark.group("name")
                    if name in seen:
                        problems.append(f"{where}: drill block {name} is also at {seen[name]}")
                    seen[name] = where
                elif not mark.group("why").strip():
                    problems.append(f"{where}: 'not run by the drill' gives no reason")
        for p in problems:
            print(p, file=sys.stderr)
        if problems:
            return 1
        print(f"doc-blocks.py: {len(seen)} blocks run by the drill; every other container block says why not")
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
