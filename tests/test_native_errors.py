"""Native error text reaches the exception of the thread whose call failed, and no other thread's."""

from __future__ import annotations

import threading

import pytest

from mtp_bindings import DecodeError, ModelLoadError
from mtp_bindings.native._native import MTP_SYMBOLS, NATIVE_VERSION, clear_errors, lib, raise_native
from mtp_bindings.llama_model import LlamaModel as Model
from mtp_bindings.native.mtp_status import MTP_STATUS_CODES, status_text


def test_concurrent_failures_each_report_their_own_native_error(trained_paths, tmp_path):
    data = trained_paths[0].read_bytes()[:5000]  # a GGUF cut inside its metadata
    paths = [tmp_path / f"truncated-{i}.gguf" for i in range(4)]
    for p in paths:
        p.write_bytes(data)
    messages: dict[int, list[str]] = {i: [] for i in range(len(paths))}

    def load(i: int) -> None:
        for _ in range(10):
            try:
                Model(paths[i])
            except ModelLoadError as e:
                messages[i].append(str(e))

    threads = [threading.Thread(target=load, args=(i,)) for i in range(len(paths))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    for i, msgs in messages.items():
        assert len(msgs) == 10
        for m in msgs:
            assert "failed to read key-value pairs" in m  # the native reason is there...
            others = [p.name for j, p in enumerate(paths) if j != i]
            assert not any(o in m for o in others), m      # ...and only this thread's


def test_raise_native_says_the_fallback_when_no_native_line_was_logged():
    clear_errors()
    with pytest.raises(DecodeError, match="^it failed: no reason given$") as e:
        raise_native(DecodeError, "it failed", 7, fallback="no reason given")
    assert e.value.code == 7


def test_the_library_was_checked_at_import_for_the_mtp_api():
    assert NATIVE_VERSION and all(hasattr(lib, name) for name in MTP_SYMBOLS)


def test_every_mtp_status_code_has_its_own_text_from_the_library():
    texts = [status_text(rc) for rc in MTP_STATUS_CODES]
    assert len(MTP_STATUS_CODES) >= 14 and len(set(texts)) == len(texts)
    assert not any(t.startswith("error ") for t in texts)
    assert status_text(-999) == "error -999"
