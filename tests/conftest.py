"""Shared fixtures: paths of the project's generated Gemma 4 models and loaded models."""

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


@pytest.fixture(scope="session")
def trained_paths() -> tuple[Path, Path]:
    t, a = BUNDLED / "trained-target.gguf", BUNDLED / "trained-assistant.gguf"
    for p in (t, a):
        if not p.is_file():
            pytest.fail(f"missing bundled model {p}")
    return t, a


@pytest.fixture(scope="session")
def dense_target_path() -> Path:
    return fixture_path("dense-target.gguf")


@pytest.fixture(scope="session")
def dense_model(dense_target_path):
    from mtp_bindings import Model

    with Model(dense_target_path) as m:
        yield m
