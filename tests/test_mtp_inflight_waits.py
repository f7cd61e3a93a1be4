"""What a drafting request in flight waits for, and what happens when drafting throws (issue 17,
patches 0004, 0005, 0008 and 0014), through cffi on the bundled trained pair.

A K-shift (``llama_memory_seq_add`` / ``seq_div`` of any sequence) rewrites every cell at the next memory
update, and a batch mixing sequences in a context with several KV streams is split in lockstep, so the
drafting sequence's tokens can land in a second ubatch: both wait for the request in flight
(``n_drains`` counts it) and the request's drafts stay those of the synchronous call. The drafting
sequence's own first append, the one the KV contract lets through, still does not wait.
``LLAMA_MTP_FAULT`` makes submit (``submit``) or the worker (``worker``) throw, as a failed graph build,
allocation or memory update would: the C API returns ``LLAMA_MTP_ERR_COMPUTE`` and Python raises
``MTPError``; the process and the context carry on.
"""

from __future__ import annotations

import numpy as np
import pytest

from fixture_paths import BUNDLED
from mtp_bindings import ContextError, Model, MTPError
from mtp_bindings.low_level import lib
from test_c_api_stateful import OK, Native

COMPUTE = lib.LLAMA_MTP_ERR_COMPUTE
N_STEPS = 4
PROMPT0 = list(range(5, 25))
PROMPT1 = list(range(30, 50))


@pytest.fixture
def native():
    """Two sequences, one KV stream each (``kv_unified`` false), the windowed sliding cache."""
    n = Native()
    try:
        assert n.attach() == OK
        n.create_context(swa_full=False)
        n.same_drafting_threads()
        yield n
    finally:
        n.close()


def _prefill(n: Native) -> tuple[int, np.ndarray, int]:
    rc, out = n.decode([(0, 0, PROMPT0), (1, 0, PROMPT1)])
    assert rc == 0
    token, h = out[0]
    return token, h, len(PROMPT0) - 1


def _drains(n: Native) -> int:
    return lib.llama_mtp_get_stats(n.ctx).n_drains


def _submit_after_sync(n: Native, token: int, h: np.ndarray, attn_pos: int):
    """The synchronous call's drafts and h for this state, then the same request submitted."""
    rc, drafts, h_out, _ = n.sync(0, attn_pos, token, h, N_STEPS)
    assert rc == OK
    assert n.submit(0, attn_pos, token, h, N_STEPS) == OK
    return drafts.copy(), h_out.copy()


def _wait_equals(n: Native, drafts: np.ndarray, h_out: np.ndarray) -> None:
    rc, got, got_h = n.wait(N_STEPS)
    assert rc == OK
    assert got.tolist() == drafts.tolist()
    assert np.array_equal(got_h, h_out)


def _drains_during(n: Native, action) -> int:
    """Submit a request (its drafts known from the synchronous call), run ``action(token, attn_pos)`` while
    it is in flight, check the request's drafts, and return how many waits ``action`` caused."""
    token, h, attn_pos = _prefill(n)
    drafts, h_out = _submit_after_sync(n, token, h, attn_pos)
    before = _drains(n)
    action(token, attn_pos)
    waited = _drains(n) - before
    _wait_equals(n, drafts, h_out)
    return waited


@pytest.mark.parametrize("edit", [
    lambda mem: lib.llama_memory_seq_add(mem, 1, 0, -1, 3),
    lambda mem: lib.llama_memory_seq_div(mem, 1, 0, -1, 2),
], ids=["seq_add", "seq_div"])
def test_a_shift_of_another_sequence_waits_for_the_request_in_flight(native, edit):
    assert _drains_during(native, lambda token, attn_pos: edit(native.mem)) == 1


def test_a_batch_mixing_sequences_across_kv_streams_waits_for_the_request_in_flight(native):
    def mixed_batch(token, attn_pos):
        assert native.decode([(0, attn_pos + 1, [token]), (1, len(PROMPT1), [7, 8])])[0] == 0
    assert _drains_during(native, mixed_batch) == 1


def test_the_drafting_sequences_first_append_still_does_not_wait(native):
    def verify_batch(token, attn_pos):
        assert native.decode([(0, attn_pos + 1, [token, 11, 12])])[0] == 0
    assert _drains_during(native, verify_batch) == 0


# --- fault injection (LLAMA_MTP_FAULT is read when a context's drafting state is created) ------------

def test_an_exception_in_submit_returns_the_compute_code_and_the_context_carries_on(native, monkeypatch):
    monkeypatch.setenv("LLAMA_MTP_FAULT", "submit")
    native.free_context()
    native.create_context(swa_full=False)
    token, h, attn_pos = _prefill(native)
    assert native.submit(0, attn_pos, token, h, N_STEPS) == COMPUTE
    assert native.sync(0, attn_pos, token, h, N_STEPS)[0] == COMPUTE
    assert native.wait(N_STEPS)[0] == lib.LLAMA_MTP_ERR_BUSY  # nothing was left in flight
    rc, _ = native.decode([(0, attn_pos + 1, [token])])
    assert rc == 0


def test_a_non_standard_exception_in_the_worker_fails_only_that_request(native, monkeypatch):
    monkeypatch.setenv("LLAMA_MTP_FAULT", "worker")
    native.free_context()
    native.create_context(swa_full=False)
    token, h, attn_pos = _prefill(native)
    for _ in range(3):  # the worker thread survives each failure
        assert native.submit(0, attn_pos, token, h, N_STEPS) == OK
        assert native.wait(N_STEPS)[0] == COMPUTE
    assert native.sync(0, attn_pos, token, h, N_STEPS)[0] == COMPUTE
    assert lib.llama_mtp_get_stats(native.ctx).n_requests == 4
    rc, _ = native.decode([(0, attn_pos + 1, [token])])
    assert rc == 0


@pytest.mark.parametrize("point", ["submit", "worker"])
def test_an_injected_drafting_failure_is_an_mtp_error_in_python(monkeypatch, point):
    monkeypatch.setenv("LLAMA_MTP_FAULT", point)
    with Model(BUNDLED / "trained-target.gguf", assistant=BUNDLED / "trained-assistant.gguf") as m, \
            m.create_context(n_ctx=128, embeddings=True) as ctx:
        ctx.decode(PROMPT0, pos=0)
        token = int(np.argmax(ctx.get_logits(-1)))
        with pytest.raises(MTPError, match="MTP graph computation failed"):
            ctx.decode_mtp(attn_pos=len(PROMPT0) - 1, last_token=token, h_prev=ctx.get_embeddings(-1),
                           n_steps=N_STEPS)
        ctx.decode([token])  # still usable


def test_a_context_whose_drafting_state_cannot_be_set_up_is_refused_at_creation(monkeypatch):
    """Patch 0006: the drafting state (scheduler, compute buffers, worker) is set up with the context, so a
    failure there (here injected; in real life drafting buffers that do not fit) refuses the context
    instead of failing a later generation; the model stays usable."""
    monkeypatch.setenv("LLAMA_MTP_FAULT", "setup")
    with Model(BUNDLED / "trained-target.gguf", assistant=BUNDLED / "trained-assistant.gguf") as m:
        with pytest.raises(ContextError, match="MTP drafting"):
            m.create_context(n_ctx=128, embeddings=True)
        monkeypatch.delenv("LLAMA_MTP_FAULT")
        with m.create_context(n_ctx=128, embeddings=True) as ctx:
            ctx.decode(PROMPT0, pos=0)
