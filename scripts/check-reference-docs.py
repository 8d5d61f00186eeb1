#!/usr/bin/env python3
"""Checks docs/configuration.md against an attune binary and the Swift sources.

    scripts/check-reference-docs.py .build/debug/attune      # from the repository's root

Fails (exit 1, listing each gap) when
  - a flag of a command (found by walking `attune help`, recursively through each SUBCOMMANDS section) has no
    row in that command's table: the table under the heading that names the command in backticks, e.g.
    "### `attune model export`", whose rows start with the flag (`--output FILE`, or `-o`, `--output FILE`);
  - a row documents a flag the command does not have (a flag removed or renamed);
  - an environment variable the sources read (a string literal "ATTUNE_..." or "BLIS_..." in Sources/, outside
    comments) has no row in one of the environment tables (a row starting with `NAME`).
Prints one line on success. Python 3 standard library only.
"""

import concurrent.futures
import pathlib
import re
import subprocess
import sys

DOC = pathlib.Path("docs/configuration.md")
SOURCES = pathlib.Path("Sources")
# ArgumentParser's own flags, on every command.
GENERIC_HELP = {"Show the version.", "Show help information."}


def run_help(binary, path):
    result = subprocess.run([binary, "help", *path], capture_output=True, text=True, timeout=30)
    if result.returncode != 0:
        raise SystemExit(f"`{binary} help {' '.join(path)}` exited {result.returncode}: {result.stderr.strip()}")
    return result.stdout


def section(text, name):
    """The lines of a help section (OPTIONS, SUBCOMMANDS, ...), up to the next unindented line."""
    match = re.search(r"^" + name + r":\n(.*?)(?=^\S|\Z)", text, re.S | re.M)
    return match.group(1) if match else ""


def entries(text):
    """(name, help) pairs of a section: a name at two spaces of indent, its help beside it or below."""
    found = []
    for line in text.splitlines():
        match = re.match(r"^  (\S.*?)(?:\s{2,}(\S.*))?$", line)
        if match:
            found.append([match.group(1).strip(), (match.group(2) or "").strip()])
        elif found and line.strip():
            found[-1][1] = (found[-1][1] + " " + line.strip()).strip()
    return found


def subcommands(text):
    names = []
    for name, _ in entries(section(text, "SUBCOMMANDS")):
        if name.startswith("See "):
            continue
        names.append(name.replace(" (default)", "").split()[0])
    return names


def long_flags(text):
    """The command's long flags, without ArgumentParser's --help and --version (a command's own --version
    <version> option is kept)."""
    flags = set()
    for name, help_text in entries(section(text, "OPTIONS")):
        # "-o, --output <output>", or a long one with its help after a single space: "--jobs-file <jobs-file> JSON ..."
        match = re.match(r"^((?:-\w, )?--[A-Za-z0-9][A-Za-z0-9-]*)( <[^>]+>)?(.*)$", name)
        if not match:
            continue
        if match.group(3).strip():
            help_text = (match.group(3).strip() + " " + help_text).strip()
        if help_text in GENERIC_HELP and not match.group(2):
            continue
        flags.update(re.findall(r"--[A-Za-z0-9][A-Za-z0-9-]*", match.group(1)))
    return flags


def walk(binary):
    """{('model', 'export'): {'--name', ...}} for every command that has no subcommands."""
    commands = {}
    with concurrent.futures.ThreadPoolExecutor(max_workers=8) as pool:
        pending = {pool.submit(run_help, binary, []): ()}
        while pending:
            done, _ = concurrent.futures.wait(pending, return_when=concurrent.futures.FIRST_COMPLETED)
            for future in done:
                path = pending.pop(future)
                text = future.result()
                children = subcommands(text)
                if len(path) > 6:
                    raise SystemExit(f"help nests deeper than expected at: attune {' '.join(path)}")
                if children:
                    for child in children:
                        pending[pool.submit(run_help, binary, [*path, child])] = (*path, child)
                else:
                    commands[path] = long_flags(text)
    return commands


def documented_flags(doc):
    """{('model', 'export'): {'--name', ...}} from the tables under "### `attune model export`" headings."""
    documented = {}
    current = None
    for line in doc.splitlines():
        heading = re.match(r"^#{1,6}\s+(.*)$", line)
        if heading:
            command = re.search(r"`attune((?: [a-z][a-z0-9-]*)*)`", heading.group(1))
            current = tuple(command.group(1).split()) if command else None
            if current is not None:
                documented.setdefault(current, set())
            continue
        if current is None or not line.startswith("|"):
            continue
        first = line.split("|")[1]
        documented[current].update(re.findall(r"`(--[A-Za-z0-9][A-Za-z0-9-]*)(?: [^`]*)?`", first))
    return documented


def documented_variables(doc):
    names = set()
    for line in doc.splitlines():
        if line.startswith("|"):
            names.update(re.findall(r"`((?:ATTUNE|BLIS)_[A-Z0-9_]+)(?:=[^`]*)?`", line.split("|")[1]))
    return names


def variables_in_sources():
    """Every "ATTUNE_..." and "BLIS_..." string literal in the Swift and C sources, outside comments: the
    names the code looks up (directly, as environment["ATTUNE_X"], or through a constant it looks up)."""
    names = set()
    for path in sorted(SOURCES.rglob("*")):
        if path.suffix not in (".swift", ".c", ".h") or "Generated" in path.parts:
            continue
        for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
            stripped = line.strip()
            if stripped.startswith(("//", "/*", "*")):
                continue
            code = re.sub(r"\s//.*$", "", line)
            names.update(re.findall(r'"((?:ATTUNE|BLIS)_[A-Z0-9_]+)"', code))
    return names


def main():
    if len(sys.argv) != 2:
        raise SystemExit(f"usage: {sys.argv[0]} PATH-TO-ATTUNE-BINARY   (run from the repository's root)")
    binary = sys.argv[1]
    if not pathlib.Path(binary).is_file():
        raise SystemExit(f"{sys.argv[0]}: no {binary}; run swift build first")
    if not DOC.is_file() or not SOURCES.is_dir():
        raise SystemExit(f"{DOC} or {SOURCES}/ not found: run this from the repository's root")
    doc = DOC.read_text(encoding="utf-8")

    commands = walk(binary)
    documented = documented_flags(doc)
    problems = []
    flag_count = 0
    for path in sorted(commands):
        name = " ".join(("attune", *path))
        flags = commands[path]
        flag_count += len(flags)
        if path not in documented:
            if flags:
                problems.append(f"{name}: no section headed `{name}` in {DOC}")
            continue
        for flag in sorted(flags - documented[path]):
            problems.append(f"{name}: flag {flag} is not in its table in {DOC}")
        for flag in sorted(documented[path] - flags):
            problems.append(f"{name}: {DOC} documents {flag}, which `{name} --help` does not have")
    for path in sorted(set(documented) - set(commands)):
        if path and documented[path]:
            problems.append(f"{DOC} has a table for `attune {' '.join(path)}`, which the binary does not have")

    variables = variables_in_sources()
    for variable in sorted(variables - documented_variables(doc)):
        problems.append(f"environment variable {variable} (read in {SOURCES}/) is not in an environment table in {DOC}")

    if problems:
        print(f"reference docs: {len(problems)} problem(s):", file=sys.stderr)
        for problem in problems:
            print(f"  {problem}", file=sys.stderr)
        return 1
    print(f"reference docs: {flag_count} flags of {len(commands)} commands and {len(variables)} environment "
          f"variables documented")
    return 0


if __name__ == "__main__":
    sys.exit(main())
