"""Regenerate the generated parts of ``patches/README.md``: its pin line, from
``build_support/llama_source.py``, and the patch table, from the series itself.

    python tools/patch_readme.py           # rewrite them in place
    python tools/patch_readme.py --check   # exit 1 when either is stale (what the test runs)

The pin line is the line starting ``The pinned source:``. Each row of the table is a patch file's
name, its line count and its header's subject line. A header is what precedes the diff: a subject
line, a blank line, a paragraph saying why, a blank line and the diffstat (``git diff --stat``), as in
every patch of the series. Everything else in the README is hand-written and kept as it is.
"""

from __future__ import annotations

import argparse
import importlib.util
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parent.parent
PATCH_DIR = ROOT / "patches"
README = PATCH_DIR / "README.md"
LLAMA_SOURCE = ROOT / "build_support" / "llama_source.py"
PIN_PREFIX = "The pinned source: "

TABLE_HEAD = ["| patch | lines | subject (the patch header's first line) |", "|---|---:|---|"]
_DIFF_START = re.compile(r"^(diff --git |--- )", re.M)
_SUMMARY = re.compile(r"^ (\d+) files? changed(?:, (\d+) insertions?\(\+\))?(?:, (\d+) deletions?\(-\))?$")
_HUNK = re.compile(r"^@@ -\d+(?:,(\d+))? \+\d+(?:,(\d+))? @@")


@dataclass(frozen=True)
class Header:
    subject: str
    why: str          # the paragraph(s) between the subject and the diffstat
    summary: tuple[int, int, int] | None  # (files, insertions, deletions) of the diffstat's last line


def series(patch_dir: Path = PATCH_DIR) -> list[Path]:
    """The patches in the order ``build_support/llama_source.py`` applies them (name order)."""
    return sorted(patch_dir.glob("*.patch"))


def parse_header(text: str) -> Header:
    """The header of a patch's text (empty fields where a part is missing)."""
    m = _DIFF_START.search(text)
    lines = text[: m.start() if m else len(text)].rstrip("\n").split("\n")
    subject = lines[0].strip() if lines and not lines[0].startswith(" ") else ""
    summary = None
    stat_start = len(lines)
    for i in range(len(lines) - 1, 0, -1):
        s = _SUMMARY.match(lines[i])
        if s:
            summary = tuple(int(g or 0) for g in s.groups())
            stat_start = i
            while stat_start > 1 and " | " in lines[stat_start - 1]:
                stat_start -= 1
            break
    why = "\n".join(lines[1:stat_start]).strip() if subject else ""
    return Header(subject, why, summary)


def diff_summary(text: str) -> tuple[int, int, int]:
    """(files, insertions, deletions) counted from the diff itself, hunk by hunk."""
    m = _DIFF_START.search(text)
    lines = text[m.start():].split("\n") if m else []
    files, plus, minus = set(), 0, 0
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("+++ ") and i > 0 and lines[i - 1].startswith("--- "):
            old, new = lines[i - 1][4:].split("\t")[0], line[4:].split("\t")[0]
            files.add(new if new != "/dev/null" else old)
        h = _HUNK.match(line)
        if h:
            n_old = int(h.group(1) if h.group(1) is not None else 1)
            n_new = int(h.group(2) if h.group(2) is not None else 1)
            i += 1
            while (n_old > 0 or n_new > 0) and i < len(lines):
                c = lines[i][:1]
                if c == "-":
                    minus += 1
                    n_old -= 1
                elif c == "+":
                    plus += 1
                    n_new -= 1
                elif c == "\\":  # "\ No newline at end of file"
                    pass
                else:
                    n_old -= 1
                    n_new -= 1
                i += 1
            continue
        i += 1
    return len(files), plus, minus


def line_count(path: Path) -> int:
    return len(path.read_text().splitlines())


def table(patch_dir: Path = PATCH_DIR) -> str:
    rows = list(TABLE_HEAD)
    for p in series(patch_dir):
        subject = parse_header(p.read_text()).subject.replace("|", "\\|")
        rows.append(f"| `{p.name}` | {line_count(p)} | {subject} |")
    return "\n".join(rows)


def llama_source() -> ModuleType:
    """``build_support/llama_source.py``, the one place the pin is written (a script, not a package:
    loaded from its file, nothing put on ``sys.path``)."""
    spec = importlib.util.spec_from_file_location("llama_source", LLAMA_SOURCE)
    assert spec is not None and spec.loader is not None, LLAMA_SOURCE
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def pin_line() -> str:
    src = llama_source()
    return (f"{PIN_PREFIX}ggml-org/llama.cpp@{src.PINNED_COMMIT}, from the `{src.PINNED_PACKAGE}` sdist "
            "(written once, in `build_support/llama_source.py`; this line is generated from it).")


def render_pin(readme: str, line: str) -> str:
    """``readme`` with its pin line (the one starting with ``PIN_PREFIX``) replaced by ``line``."""
    lines = readme.split("\n")
    at = [i for i, text in enumerate(lines) if text.startswith(PIN_PREFIX)]
    if len(at) != 1:
        raise ValueError(f"the README needs one line starting {PIN_PREFIX!r}, has {len(at)}")
    lines[at[0]] = line
    return "\n".join(lines)


def generate(readme: str) -> str:
    """``readme`` with its generated parts current: the pin line and the patch table."""
    return render_pin(render(readme, table()), pin_line())


def render(readme: str, new_table: str) -> str:
    """``readme`` with its first table (the block of lines starting with ``|``) replaced."""
    lines = readme.split("\n")
    start = next((i for i, line in enumerate(lines) if line.startswith("|")), None)
    if start is None:
        raise ValueError("the README has no table to replace")
    end = start
    while end < len(lines) and lines[end].startswith("|"):
        end += 1
    return "\n".join(lines[:start] + new_table.split("\n") + lines[end:])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--check", action="store_true",
                    help="only say whether the pin line and the table are current (exit 1 if not)")
    args = ap.parse_args(argv)
    current = README.read_text()
    wanted = generate(current)
    if args.check:
        if wanted != current:
            print(f"{README.relative_to(ROOT)}: the pin line or the patch table is stale; run python "
                  "tools/patch_readme.py", file=sys.stderr)
            return 1
        return 0
    if wanted != current:
        README.write_text(wanted)
        print(f"{README.relative_to(ROOT)}: pin line and table rewritten ({len(series())} patches)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
