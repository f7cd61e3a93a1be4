"""The package type-checks: mypy over ``mtp_bindings`` (its settings in ``pyproject.toml``) finds nothing.
The typed public API (``Model(...)``'s keywords, the ``stream=`` overloads) means something only while
the code behind it checks."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def test_mypy_finds_no_errors_in_the_package():
    pytest.importorskip("mypy", reason="mypy is in the test extra: pip install -e '.[test]'")
    res = subprocess.run([sys.executable, "-m", "mypy", "mtp_bindings"], cwd=REPO, capture_output=True, text=True,
                         timeout=600)
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-2000:]
