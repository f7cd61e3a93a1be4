"""Shared pytest fixtures (loaded models of the project's generated Gemma 4 fixtures) and the test tiers.

Every test gets the marker of its tier, by file: ``capi`` (the C API and ggml kernels through cffi),
``bindings`` (model, context, MTP session), ``generation`` (the driver, exactness against references),
``server`` (the HTTP server on loopback), ``tools`` (CLI, benchmark, examples, build), ``wheel`` (the portable
wheel from ``make wheel``, installed in a venv of its own; skipped without one), ``vulkan`` (MTP on a Vulkan
device, ``make test-vulkan``; skipped without one); and ``native`` when it
needs compiled code, i.e. every tier but ``pure`` (pure-Python modules: import graph, parameters,
sampling maths, the patch series, the backend-loading rule, the overloads of ``generate`` / ``chat``).
``pytest -m "not native"`` runs without a build (files that need it are then not even collected);
``pytest -m server`` runs one tier.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from fixture_paths import BUNDLED, fixture_path

TIERS: dict[str, tuple[str, ...]] = {
    "pure": ("test_import_graph.py", "test_params.py", "test_patch_series.py", "test_sampling.py", "test_backends.py",
             "test_gemma4_chat.py", "test_draft_controller.py", "test_agreement.py", "test_gguf_header.py",
             "test_overloads.py", "test_few_row_threads.py"),
    "capi": ("test_c_api.py", "test_c_api_stateful.py", "test_struct_layout.py", "test_native_errors.py",
             "test_matmul_few_columns.py", "test_vector_tanh.py", "test_malformed_files.py", "test_shared_cpu.py",
             "test_threads.py", "test_cpu_variants.py"),
    "bindings": ("test_model.py", "test_mtp_api.py", "test_mtp_threads.py", "test_layer_hooks.py", "test_resources.py",
                 "test_bad_input.py"),
    "generation": ("test_generate.py", "test_speculative.py", "test_logprobs.py", "test_hf_reference.py",
                   "test_upstream_parity.py", "test_soak.py", "test_scale_pair.py", "test_structured_output.py",
                   "test_auto_draft.py", "test_loop_rule.py", "test_sampler_chain.py"),
    "tools": ("test_cli.py", "test_cli_compat.py", "test_cli_chat.py",
              "test_front_door.py", "test_examples.py", "test_bench_smoke.py", "test_build.py",
              "test_placement_flags.py", "test_sdist.py"),
    # the portable wheel in its own venv: needs a wheel in dist/ (`make wheel`), not this checkout's build
    "wheel": ("test_wheel.py",),
    # MTP on a Vulkan device: a -DGGML_VULKAN=ON build (`make test-vulkan`); skipped without a Vulkan device
    "vulkan": ("test_vulkan.py",),
}
TIER_OF = {name: tier for tier, names in TIERS.items() for name in names}


def tier_of(path: Path) -> str:
    """A file's tier: listed above, else ``server`` for test_server*, else ``bindings``."""
    return TIER_OF.get(path.name) or ("server" if path.name.startswith("test_server") else "bindings")


def _extension_built() -> bool:
    try:
        return importlib.util.find_spec("mtp_bindings._ffi") is not None
    except ImportError:
        return False


def pytest_configure(config: pytest.Config) -> None:
    for tier in (*TIERS, "server"):
        config.addinivalue_line("markers", f"{tier}: the {tier} tier (see tests/conftest.py)")
    config.addinivalue_line("markers", "native: needs the compiled extension (every tier but pure)")


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """Without a build only the pure tier can even be imported: skip collecting the rest (but the
    wheel tier, which runs the wheel's own build in a venv of its own)."""
    if collection_path.suffix == ".py" and collection_path.name.startswith("test_") \
            and tier_of(collection_path) not in ("pure", "wheel") and not _extension_built():
        return True
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        tier = tier_of(item.path)
        item.add_marker(getattr(pytest.mark, tier))
        if tier != "pure":
            item.add_marker(pytest.mark.native)


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
