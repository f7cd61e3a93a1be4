"""The numerics on more than one x86 ISA: the batch-invariance and exactness tests again under other
ggml-cpu variants than the one this build compiled (issue 25).

The portable wheel ships a ggml-cpu module per x86-64 level and picks the best for the CPU; users run AVX2
and AVX-512 far more often than the AMX this machine may have. ``tools/cpu_variant.sh`` builds one
variant's ggml-cpu alone from the patched source (about 30 s), and the tests of
``tests/test_matmul_few_columns.py`` (every product and flash attention bit for bit against single
columns, batched decodes exactly) and the greedy-exactness tests of ``tests/test_speculative.py`` run in a
child pytest with that library preloaded in place of the package's. A variant this CPU cannot run, or a
machine without cmake / ninja or the patched source, is skipped with the reason.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
TOOL = REPO / "tools" / "cpu_variant.sh"
# the CPU flags (as /proc/cpuinfo names them) each variant's code needs, after ggml's variant definitions
VARIANTS = {
    "haswell": {"avx2", "fma", "f16c", "bmi2"},
    "zen4": {"avx2", "fma", "f16c", "bmi2", "avx512f", "avx512bw", "avx512vl", "avx512vbmi", "avx512_vnni",
             "avx512_bf16"},
}
# the exactness tests (the speculative file's slower distribution and lifecycle tests are left out) and the
# numerical comparisons whose tolerances tests/numerics.py bases on these variants too (~20 s more each)
CHILD_TESTS = ["test_matmul_few_columns.py", "test_speculative.py::test_greedy_mtp_equals_plain_greedy",
               "test_speculative.py::test_trained_pair_greedy_mtp_equals_plain",
               "test_logprobs.py", "test_server_logprobs.py", "test_hf_reference.py", "test_scale_pair.py",
               "test_model.py", "test_mtp_api.py::test_each_draft_step_matches_hf"]


def _cpu_flags() -> set[str]:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def _skip_reason(variant: str) -> str | None:
    if sys.platform != "linux" or os.uname().machine != "x86_64":
        return "x86-64 Linux only"
    missing = VARIANTS[variant] - _cpu_flags()
    if missing:
        return f"this CPU cannot run the {variant} variant (no {', '.join(sorted(missing))})"
    for tool in ("cmake", "ninja"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed"
    if not (REPO / "vendor" / "llama.cpp" / "ggml").is_dir():
        return "no patched source in vendor/ (run make install)"
    return None


@pytest.fixture(scope="module", params=list(VARIANTS))
def variant_lib(request: pytest.FixtureRequest) -> Path:
    reason = _skip_reason(request.param)
    if reason:
        pytest.skip(reason)
    res = subprocess.run(["bash", str(TOOL), request.param], capture_output=True, text=True, timeout=900, cwd=REPO)
    assert res.returncode == 0, f"cpu_variant.sh {request.param} failed: {res.stdout[-1500:]}{res.stderr[-1500:]}"
    return REPO / res.stdout.strip().splitlines()[-1]


def test_the_exactness_tests_pass_under_another_cpu_variant(variant_lib: Path) -> None:
    env = {**os.environ, "LD_PRELOAD": str(variant_lib)}
    res = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *CHILD_TESTS],
                         capture_output=True, text=True, timeout=1800, cwd=REPO / "tests", env=env)
    tail = res.stdout[-3000:]
    assert res.returncode == 0, f"under {variant_lib.parent.parent.name}:\n{tail}"
    assert " passed" in tail and " failed" not in tail
