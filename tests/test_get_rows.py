"""ggml's CPU GET_ROWS on quantized weights gives each gathered row the bits of the type's reference
dequantizer (patch 0127: Q6_K rows are converted with AVX2 there, for the centroid head's gather of 4096
rows of the tied Q6_K embedding every draft step). The check is a small C program
(``tests/c/get_rows_check.c``) on the installed ggml, run in a subprocess.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from ggml_programs import compile_ggml_program, run_ggml_program

SOURCE = Path(__file__).resolve().parent / "c" / "get_rows_check.c"
pytestmark = pytest.mark.ggml_program


@pytest.fixture(scope="module")
def get_rows_check(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return compile_ggml_program(SOURCE, tmp_path_factory.mktemp("get_rows"))


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_gathered_quantized_rows_have_the_reference_dequantizers_bits(get_rows_check: Path, threads: int) -> None:
    mismatches = run_ggml_program(get_rows_check, str(threads))
    assert set(mismatches) == {"q6_K", "q4_K", "q5_K", "q8_0"}
    assert all(n == 0 for n in mismatches.values()), mismatches
