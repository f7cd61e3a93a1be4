"""gguffile.header: the extent a GGUF's header declares, checked before gguf's reader maps the file.

Pure (no native code): every bundled and fixture GGUF ends exactly where its header says, and a copy
cut anywhere short of that is refused as truncated, never read with short arrays."""

from __future__ import annotations

from pathlib import Path

import pytest

from mtp_bindings.gguffile.header import Truncated, check_extent

ROOT = Path(__file__).resolve().parent.parent
FILES = sorted((ROOT / "tests" / "fixtures").glob("*.gguf")) + sorted((ROOT / "mtp_bindings" / "models").glob("*.gguf"))


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_a_whole_file_ends_where_its_header_says(path):
    assert check_extent(path) == path.stat().st_size


@pytest.mark.parametrize("keep", [9, 24, 40, 1000, 0.1, 0.5, 0.9, -1])
def test_a_cut_file_is_truncated(tmp_path, keep):
    data = (ROOT / "tests" / "fixtures" / "dense-assistant.gguf").read_bytes()
    n = keep if isinstance(keep, int) and keep > 0 else len(data) - 1 if keep == -1 else int(len(data) * keep)
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(data[:n])
    with pytest.raises(Truncated) as e:
        check_extent(cut)
    assert e.value.size == n and e.value.end > n


@pytest.mark.parametrize("data", [b"", b"GGUF", b"NOTAGGUF" + bytes(32)])
def test_what_is_not_a_gguf_is_a_value_error(tmp_path, data):
    p = tmp_path / "bad.gguf"
    p.write_bytes(data)
    with pytest.raises(ValueError):
        check_extent(p)
