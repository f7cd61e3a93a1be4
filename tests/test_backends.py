"""The backend-loading rule (:mod:`mtp_bindings.native._backends`) on fake lib directories: which modules a
native and a portable build load, and the typed errors of ``MTP_BINDINGS_CPU_VARIANT``.

Pure: no compiled code. A fake ``lib`` records the ggml calls; scores are monkeypatched (the real
ones come from the modules themselves, see tests/test_wheel.py).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from mtp_bindings.native import _backends
from mtp_bindings.config.env import env_cpu_variant
from mtp_bindings.exceptions import CPUVariantError, InvalidParameterError

NULL = object()


class FakeFFI:
    NULL = NULL


class FakeLib:
    """Records ``ggml_backend_load_all_from_path`` / ``ggml_backend_load`` calls (paths as str)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []

    def ggml_backend_load_all_from_path(self, path: bytes) -> None:
        self.calls.append(("load_all_from_path", path.decode()))

    def ggml_backend_load(self, path: bytes) -> object:
        self.calls.append(("load", Path(path.decode()).name))
        return object()


def make_lib_dir(tmp_path: Path, *names: str) -> Path:
    for n in names:
        (tmp_path / n).write_bytes(b"")
    return tmp_path


NATIVE = ("libllama.so", "libggml.so", "libggml-base.so", "libggml-cpu.so", "libggml-rpc.so")
PORTABLE = ("libllama.so", "libggml.so", "libggml-base.so", "libggml-rpc.so", "libggml-cpu-x64.so",
            "libggml-cpu-sse42.so", "libggml-cpu-haswell.so", "libggml-cpu-zen4.so")
SCORES = {"x64": 1, "sse42": 3, "haswell": 63, "zen4": 0}


@pytest.fixture
def portable(tmp_path, monkeypatch) -> Path:
    monkeypatch.setattr(_backends, "backend_score", lambda p: SCORES[p.name[len("libggml-cpu-"):-len(".so")]])
    return make_lib_dir(tmp_path, *PORTABLE)


def test_a_native_build_has_no_variants(tmp_path):
    d = make_lib_dir(tmp_path, *NATIVE)
    assert _backends.variant_modules(d) == {} and not _backends.is_portable(d)


def test_a_portable_build_lists_its_variants(portable):
    assert sorted(_backends.variant_modules(portable)) == ["haswell", "sse42", "x64", "zen4"]
    assert _backends.is_portable(portable)


def test_the_non_cpu_modules_are_the_other_backends(portable):
    assert [p.name for p in _backends.other_backend_modules(portable)] == ["libggml-rpc.so"]


def test_runnable_variants_are_those_scoring_above_zero_best_first(portable):
    assert list(_backends.runnable_variants(portable).items()) == [("haswell", 63), ("sse42", 3), ("x64", 1)]


def test_default_loading_searches_only_the_package_lib_dir(portable):
    lib = FakeLib()
    _backends.load_backends(lib, FakeFFI, forced=None, lib_dir=portable)
    assert lib.calls == [("load_all_from_path", str(portable))]


def test_a_forced_variant_loads_the_other_backends_then_that_variant_only(portable):
    lib = FakeLib()
    _backends.load_backends(lib, FakeFFI, forced="sse42", lib_dir=portable)
    assert lib.calls == [("load", "libggml-rpc.so"), ("load", "libggml-cpu-sse42.so")]


def test_an_unknown_variant_is_a_typed_error_listing_the_build_s_variants(portable):
    with pytest.raises(CPUVariantError, match="unknown CPU variant 'pentium2'.*haswell"):
        _backends.load_backends(FakeLib(), FakeFFI, forced="pentium2", lib_dir=portable)


def test_a_variant_this_cpu_cannot_run_is_a_typed_error_naming_the_runnable_ones(portable):
    lib = FakeLib()
    with pytest.raises(CPUVariantError, match="cannot run the 'zen4'.*haswell, sse42, x64"):
        _backends.load_backends(lib, FakeFFI, forced="zen4", lib_dir=portable)
    assert lib.calls == []


def test_forcing_a_variant_in_a_native_build_is_a_typed_error(tmp_path):
    d = make_lib_dir(tmp_path, *NATIVE)
    with pytest.raises(CPUVariantError, match="native build"):
        _backends.load_backends(FakeLib(), FakeFFI, forced="haswell", lib_dir=d)


def test_a_variant_ggml_refuses_is_a_typed_error(portable):
    lib = FakeLib()
    lib.ggml_backend_load = lambda path: NULL  # type: ignore[method-assign]
    with pytest.raises(CPUVariantError, match="could not load the 'haswell'"):
        _backends.load_backends(lib, FakeFFI, forced="haswell", lib_dir=portable)


def test_cpu_variant_error_is_an_invalid_parameter():
    assert issubclass(CPUVariantError, InvalidParameterError)


@pytest.mark.parametrize(("value", "want"), [(None, None), ("", None), ("  ", None), ("Haswell", "haswell")])
def test_the_environment_variable_names_the_variant(value, want):
    environ = {} if value is None else {"MTP_BINDINGS_CPU_VARIANT": value}
    assert env_cpu_variant(environ) == want
