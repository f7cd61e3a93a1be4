"""Where the project's generated Gemma 4 test models live (importable by every test module)."""

from __future__ import annotations

from pathlib import Path

import pytest

FIXTURES = Path(__file__).parent / "fixtures"
BUNDLED = Path(__file__).parent.parent / "mtp_bindings" / "models"

# (name, target file, assistant file) of the random tiny fixtures
PAIRS = {
    "dense": ("dense-target.gguf", "dense-assistant.gguf"),
    "centroid": ("dense-target.gguf", "centroid-assistant.gguf"),
    "keqv": ("keqv-target.gguf", "keqv-assistant.gguf"),
    "ple": ("ple-target.gguf", "ple-assistant.gguf"),
}
TARGETS = ["dense", "keqv", "ple"]


def fixture_path(name: str) -> Path:
    p = FIXTURES / name
    if not p.is_file():
        pytest.fail(f"missing fixture {p}: run `python tools/make_fixtures.py`")
    return p


def reference_path(name: str) -> Path:
    return fixture_path(f"{name}-reference.npz")
