"""ggml's CPU ARGMAX (patch 0128) picks what the loop it replaced picks: the last index of a row's maximum, and
where a row holds a NaN, what the loop's running maximum makes of it. The greedy pick of every verify row and
draft step is this op over the vocabulary. The check is a small C program (``tests/c/argmax_check.c``) on the
installed ggml, run in a subprocess, on rows built for ties, signed zeros, infinities, NaNs and short rows.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from ggml_programs import compile_ggml_program, run_ggml_program

SOURCE = Path(__file__).resolve().parent / "c" / "argmax_check.c"
pytestmark = pytest.mark.ggml_program


@pytest.fixture(scope="module")
def argmax_check(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return compile_ggml_program(SOURCE, tmp_path_factory.mktemp("argmax"))


@pytest.mark.parametrize("threads", [1, 2])
def test_argmax_picks_what_the_scalar_loop_picks(argmax_check: Path, threads: int) -> None:
    out = run_ggml_program(argmax_check, str(threads))
    assert out["rows"] == 216 and out["wrong"] == 0, out
