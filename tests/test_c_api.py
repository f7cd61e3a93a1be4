"""The MTP C API without Python in the loop: tests/c/test_mtp_api.c is compiled against the
installed patched headers and libllama, and run on the fixtures (it prints "N passed, M failed")."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from fixture_paths import fixture_path
from mtp_bindings import low_level

SOURCE = Path(__file__).parent / "c" / "test_mtp_api.c"


@pytest.fixture(scope="module")
def c_test_binary(tmp_path_factory) -> Path:
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.fail("a C compiler is needed for the C API test")
    out = tmp_path_factory.mktemp("c") / "test_mtp_api"
    lib = low_level.library_dir()
    subprocess.run([cc, "-O1", "-g", "-Wall", "-I", str(low_level.include_dir()), str(SOURCE), "-o", str(out),
                    "-L", str(lib), "-lllama", "-lggml", "-lggml-base", f"-Wl,-rpath,{lib}"],
                   check=True, capture_output=True, text=True)
    return out


def test_c_api_suite_passes(c_test_binary):
    proc = subprocess.run([str(c_test_binary), str(fixture_path("dense-target.gguf")),
                           str(fixture_path("dense-assistant.gguf")), str(fixture_path("centroid-assistant.gguf"))],
                          capture_output=True, text=True, timeout=300)
    summary = re.search(r"^(\d+) passed, (\d+) failed$", proc.stdout, re.M)
    assert summary, proc.stdout[-2000:] + proc.stderr[-2000:]
    failed = [line for line in proc.stdout.splitlines() if line.startswith("FAIL")]
    assert proc.returncode == 0 and summary.group(2) == "0", failed
    assert int(summary.group(1)) >= 10


def test_the_python_draft_bound_is_the_c_apis():
    """config.params.DRAFT_N_MAX mirrors LLAMA_MTP_MAX_STEPS for the pure layer, which cannot import the module."""
    from mtp_bindings.config.params import DRAFT_N_MAX
    from mtp_bindings.native._native import lib

    assert DRAFT_N_MAX == lib.LLAMA_MTP_MAX_STEPS
