"""The MTP C API through Python: attach, async/wait vs sync, HF draft references, status codes,
the KV contract with a request in flight, malformed assistants, graph reuse."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fixture_paths import PAIRS, fixture_path, reference_path
from numerics import TOL
from mtp_bindings import (
    AssistantLoadError,
    InvalidParameterError,
    Model,
    ModelFileNotFoundError,
    MTPBusyError,
    MTPError,
    NoAssistantError,
)
from mtp_bindings.generation.agreement import gap, is_near_tie
from mtp_bindings.gguffile.tools import rewrite_gguf, to_design_layout, verify_assistant
from mtp_bindings.low_level import ffi, lib
from mtp_bindings.mtp import graph_stats, session_of

# Draft logits vs HF, each step fed HF's own inputs: the same fp16-GELU-table effect as the target
# (see test_hf_reference.py); the measured bases are in tests/numerics.py. A port error (wrong position,
# KV layer, norm or centroid routing) is O(1) or more.
DRAFT_LOGIT_ATOL = TOL["draft_logits_vs_hf"].value
DRAFT_H_ATOL = TOL["draft_h_vs_hf"].value
H_ATOL = TOL["h_prev_vs_hf"].value


def _prefill(model: Model, ctx, prompt: list[int]) -> tuple[int, np.ndarray, int]:
    """Decode ``prompt``; returns (greedy next token, its h_prev, attn_pos)."""
    ctx.clear()
    ctx.decode(prompt, pos=0)
    return int(np.argmax(ctx.get_logits(-1))), ctx.get_embeddings(-1), len(prompt) - 1


@pytest.fixture(scope="module", params=["dense", "centroid"])
def head(request):
    target, assistant = PAIRS[request.param]
    with Model(fixture_path(target), assistant=fixture_path(assistant)) as m, \
            m.create_context(n_ctx=512, embeddings=True) as ctx:
        yield request.param, m, ctx


@pytest.fixture(scope="module")
def dense():
    target, assistant = PAIRS["dense"]
    with Model(fixture_path(target), assistant=fixture_path(assistant)) as m, \
            m.create_context(n_ctx=512, embeddings=True) as ctx:
        yield m, ctx


# --- attach -----------------------------------------------------------------------------------

def test_attached_assistant_is_reported(dense):
    model, _ = dense
    assert model.has_assistant
    assert lib.llama_model_mtp_n_embd_backbone(model.ptr) == model.n_embd


def test_missing_assistant_file_is_a_file_not_found_error():
    with Model(fixture_path("dense-target.gguf")) as m:
        with pytest.raises(ModelFileNotFoundError):
            m.attach_assistant("/nonexistent/assistant.gguf")
        assert not m.has_assistant


def test_target_file_as_assistant_is_refused_and_the_target_stays_usable():
    with Model(fixture_path("dense-target.gguf")) as m:
        with pytest.raises(AssistantLoadError, match="not a Gemma 4 assistant") as e:
            m.attach_assistant(fixture_path("dense-target.gguf"))
        assert e.value.code == -3 and not m.has_assistant
        assert len(m.generate("x = 1", max_tokens=5, draft_n_max=0, temperature=0).tokens) == 5


def test_backbone_width_mismatch_is_refused(trained_paths):
    _, trained_assistant = trained_paths  # backbone 128, the dense target has 64
    with Model(fixture_path("dense-target.gguf")) as m:
        with pytest.raises(AssistantLoadError, match="backbone") as e:
            m.attach_assistant(trained_assistant)
        assert e.value.code == -4


def test_attaching_twice_is_refused():
    target, assistant = PAIRS["dense"]
    with Model(fixture_path(target), assistant=fixture_path(assistant)) as m:
        with pytest.raises(AssistantLoadError) as e:
            m.attach_assistant(fixture_path(assistant))
        assert e.value.code == -13


def test_truncated_assistant_is_refused(tmp_path):
    data = fixture_path("dense-assistant.gguf").read_bytes()
    bad = tmp_path / "truncated.gguf"
    bad.write_bytes(data[: len(data) // 2])
    with Model(fixture_path("dense-target.gguf")) as m:
        with pytest.raises(AssistantLoadError) as e:
            m.attach_assistant(bad)
        assert e.value.code == -2 and not m.has_assistant


@pytest.mark.parametrize("change", ["float_ordering", "missing_ordering"])
def test_malformed_centroid_heads_are_refused(tmp_path, change):
    src = fixture_path("centroid-assistant.gguf")
    if change == "float_ordering":
        bad = rewrite_gguf(src, tmp_path / "a.gguf", retype={"masked_embd_ordering": np.float32})
    else:
        bad = rewrite_gguf(src, tmp_path / "a.gguf", drop_tensors={"masked_embd_ordering"})
    with Model(fixture_path("dense-target.gguf")) as m:
        with pytest.raises(AssistantLoadError, match="cannot attach"):
            m.attach_assistant(bad)
        assert not m.has_assistant


def test_rewriting_a_gguf_unchanged_still_attaches(tmp_path):
    same = rewrite_gguf(fixture_path("centroid-assistant.gguf"), tmp_path / "same.gguf")
    with Model(fixture_path("dense-target.gguf"), assistant=same) as m:
        assert m.has_assistant


@pytest.mark.parametrize("name", ["dense", "centroid"])
def test_design_doc_layout_drafts_bit_identically_to_the_upstream_layout(tmp_path, name):
    target, assistant = PAIRS[name]
    design = to_design_layout(fixture_path(assistant), tmp_path / "design.gguf")
    assert verify_assistant(design, fixture_path(target)) == []
    results = []
    for path in (fixture_path(assistant), design):
        with Model(fixture_path(target), assistant=path) as m, m.create_context(n_ctx=128, embeddings=True) as ctx:
            tok, h, attn_pos = _prefill(m, ctx, [2, 50, 60, 70, 80])
            results.append(ctx.decode_mtp(attn_pos=attn_pos, last_token=tok, h_prev=h, n_steps=5, return_logits=True))
    (d0, h0, l0), (d1, h1, l1) = results
    assert d0.tolist() == d1.tolist() and np.array_equal(h0, h1) and np.array_equal(l0, l1)


# --- drafting -------------------------------------------------------------------------------

@settings(max_examples=10, deadline=None, suppress_health_check=list(HealthCheck))
@given(prompt=st.lists(st.integers(4, 1023), min_size=1, max_size=40), n_steps=st.integers(1, 8))
def test_async_and_wait_equal_the_sync_call_bit_for_bit(head, prompt, n_steps):
    _, model, ctx = head
    tok, h, attn_pos = _prefill(model, ctx, [2] + prompt)
    d_sync, h_sync = ctx.decode_mtp(attn_pos=attn_pos, last_token=tok, h_prev=h, n_steps=n_steps)
    d_async, h_async = ctx.decode_mtp_async(attn_pos=attn_pos, last_token=tok, h_prev=h, n_steps=n_steps).wait()
    assert d_sync.tolist() == d_async.tolist()
    assert np.array_equal(h_sync, h_async)
    assert d_sync.dtype == np.int32 and h_sync.dtype == np.float32 and h_sync.shape == (model.n_embd,)


@settings(max_examples=20, deadline=None, suppress_health_check=list(HealthCheck))
@given(token=st.integers(0, 1023), scale=st.floats(0.0, 50.0), seed=st.integers(0, 2**31))
def test_centroid_drafts_are_always_inside_the_vocabulary(token, scale, seed):
    target, assistant = PAIRS["centroid"]
    m, ctx = _centroid_model()
    h = np.random.default_rng(seed).normal(size=m.n_embd).astype(np.float32) * scale
    drafts, _ = ctx.decode_mtp(attn_pos=ctx.seq_pos_max(0), last_token=token, h_prev=h, n_steps=4)
    assert ((drafts >= 0) & (drafts < m.n_vocab)).all()


_CENTROID: list = []


def _centroid_model():
    if not _CENTROID:
        target, assistant = PAIRS["centroid"]
        m = Model(fixture_path(target), assistant=fixture_path(assistant))
        ctx = m.create_context(n_ctx=128, embeddings=True)
        ctx.decode([2, 50, 60, 70])
        _CENTROID.extend([m, ctx])
    return _CENTROID[0], _CENTROID[1]


@pytest.mark.parametrize("name", list(PAIRS))
def test_each_draft_step_matches_hf(name):
    """Every step is fed HF's own inputs (the previous draft and HF's projected h), so steps are
    compared in isolation: a random drafter is chaotic, and chaining would compare error growth."""
    target, assistant = PAIRS[name]
    ref = np.load(reference_path(name))
    with Model(fixture_path(target), assistant=fixture_path(assistant)) as m, \
            m.create_context(n_ctx=256, embeddings=True, flash_attn="off") as ctx:
        i = 0
        while f"draft{i}_prompt" in ref:
            prompt = ref[f"draft{i}_prompt"].tolist()
            x = int(ref[f"draft{i}_x"][0])
            tok, h, attn_pos = _prefill(m, ctx, prompt)
            assert tok == x
            # our h_prev is HF's post-norm hidden state, up to the fp16-GELU effect (~1% of |h| ~ 5)
            np.testing.assert_allclose(h, ref[f"draft{i}_h"], atol=H_ATOL, rtol=0)
            want_tokens, projected, want_logits = (ref[f"draft{i}_tokens"], ref[f"draft{i}_projected"],
                                                   ref[f"draft{i}_logits"])
            for k in range(len(want_tokens)):
                last = x if k == 0 else int(want_tokens[k - 1])
                h_in = ref[f"draft{i}_h"] if k == 0 else projected[k - 1]
                d, h_out, logits = ctx.decode_mtp(attn_pos=attn_pos, last_token=last, h_prev=h_in, n_steps=1,
                                                  return_logits=True)
                err = np.abs(logits[0] - want_logits[k]).max()
                assert err <= DRAFT_LOGIT_ATOL, (name, i, k, err)
                np.testing.assert_allclose(h_out, projected[k], atol=DRAFT_H_ATOL, rtol=0)
                # the in-graph argmax may differ from HF's only at a near-tie for this row's measured difference
                if int(d[0]) != int(want_tokens[k]):
                    assert is_near_tie(gap(want_logits[k], int(want_tokens[k]), int(d[0])), err), (name, i, k)
            i += 1
        assert i > 0


@pytest.mark.parametrize("name", ["dense", "centroid"])
def test_a_chained_request_equals_its_steps_one_by_one(name):
    target, assistant = PAIRS[name]
    with Model(fixture_path(target), assistant=fixture_path(assistant)) as m, \
            m.create_context(n_ctx=256, embeddings=True) as ctx:
        tok, h, attn_pos = _prefill(m, ctx, [2, 40, 41, 42, 43, 44])
        chained, h_last, logits = ctx.decode_mtp(attn_pos=attn_pos, last_token=tok, h_prev=h, n_steps=6,
                                                 return_logits=True)
        steps, step_logits = [], []
        for _ in range(6):
            d, h, lg = ctx.decode_mtp(attn_pos=attn_pos, last_token=tok, h_prev=h, n_steps=1, return_logits=True)
            tok = int(d[0])
            steps.append(tok)
            step_logits.append(lg[0])
        assert chained.tolist() == steps
        assert np.array_equal(h_last, h)
        assert np.array_equal(logits, np.stack(step_logits))


def test_h_prev_mutated_after_submit_changes_nothing(dense):
    model, ctx = dense
    tok, h, attn_pos = _prefill(model, ctx, [2, 100, 200, 300])
    want, _ = ctx.decode_mtp(attn_pos=attn_pos, last_token=tok, h_prev=h, n_steps=4)
    h_buf = h.copy()
    handle = ctx.decode_mtp_async(attn_pos=attn_pos, last_token=tok, h_prev=h_buf, n_steps=4)
    h_buf[:] = 1e3
    got, _ = handle.wait()
    assert got.tolist() == want.tolist()


def test_graph_is_reused_in_steady_state(dense):
    model, ctx = dense
    tok, h, attn_pos = _prefill(model, ctx, [2, 100, 200, 300])
    ctx.decode_mtp(attn_pos=attn_pos, last_token=tok, h_prev=h, n_steps=3)
    before = graph_stats(ctx)
    for _ in range(20):  # target decodes in between, as in generation
        ctx.decode([tok])
        tok, h, attn_pos = int(np.argmax(ctx.get_logits(-1))), ctx.get_embeddings(-1), ctx.seq_pos_max(0)
        ctx.decode_mtp(attn_pos=attn_pos, last_token=tok, h_prev=h, n_steps=3)
    after = graph_stats(ctx)
    assert after["n_requests"] == before["n_requests"] + 20
    assert after["n_graph_builds"] == before["n_graph_builds"]


# --- status codes -------------------------------------------------------------------------------

def test_drafting_on_the_cpu_moves_nothing_between_host_and_device(dense):
    """The traffic counters (what a GPU's draft steps move and wait for) stay at zero where every backend is a
    CPU: the CPU backend's synchronize is not a wait for a device, and host buffers need no copies."""
    model, ctx = dense
    tok, h, attn_pos = _prefill(model, ctx, [2, 10, 20, 30])
    before = graph_stats(ctx)
    ctx.decode_mtp(attn_pos=attn_pos, last_token=tok, h_prev=h, n_steps=3)
    after = graph_stats(ctx)
    assert after["n_steps"] - before["n_steps"] == 3
    assert (after["n_transfers"], after["n_transfer_bytes"], after["n_syncs"]) == (0, 0, 0)


def test_second_submit_and_wait_without_submit_give_busy(dense):
    model, ctx = dense
    tok, h, attn_pos = _prefill(model, ctx, [2, 5, 6])
    handle = ctx.decode_mtp_async(attn_pos=attn_pos, last_token=tok, h_prev=h, n_steps=2)
    with pytest.raises(MTPBusyError):
        ctx.decode_mtp_async(attn_pos=attn_pos, last_token=tok, h_prev=h, n_steps=2)
    # the C API itself says -7 too
    hp = ffi.from_buffer("float[]", h)
    assert lib.llama_decode_mtp_async(ctx.ptr, 0, attn_pos, tok, hp, 2) == -7
    handle.wait()
    out = ffi.new("llama_token[16]")
    assert lib.llama_decode_mtp_wait(ctx.ptr, out, ffi.NULL) == -7
    with pytest.raises(MTPBusyError):
        handle.wait() if handle._result is None else session_of(ctx).wait(handle)


@pytest.mark.parametrize("field, value, code", [
    ("seq_id", 5, -8), ("n_steps", 0, -9), ("n_steps", 17, -9), ("attn_pos", 0, -10),
    ("attn_pos", -1, -10), ("last_token", 5000, -11), ("last_token", -2, -11),
])
def test_invalid_arguments_give_their_documented_codes(dense, field, value, code):
    model, ctx = dense
    tok, h, attn_pos = _prefill(model, ctx, [2, 5, 6, 7])
    args = {"seq_id": 0, "attn_pos": attn_pos, "last_token": tok, "n_steps": 2}
    args[field] = value
    hp = ffi.from_buffer("float[]", h)
    rc = lib.llama_decode_mtp_async(ctx.ptr, args["seq_id"], args["attn_pos"], args["last_token"], hp, args["n_steps"])
    assert rc == code
    # and the Python layer raises (InvalidParameterError before C, or MTPError with the code)
    with pytest.raises((InvalidParameterError, MTPError)):
        if field == "seq_id":
            ctx.decode_mtp(seq_id=value, attn_pos=attn_pos, last_token=tok, h_prev=h, n_steps=2)
        else:
            kw = {"attn_pos": attn_pos, "last_token": tok, "n_steps": 2, field: value}
            ctx.decode_mtp(h_prev=h, **kw)


def test_null_pointers_give_invalid_argument(dense):
    model, ctx = dense
    tok, _, attn_pos = _prefill(model, ctx, [2, 5, 6])
    assert lib.llama_decode_mtp_async(ctx.ptr, 0, attn_pos, tok, ffi.NULL, 2) == -1
    assert lib.llama_decode_mtp_async(ffi.NULL, 0, attn_pos, tok, ffi.NULL, 2) == -1
    assert lib.llama_decode_mtp(ctx.ptr, 0, attn_pos, tok, ffi.NULL, 2, ffi.NULL, ffi.NULL, ffi.NULL) == -1
    assert lib.llama_mtp_attach_threadpool(ctx.ptr, ffi.NULL) == -1
    assert lib.llama_mtp_attach_threadpool(ffi.NULL, ffi.NULL) == -1
    assert lib.llama_mtp_detach_threadpool(ffi.NULL) == -1


def test_wrong_h_prev_shape_is_refused_in_python(dense):
    model, ctx = dense
    tok, h, attn_pos = _prefill(model, ctx, [2, 5, 6])
    with pytest.raises(InvalidParameterError, match="h_prev"):
        ctx.decode_mtp(attn_pos=attn_pos, last_token=tok, h_prev=h[:10], n_steps=2)


def test_drafting_without_an_assistant_raises():
    with Model(fixture_path("dense-target.gguf")) as m, m.create_context(n_ctx=64, embeddings=True) as ctx:
        ctx.decode([2, 5, 6])
        with pytest.raises(NoAssistantError):
            ctx.decode_mtp(attn_pos=2, last_token=7, h_prev=ctx.get_embeddings(-1), n_steps=2)
        hp = ffi.from_buffer("float[]", ctx.get_embeddings(-1))
        assert lib.llama_decode_mtp_async(ctx.ptr, 0, 2, 7, hp, 2) == -6


# --- the KV contract with a request in flight ----------------------------------------------------

def test_appending_past_attn_pos_while_in_flight_keeps_the_drafts(dense):
    model, ctx = dense
    tok, h, attn_pos = _prefill(model, ctx, [2, 10, 20, 30])
    want, _ = ctx.decode_mtp(attn_pos=attn_pos, last_token=tok, h_prev=h, n_steps=4)
    handle = ctx.decode_mtp_async(attn_pos=attn_pos, last_token=tok, h_prev=h, n_steps=4)
    ctx.decode([tok, 11, 12])  # the verify batch
    got, _ = handle.wait()
    assert got.tolist() == want.tolist()


def test_seq_rm_below_attn_pos_while_in_flight_drains_first(dense):
    model, ctx = dense
    tok, h, attn_pos = _prefill(model, ctx, [2, 10, 20, 30, 40])
    want, _ = ctx.decode_mtp(attn_pos=attn_pos, last_token=tok, h_prev=h, n_steps=4)
    ctx.decode_mtp_async(attn_pos=attn_pos, last_token=tok, h_prev=h, n_steps=4)
    # straight to C, bypassing the Python drain: the library must drain by itself
    assert lib.llama_memory_seq_rm(lib.llama_get_memory(ctx.ptr), 0, 1, -1)
    out = np.zeros(16, dtype=np.int32)
    assert lib.llama_decode_mtp_wait(ctx.ptr, ffi.from_buffer("llama_token[]", out), ffi.NULL) == 0
    assert out[:4].tolist() == want.tolist()
    session_of(ctx).in_flight = None  # the Python handle was bypassed on purpose


def test_freeing_a_context_with_a_request_in_flight_is_safe():
    target, assistant = PAIRS["dense"]
    with Model(fixture_path(target), assistant=fixture_path(assistant)) as m:
        for _ in range(5):
            ctx = m.create_context(n_ctx=128, embeddings=True)
            tok, h, attn_pos = _prefill(m, ctx, [2, 10, 20, 30])
            hp = ffi.from_buffer("float[]", h)
            assert lib.llama_decode_mtp_async(ctx.ptr, 0, attn_pos, tok, hp, 8) == 0
            ptr, ctx._ptr = ctx._ptr, ffi.NULL
            ctx._batch.free()
            lib.llama_free(ptr)  # C drains the worker before tearing down
        # the model is intact
        assert len(m.generate("x = 1", max_tokens=8, draft_n_max=2, temperature=0).tokens) == 8


def test_context_close_in_python_drains_the_request():
    target, assistant = PAIRS["dense"]
    with Model(fixture_path(target), assistant=fixture_path(assistant)) as m:
        ctx = m.create_context(n_ctx=128, embeddings=True)
        tok, h, attn_pos = _prefill(m, ctx, [2, 10, 20, 30])
        handle = ctx.decode_mtp_async(attn_pos=attn_pos, last_token=tok, h_prev=h, n_steps=8)
        ctx.close()
        assert not handle.pending
