"""Shared pytest fixtures: loaded models of the project's generated Gemma 4 fixtures."""

from __future__ import annotations

from pathlib import Path

import pytest

from fixture_paths import BUNDLED, fixture_path


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
