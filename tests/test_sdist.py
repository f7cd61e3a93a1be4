"""The source distribution holds what ``pip install .`` needs, and none of the local build state.

The sdist is made with scikit-build-core's own ``build_sdist`` hook (what ``python -m build --sdist``
and ``make sdist`` call), in a subprocess from the repository; skipped where scikit-build-core is not
installed (``make test`` builds with pip's isolated build environment, so its venv lacks it:
``pip install scikit-build-core`` there to run this).
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
NEEDED = ("pyproject.toml", "CMakeLists.txt", "README.md", "build_support/llama_source.py", "build_support/gen_ffi.py",
          "patches/README.md", "mtp_bindings/__init__.py", "mtp_bindings/native/_native.py",
          "mtp_bindings/models/trained-target.gguf", "mtp_bindings/models/trained-assistant.gguf")
NEVER = ("vendor/", "build/", "dist/", ".venv/", ".git/")

pytestmark = pytest.mark.skipif(importlib.util.find_spec("scikit_build_core") is None,
                                reason="scikit-build-core is not installed here (pip install scikit-build-core)")


@pytest.fixture(scope="module")
def sdist_members(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    out_dir = tmp_path_factory.mktemp("sdist")
    code = f"from scikit_build_core.build import build_sdist; print(build_sdist({str(out_dir)!r}))"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    name = out.stdout.strip().splitlines()[-1]
    with tarfile.open(out_dir / name) as tf:
        top = name[:-len(".tar.gz")] + "/"
        return [m.name[len(top):] for m in tf.getmembers() if m.isfile()]


def test_sdist_holds_the_sources_patches_and_build_support(sdist_members):
    missing = [n for n in NEEDED if n not in sdist_members]
    assert not missing
    patches = [n for n in sdist_members if n.startswith("patches/") and n.endswith(".patch")]
    assert len(patches) == len(list((ROOT / "patches").glob("*.patch")))


def test_sdist_leaves_out_fetched_sources_build_trees_and_venvs(sdist_members):
    leaked = [n for n in sdist_members if n.startswith(NEVER) or "/__pycache__/" in n or n.endswith(".so")]
    assert not leaked, leaked[:10]
