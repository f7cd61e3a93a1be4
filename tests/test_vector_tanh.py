"""ggml's CPU tanh (patches 0105-0106): the vectorised kernel stays within a few ulps of libm's tanh, and the
fused softcapping (SCALE -> TANH -> SCALE in one pass) gives the bits of the three ops.

Final logit softcapping runs tanh over every logit of every verified token; the patch replaced the
scalar ``tanhf`` with a vector kernel, splits the op by elements across threads and fuses the three
ops. The check is a small C program (``tests/c/tanh_check.c``) on the installed ggml, run in a
subprocess.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from ggml_programs import compile_ggml_program, run_ggml_program

SOURCE = Path(__file__).resolve().parent / "c" / "tanh_check.c"
pytestmark = pytest.mark.ggml_program
MAX_ULP = 8  # ggml_v_expf is within 1.5 ulp; the quotient and the sign handling add a few


@pytest.fixture(scope="module")
def tanh_check(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return compile_ggml_program(SOURCE, tmp_path_factory.mktemp("tanh"))


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_tanh_op_is_within_a_few_ulps_of_libm(tanh_check: Path, threads: int) -> None:
    out = run_ggml_program(tanh_check, str(threads))
    assert out["worst_ulp"] <= MAX_ULP, out


@pytest.mark.parametrize("threads", [1, 2])
def test_fused_softcapping_is_bit_identical_to_the_three_ops(tanh_check: Path, threads: int) -> None:
    fused = run_ggml_program(tanh_check, str(threads), "softcap")
    unfused = run_ggml_program(tanh_check, str(threads), "softcap", env={"GGML_CPU_DISABLE_FUSION": "1"})
    assert fused["hash"] == unfused["hash"]
    assert fused["worst_ulp"] <= MAX_ULP + 2, fused  # 30 * tanh(x / 30): two more roundings
    assert fused["specials_ok"] is True


@pytest.mark.parametrize("threads", [1, 2])
def test_tanh_op_keeps_nan_infinities_and_signed_zero(tanh_check: Path, threads: int) -> None:
    assert run_ggml_program(tanh_check, str(threads))["specials_ok"] is True
