"""The patch series as text (no compiled extension): every patch has a header, the header's diffstat is
the diff's, patches/README.md's table is what tools/patch_readme.py generates from the series, and the
series keeps its shape (reviewable sizes, one number per patch, 00xx outside ggml/ and 01xx inside it).
That a reorganised series applies to the same tree is checked by tools/patch_series_check.py, which needs
the pinned source."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent.parent / "build_support"))
import llama_source  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent.parent / "tools"))
import patch_readme  # noqa: E402

PATCHES = patch_readme.series()


def test_the_series_is_not_empty():
    assert len(PATCHES) >= 10


def test_readme_patch_table_is_current():
    readme = patch_readme.README.read_text()
    assert patch_readme.render(readme, patch_readme.table()) == readme, \
        "patches/README.md's table is stale: run python tools/patch_readme.py"


@pytest.mark.parametrize("patch", PATCHES, ids=lambda p: p.name)
def test_every_patch_has_a_header(patch):
    header = patch_readme.parse_header(patch.read_text())
    assert header.subject, "no subject line"
    assert header.why, "no paragraph between the subject line and the diffstat"
    assert header.summary is not None, "no diffstat (`git diff --stat`) before the diff"


@pytest.mark.parametrize("patch", PATCHES, ids=lambda p: p.name)
def test_patch_header_diffstat_matches_its_diff(patch):
    text = patch.read_text()
    assert patch_readme.parse_header(text).summary == patch_readme.diff_summary(text)


MAX_LINES = 500  # a reviewer reads one concern at a time: split a patch that grows past this


@pytest.mark.parametrize("patch", PATCHES, ids=lambda p: p.name)
def test_every_patch_is_reviewable_in_one_sitting(patch):
    assert patch_readme.line_count(patch) <= MAX_LINES, f"{patch.name}: split it by concern"


def test_every_patch_has_its_own_number():
    numbers = [p.name.split("-", 1)[0] for p in PATCHES]
    assert all(len(n) == 4 and n.isdigit() for n in numbers), numbers
    assert len(set(numbers)) == len(numbers)


@pytest.mark.parametrize("patch", PATCHES, ids=lambda p: p.name)
def test_number_ranges_00xx_llama_01xx_ggml(patch):
    touched, created = llama_source.patch_paths(patch)
    in_ggml = {f.startswith("ggml/") for f in touched + created}
    assert in_ggml == ({True} if patch.name.startswith("01") else {False}), sorted(set(touched + created))


def test_readme_pin_line_is_generated_from_llama_source():
    readme = patch_readme.README.read_text()
    assert patch_readme.render_pin(readme, patch_readme.pin_line()) == readme, \
        "patches/README.md's pin line is stale: run python tools/patch_readme.py"
    assert llama_source.PINNED_COMMIT in patch_readme.pin_line()


ROOT = Path(__file__).parent.parent
_PINS = {  # what a document may quote of the pin, and the value it must then have
    "commit": (re.compile(r"llama\.cpp@([0-9a-f]{7,40})\b"), llama_source.PINNED_COMMIT),
    "version": (re.compile(r"llama[-_]cpp[-_]python(?:==|-)(\d+(?:\.\d+)+)"), llama_source.PINNED_VERSION),
}


def test_documents_quote_the_pin_llama_source_holds():
    """The pin is written once (build_support/llama_source.py); a README that shows it shows that one."""
    docs = sorted({*ROOT.glob("*.md"), *(p for d in ("patches", "tools", "bench", "examples", "mtp_bindings")
                                          for p in (ROOT / d).rglob("*.md"))})
    assert ROOT / "patches" / "README.md" in docs
    wrong = [f"{doc.relative_to(ROOT)}: {what} {m.group(1)} (the pin: {pinned})"
             for doc in docs for what, (pattern, pinned) in _PINS.items()
             for m in pattern.finditer(doc.read_text()) if m.group(1) != pinned]
    assert not wrong, wrong


def test_a_patch_without_header_is_detected():
    header = patch_readme.parse_header("--- a/x.c\n+++ b/x.c\n@@ -1 +1 @@\n-a\n+b\n")
    assert not header.subject and not header.why and header.summary is None


def test_render_keeps_the_text_around_the_table():
    readme = "# title\n\nintro\n\n| a |\n|---|\n| old |\n\nbelow\n"
    assert patch_readme.render(readme, "| a |\n|---|\n| new |") == "# title\n\nintro\n\n| a |\n|---|\n| new |\n\nbelow\n"
