"""Malformed GGUF files (structured mutations of the fixtures: header, metadata types and values,
tensor shapes/types/offsets, truncation) fed to model load, assistant attach, ``info`` and
``verify-assistant``, each case in its own subprocess: a valid load or a typed error, never a
crash or a hang. The longer campaign is ``python tools/gguf_mutate.py``."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent.parent / "tools"))
import gguf_mutate  # noqa: E402

from fixture_paths import fixture_path  # noqa: E402

CASES = 12


@pytest.mark.parametrize("modes", [["model", "info"]])
def test_mutated_targets_never_crash_the_loader(tmp_path, modes):
    report = gguf_mutate.campaign(fixture_path("dense-target.gguf"), modes, CASES, seed=1234, workdir=tmp_path)
    assert report["failures"] == [], report["failures"]
    assert sum(report["outcomes"].values()) == CASES * len(modes)


def test_mutated_assistants_never_crash_verify_assistant(tmp_path):
    report = gguf_mutate.campaign(fixture_path("dense-assistant.gguf"), ["verify", "info"], CASES, seed=99,
                                  other=str(fixture_path("dense-target.gguf")), workdir=tmp_path)
    assert report["failures"] == [], report["failures"]


def test_mutated_vocabularies_never_crash_the_loader(tmp_path):
    # issue 17 item 9: the mode that found the duplicate-token abort, aimed at token texts only
    report = gguf_mutate.campaign(fixture_path("dense-target.gguf"), ["model"], CASES, seed=5, workdir=tmp_path,
                                  vocab=True)
    assert report["failures"] == [], report["failures"]
    assert report["outcomes"].get("typed", 0) > 0  # some cases made two tokens one text: ModelLoadError


def test_layout_parser_finds_every_tensor(tmp_path):
    data = fixture_path("dense-target.gguf").read_bytes()
    layout = gguf_mutate.parse_layout(data)
    import struct
    n_tensors = struct.unpack_from("<Q", data, 8)[0]
    assert sum(1 for f in layout if f.kind == "tensor.type") == n_tensors
    assert layout[-1].kind == "data" and layout[-1].size > 0


def test_out_of_range_bos_token_id_loads_and_tokenizes_without_crashing(tmp_path):
    # found by the campaign: this used to abort the process in llama_tokenize (fixed by patch 0012)
    data = bytearray(fixture_path("dense-target.gguf").read_bytes())
    # find the value field that follows the bos_token_id key
    fields = iter(gguf_mutate.parse_layout(bytes(data)))
    target = None
    for f in fields:
        if f.kind == "kv.key.bytes" and bytes(data[f.offset:f.offset + f.size]) == b"tokenizer.ggml.bos_token_id":
            next(fields)  # kv.type
            target = next(fields)
            break
    assert target is not None and target.size == 4
    data[target.offset:target.offset + 4] = (2**31).to_bytes(4, "little")
    bad = tmp_path / "bad-bos.gguf"
    bad.write_bytes(bytes(data))
    assert gguf_mutate.run_case(bad, "model") == "ok"


def test_two_tokens_with_the_same_text_fail_the_load_instead_of_aborting(tmp_path):
    # found by the campaign (issue 17): GGML_ASSERT in llama-vocab.cpp aborted the process (fixed by patch 0013)
    import struct

    data = fixture_path("dense-target.gguf").read_bytes()
    one, zero = struct.pack("<Q", 6) + b"<0x01>", struct.pack("<Q", 6) + b"<0x00>"
    assert data.count(one) == 1 and data.count(zero) == 1
    bad = tmp_path / "duplicate-token.gguf"
    bad.write_bytes(data.replace(one, zero))
    assert gguf_mutate.run_case(bad, "model") == "typed:ModelLoadError"  # a subprocess: an abort would be crash:-6
    from mtp_bindings import Model, ModelLoadError

    with pytest.raises(ModelLoadError, match="same text for tokens"):
        Model(bad)



def test_an_assistant_with_another_sliding_window_is_refused_at_attach(tmp_path):
    import struct

    from mtp_bindings import AssistantLoadError, Model
    from mtp_bindings.native.mtp_status import MTP_ERR_WINDOW

    data = bytearray(fixture_path("dense-assistant.gguf").read_bytes())
    key = b"gemma4-assistant.attention.sliding_window"
    at = data.index(key) + len(key)  # then the value type (uint32: 4) and the value
    assert struct.unpack_from("<II", data, at) == (4, 16)
    struct.pack_into("<I", data, at + 4, 32)
    path = tmp_path / "assistant-window-32.gguf"
    path.write_bytes(bytes(data))
    with Model(fixture_path("dense-target.gguf")) as model:
        with pytest.raises(AssistantLoadError, match="sliding window") as err:
            model.attach_assistant(path)
        assert err.value.code == MTP_ERR_WINDOW
        assert not model.has_assistant
