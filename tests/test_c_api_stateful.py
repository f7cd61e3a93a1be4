"""A stateful property test of the MTP C API, driven through cffi on the bundled trained pair.

A hypothesis ``RuleBasedStateMachine`` keeps a model of one target context (two sequences,
``n_seq_max = 2``, one KV stream each, the sliding-window cache full-size or windowed) and makes random
sequences of: decodes on one or both sequences (batches of one or several ubatches, and batches at a
wrong position), KV edits (``llama_memory_seq_rm`` of a tail or a middle range, ``seq_add`` of a tail,
``seq_keep``, ``clear``), asynchronous drafting requests (``llama_decode_mtp_async`` / ``_wait``, with
KV edits, decodes and context frees while one is in flight: these drain it under the KV contract, there
is no other drain or cancel call), synchronous ``llama_decode_mtp`` calls, the worker's threadpool
attached and detached, the assistant's attach (once, at any point) and a context free + recreate. After every step it checks that each call returned the
code ``llama.h`` documents for the state (``LLAMA_MTP_ERR_BUSY`` while a request is in flight,
``_NO_ASSISTANT`` before the attach, ``_POS`` unless ``attn_pos`` is the sequence's last position, the
argument errors in their documented order), that the context's last positions are the model's, and that
an asynchronous request's drafts and projected ``h`` equal, bit for bit, those of the synchronous call
made on the same state with the same ``attn_pos``, last token and ``h`` just before it was submitted.

The machine runs in the pytest process: a native crash fails the run (pytest's faulthandler prints
the rule that was running), and hypothesis can only shrink failures it sees in-process.

``MTP_C_API_STATEFUL=long`` selects the larger profile that ``tools/sanitize.sh`` runs under ASan/UBSan
or TSAN; the default one keeps the test within about a minute on two shared cores.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from fixture_paths import BUNDLED
from mtp_bindings.low_level import ensure_initialised, ffi, lib
from mtp_bindings.native.threadpool import ThreadPool

TARGET = BUNDLED / "trained-target.gguf"
ASSISTANT = BUNDLED / "trained-assistant.gguf"

N_SEQ = 2
N_CTX = 1024  # 512 cells a stream: the windowed sliding cache (256 cells) wraps and reuses cells
N_BATCH = 64
N_UBATCH = 16
N_THREADS = 2
CELLS_PER_SEQ = N_CTX // N_SEQ       # kv_unified = false: one stream of n_ctx / n_seq_max cells a sequence
MAX_CELLS = CELLS_PER_SEQ - N_BATCH  # the model never fills a stream
# the sliding-window cache drops cells that fell out of the window of the newest position (full-size or
# not): removing more of the tail than the window would leave the sequence's new last position outside
# it, so llama_memory_seq_pos_max would no longer be the model's (an upstream limit, not MTP's)
MAX_TAIL_RM = 32
MAX_STEPS = lib.LLAMA_MTP_MAX_STEPS

OK = lib.LLAMA_MTP_OK
INVALID_ARG = lib.LLAMA_MTP_ERR_INVALID_ARG
NO_ASSISTANT = lib.LLAMA_MTP_ERR_NO_ASSISTANT
BUSY = lib.LLAMA_MTP_ERR_BUSY
SEQ_ID = lib.LLAMA_MTP_ERR_SEQ_ID
N_STEPS = lib.LLAMA_MTP_ERR_N_STEPS
POS = lib.LLAMA_MTP_ERR_POS
TOKEN = lib.LLAMA_MTP_ERR_TOKEN
ATTACHED = lib.LLAMA_MTP_ERR_ATTACHED

PROFILES = {
    "default": dict(max_examples=150, stateful_step_count=30),
    "long": dict(max_examples=1000, stateful_step_count=80),
}
PROFILE = PROFILES[os.environ.get("MTP_C_API_STATEFUL", "default")]

# invalid arguments of a drafting request, each with the code llama.h documents for it
BAD_ARGS = {
    "h_prev NULL": INVALID_ARG,
    "seq_id -1": SEQ_ID,
    "seq_id n_seq_max": SEQ_ID,
    "n_steps 0": N_STEPS,
    "n_steps max+1": N_STEPS,
    "token -1": TOKEN,
    "token n_vocab": TOKEN,
}


# An empty, NULL-terminated device list: the CPU only. llama.cpp's default (NULL) offloads to every registered
# device, and RPC devices stay registered for the process once added (tests/test_rpc.py adds some and stops
# their servers), so a default load later in the session would try servers that are gone.
NO_DEVICES = ffi.new("ggml_backend_dev_t[1]")


def cpu_model_params():
    """``llama_model_params`` that keep every layer on the CPU, whatever devices are registered."""
    mp = lib.llama_model_default_params()
    mp.devices = NO_DEVICES
    return mp


class Native:
    """Thin cffi calls on one model and one context (no checking: the machine checks)."""

    def __init__(self):
        ensure_initialised()
        self.model = lib.llama_model_load_from_file(str(TARGET).encode(), cpu_model_params())
        assert self.model != ffi.NULL
        self.n_vocab = lib.llama_vocab_n_tokens(lib.llama_model_get_vocab(self.model))
        self.n_embd = lib.llama_model_n_embd(self.model)
        self.ctx = ffi.NULL
        self.pool: ThreadPool | None = None  # the worker's, attached through the C API

    def attach(self) -> int:
        return lib.llama_model_load_mtp_from_file(self.model, str(ASSISTANT).encode(), cpu_model_params())

    def create_context(self, swa_full: bool) -> None:
        cp = lib.llama_context_default_params()
        cp.n_ctx, cp.n_batch, cp.n_ubatch, cp.n_seq_max = N_CTX, N_BATCH, N_UBATCH, N_SEQ
        cp.n_threads = cp.n_threads_batch = N_THREADS
        cp.embeddings = True
        cp.swa_full = swa_full
        cp.kv_unified = False
        self.ctx = lib.llama_init_from_model(self.model, cp)
        assert self.ctx != ffi.NULL

    def same_drafting_threads(self) -> None:
        """Asynchronous requests on the context's thread count, like synchronous ones: past 256 KV cells the
        drafting graph's result depends on the thread count (see the test at the end), which would hide
        what the machine looks for."""
        assert lib.llama_mtp_set_n_threads(self.ctx, N_THREADS) == OK

    def free_context(self) -> None:
        if self.ctx != ffi.NULL:
            lib.llama_free(self.ctx)
            self.ctx = ffi.NULL
        self.set_pool(None)

    def set_pool(self, pool: ThreadPool | None) -> None:
        """The pool now attached; the one before is freed at once, as its owner may once it is detached."""
        if self.pool is not None and self.pool is not pool:
            self.pool.close()
        self.pool = pool

    def close(self) -> None:
        self.free_context()
        if self.model != ffi.NULL:
            lib.llama_model_free(self.model)
            self.model = ffi.NULL

    @property
    def mem(self):
        return lib.llama_get_memory(self.ctx)

    def decode(self, runs: list[tuple[int, int, list[int]]]) -> tuple[int, dict[int, tuple[int, np.ndarray]]]:
        """Decode runs of (seq, first position, tokens) in one batch; returns the code and, for each
        sequence, the greedy token and h of its last token."""
        n = sum(len(toks) for _, _, toks in runs)
        batch = lib.llama_batch_init(n, 0, 1)
        try:
            last = {}
            i = 0
            for seq, p0, toks in runs:
                for j, tok in enumerate(toks):
                    batch.token[i], batch.pos[i], batch.n_seq_id[i] = tok, p0 + j, 1
                    batch.seq_id[i][0] = seq
                    batch.logits[i] = j == len(toks) - 1
                    i += 1
                last[seq] = i - 1
            batch.n_tokens = n
            rc = lib.llama_decode(self.ctx, batch)
        finally:
            lib.llama_batch_free(batch)
        out = {}
        if rc == 0:
            for seq, i in last.items():
                logits = np.frombuffer(ffi.buffer(lib.llama_get_logits_ith(self.ctx, i), 4 * self.n_vocab), np.float32)
                h = np.frombuffer(ffi.buffer(lib.llama_get_embeddings_ith(self.ctx, i), 4 * self.n_embd), np.float32)
                out[seq] = (int(np.argmax(logits)), h.copy())
        return rc, out

    def submit(self, seq, attn_pos, token, h, n_steps) -> int:
        h_ptr = ffi.NULL if h is None else ffi.from_buffer("float[]", h)
        return lib.llama_decode_mtp_async(self.ctx, seq, attn_pos, token, h_ptr, n_steps)

    def wait(self, n_steps: int, null_drafts: bool = False):
        drafts = np.zeros(max(n_steps, 1), np.int32)
        h = np.zeros(self.n_embd, np.float32)
        d_ptr = ffi.NULL if null_drafts else ffi.from_buffer("llama_token[]", drafts)
        rc = lib.llama_decode_mtp_wait(self.ctx, d_ptr, ffi.from_buffer("float[]", h))
        return rc, drafts[:n_steps], h

    def sync(self, seq, attn_pos, token, h, n_steps, want_logits: bool = False):
        drafts = np.zeros(max(n_steps, 1), np.int32)
        h_out = np.zeros(self.n_embd, np.float32)
        logits = np.zeros((max(n_steps, 1), self.n_vocab), np.float32)
        h_ptr = ffi.NULL if h is None else ffi.from_buffer("float[]", h)
        rc = lib.llama_decode_mtp(self.ctx, seq, attn_pos, token, h_ptr, n_steps,
                                  ffi.from_buffer("llama_token[]", drafts),
                                  ffi.from_buffer("float[]", logits) if want_logits else ffi.NULL,
                                  ffi.from_buffer("float[]", h_out))
        return rc, drafts[:n_steps], h_out, logits[:n_steps]


class CApiMachine(RuleBasedStateMachine):
    """Model: positions of each sequence, the last (token, h) seen for it, whether the assistant is
    attached, and the request in flight with the synchronous call's result for the same state."""

    def __init__(self):
        super().__init__()
        self.n = Native()
        self.attached = False
        self.swa_full = True
        self.pos: list[list[int]] = [[] for _ in range(N_SEQ)]
        # the newest position each sequence has had since it was last empty: the sliding-window cache (full-size
        # or not) has let go of cells older than its window of that position, whatever was removed since
        self.hi: list[int] = [-1] * N_SEQ
        self.last: list[tuple[int, np.ndarray]] = [(5, np.zeros(self.n.n_embd, np.float32)) for _ in range(N_SEQ)]
        self.flight = None   # (n_steps, drafts, h) of the synchronous call on the submitted state
        self.rng = np.random.default_rng(0)

    # --- model helpers ------------------------------------------------------------------------

    def pos_max(self, seq: int) -> int:
        return self.pos[seq][-1] if self.pos[seq] else -1

    def expected_request_code(self, seq, attn_pos, token, n_steps, h_null=False) -> int:
        """The code llama.h documents, errors checked in its order."""
        if h_null:
            return INVALID_ARG
        if not self.attached:
            return NO_ASSISTANT
        if not 0 <= seq < N_SEQ:
            return SEQ_ID
        if not 1 <= n_steps <= MAX_STEPS:
            return N_STEPS
        if not 0 <= token < self.n.n_vocab:
            return TOKEN
        if self.flight is not None:
            return BUSY
        if attn_pos < 0 or attn_pos != self.pos_max(seq):
            return POS
        return OK

    def tokens(self, count: int) -> list[int]:
        return [int(t) for t in self.rng.integers(4, self.n.n_vocab, count)]

    def append(self, runs: list[tuple[int, int]]) -> None:
        """Decode `count` new tokens on each (seq, count) at the sequence's next position."""
        batch = [(seq, self.pos_max(seq) + 1, self.tokens(count)) for seq, count in runs]
        rc, out = self.n.decode(batch)
        assert rc == 0, f"llama_decode returned {rc} for {[(s, p, len(t)) for s, p, t in batch]}"
        for seq, p0, toks in batch:
            self.pos[seq].extend(range(p0, p0 + len(toks)))
            self.hi[seq] = max(self.hi[seq], self.pos_max(seq))
            self.last[seq] = out[seq]

    def fits(self, seq: int, count: int) -> bool:
        return len(self.pos[seq]) + count <= MAX_CELLS

    # --- setup / teardown -----------------------------------------------------------------------

    @initialize(attach=st.booleans(), swa_full=st.booleans(), seed=st.integers(0, 2**32 - 1),
                prompt0=st.integers(0, 300), prompt1=st.integers(0, 300))
    def start(self, attach, swa_full, seed, prompt0, prompt1):
        self.rng = np.random.default_rng(seed)
        if attach:
            assert self.n.attach() == OK
            self.attached = True
        self.swa_full = swa_full
        self.n.create_context(swa_full)
        if attach:
            self.n.same_drafting_threads()
        for seq, count in ((0, prompt0), (1, prompt1)):
            for chunk in range(0, count, N_BATCH):  # llama_decode takes at most n_batch tokens
                self.append([(seq, min(N_BATCH, count - chunk))])

    def teardown(self):
        self.n.close()

    # --- the assistant ----------------------------------------------------------------------------

    @rule()
    def attach(self):
        rc = self.n.attach()
        assert rc == (ATTACHED if self.attached else OK)
        self.attached = True
        self.n.same_drafting_threads()

    # --- decodes --------------------------------------------------------------------------------

    @rule(seq=st.integers(0, N_SEQ - 1), count=st.integers(1, 40))
    def decode_one_sequence(self, seq, count):
        if self.fits(seq, count):
            self.append([(seq, count)])

    @rule(count0=st.integers(1, 24), count1=st.integers(1, 24))
    def decode_both_sequences(self, count0, count1):
        """One batch with tokens of both sequences (split_equal: several ubatches when they differ)."""
        if self.fits(0, count0) and self.fits(1, count1):
            self.append([(0, count0), (1, count1)])

    @rule(seq=st.integers(0, N_SEQ - 1), gap=st.sampled_from([-1, 1, 2]))
    def decode_at_a_wrong_position(self, seq, gap):
        if not self.pos[seq] or (gap < 0 and self.pos_max(seq) + gap + 1 < 0):
            return
        rc, _ = self.n.decode([(seq, self.pos_max(seq) + 1 + gap, self.tokens(2))])
        assert rc == -1  # "the sequence positions must remain consecutive": nothing is stored

    # --- KV edits -----------------------------------------------------------------------------

    @rule(seq=st.integers(0, N_SEQ - 1), k=st.integers(1, 64))
    def remove_the_tail(self, seq, k):
        k = min(k, len(self.pos[seq]), MAX_TAIL_RM)
        if k == 0:
            return
        new_last = self.pos[seq][-k - 1] if k < len(self.pos[seq]) else -1
        if new_last >= 0 and new_last < self.hi[seq] - MAX_TAIL_RM:
            return  # earlier removals (a middle range) already went that far below the newest position
        assert lib.llama_memory_seq_rm(self.n.mem, seq, self.pos[seq][-k], -1)
        del self.pos[seq][-k:]
        if not self.pos[seq]:
            self.hi[seq] = -1

    @rule(seq=st.integers(0, N_SEQ - 1), data=st.data())
    def remove_a_middle_range(self, seq, data):
        if len(self.pos[seq]) < 2:
            return
        i = data.draw(st.integers(0, len(self.pos[seq]) - 2))
        j = data.draw(st.integers(i + 1, len(self.pos[seq]) - 1))
        assert lib.llama_memory_seq_rm(self.n.mem, seq, self.pos[seq][i], self.pos[seq][j])
        del self.pos[seq][i:j]

    @rule(seq=st.integers(0, N_SEQ - 1), data=st.data())
    def shift_the_tail(self, seq, data):
        """seq_add of [p, end) by delta, never onto a position the sequence keeps below p."""
        if not self.pos[seq] or not lib.llama_memory_can_shift(self.n.mem):
            return
        i = data.draw(st.integers(0, len(self.pos[seq]) - 1))
        floor = self.pos[seq][i - 1] + 1 if i > 0 else 0
        lo = floor - self.pos[seq][i]
        delta = data.draw(st.integers(max(lo, -16), 16).filter(lambda d: d != 0))
        lib.llama_memory_seq_add(self.n.mem, seq, self.pos[seq][i], -1, delta)
        self.pos[seq][i:] = [p + delta for p in self.pos[seq][i:]]
        self.hi[seq] += delta

    @rule(seq=st.integers(0, N_SEQ - 1))
    def keep_one_sequence(self, seq):
        """Drains a request in flight; with one KV stream a sequence (kv_unified = false) upstream's
        seq_keep only looks at the kept sequence's own stream, so no sequence loses a cell."""
        lib.llama_memory_seq_keep(self.n.mem, seq)

    @rule(data=st.booleans())
    def clear(self, data):
        lib.llama_memory_clear(self.n.mem, data)
        self.pos = [[] for _ in range(N_SEQ)]
        self.hi = [-1] * N_SEQ

    # --- drafting -------------------------------------------------------------------------------

    @rule(seq=st.integers(0, N_SEQ - 1), n_steps=st.integers(1, MAX_STEPS), token=st.integers(0, 1023),
          offset=st.sampled_from([0, 0, 0, 0, -1, 1]), own_h=st.booleans())
    def submit(self, seq, n_steps, token, offset, own_h):
        """An asynchronous request; when it is accepted, the synchronous call on the same state
        (made just before) says what its drafts must be."""
        attn_pos = self.pos_max(seq) + offset
        tok, h = self.last[seq]
        token = tok if own_h else token
        want = self.expected_request_code(seq, attn_pos, token, n_steps)
        if want == OK:
            rc, d_sync, h_sync, _ = self.n.sync(seq, attn_pos, token, h, n_steps)
            assert rc == OK
        rc = self.n.submit(seq, attn_pos, token, h, n_steps)
        assert rc == want
        if rc == OK:
            self.flight = (n_steps, d_sync, h_sync)

    @precondition(lambda self: self.attached)
    @rule(seq=st.integers(0, N_SEQ - 1), count_seq=st.integers(1, 24), count_other=st.integers(0, 24))
    def submit_then_decode_at_once(self, seq, count_seq, count_other):
        """A 16-step request with a batch appending to its sequence (and maybe the other) right behind
        it, while the worker is still drafting: the drafts must still be the synchronous call's."""
        other = 1 - seq
        if self.flight is not None or not self.pos[seq] or not self.fits(seq, count_seq) \
                or not self.fits(other, count_other):
            return
        tok, h = self.last[seq]
        rc, d_sync, h_sync, _ = self.n.sync(seq, self.pos_max(seq), tok, h, MAX_STEPS)
        assert rc == OK
        assert self.n.submit(seq, self.pos_max(seq), tok, h, MAX_STEPS) == OK
        self.flight = (MAX_STEPS, d_sync, h_sync)
        self.append([(seq, count_seq)] + ([(other, count_other)] if count_other else []))

    @rule(bad=st.sampled_from(sorted(BAD_ARGS)), sync=st.booleans())
    def request_with_an_invalid_argument(self, bad, sync):
        seq, n_steps, token = 0, 4, 7
        h = self.last[0][1]
        if bad == "h_prev NULL":
            h = None
        elif bad == "seq_id -1":
            seq = -1
        elif bad == "seq_id n_seq_max":
            seq = N_SEQ
        elif bad == "n_steps 0":
            n_steps = 0
        elif bad == "n_steps max+1":
            n_steps = MAX_STEPS + 1
        elif bad == "token -1":
            token = -1
        else:
            token = self.n.n_vocab
        attn_pos = self.pos_max(seq) if 0 <= seq < N_SEQ else 0
        want = self.expected_request_code(seq, attn_pos, token, n_steps, h_null=h is None)
        assert want != OK
        rc = self.n.sync(seq, attn_pos, token, h, n_steps)[0] if sync else self.n.submit(seq, attn_pos, token, h, n_steps)
        assert rc == want, bad

    @rule()
    def wait(self):
        n_steps = self.flight[0] if self.flight else 1
        rc, drafts, h = self.n.wait(n_steps)
        if not self.attached:
            assert rc == NO_ASSISTANT
        elif self.flight is None:
            assert rc == BUSY
        else:
            assert rc == OK
            _, d_sync, h_sync = self.flight
            assert drafts.tolist() == d_sync.tolist(), "async drafts differ from the synchronous call's"
            assert np.array_equal(h, h_sync), "async h differs from the synchronous call's"
            self.flight = None

    @rule()
    def wait_without_an_output_buffer(self):
        """INVALID_ARG, and the request in flight (if any) is not consumed."""
        rc, _, _ = self.n.wait(1, null_drafts=True)
        assert rc == INVALID_ARG

    @rule(seq=st.integers(0, N_SEQ - 1), n_steps=st.integers(1, MAX_STEPS), token=st.integers(0, 1023),
          offset=st.sampled_from([0, 0, 0, -1, 1]), want_logits=st.booleans())
    def draft_synchronously(self, seq, n_steps, token, offset, want_logits):
        attn_pos = self.pos_max(seq) + offset
        h = self.last[seq][1]
        want = self.expected_request_code(seq, attn_pos, token, n_steps)
        rc, drafts, h_out, logits = self.n.sync(seq, attn_pos, token, h, n_steps, want_logits)
        assert rc == want
        if rc == OK:
            assert ((drafts >= 0) & (drafts < self.n.n_vocab)).all()
            assert np.isfinite(h_out).all()
            if want_logits:
                assert drafts.tolist() == np.argmax(logits, axis=1).tolist()

    @rule(n_threads=st.sampled_from([0, 1, 2]))
    def attach_a_threadpool(self, n_threads):
        """A threadpool of the asynchronous worker (0: detach it), with or without a request in flight
        (both wait for it), the pool it replaces freed at once; the drafts of later requests must still be
        the synchronous call's."""
        pool = ThreadPool(n_threads) if n_threads else None
        if pool is None:
            rc = lib.llama_mtp_detach_threadpool(self.n.ctx)
        else:
            rc = lib.llama_mtp_attach_threadpool(self.n.ctx, pool.ptr)
        assert rc == (OK if self.attached else NO_ASSISTANT)
        if rc == OK:
            self.n.set_pool(pool)
        elif pool is not None:
            pool.close()

    # --- the context ----------------------------------------------------------------------------

    @rule(swa_full=st.booleans())
    def free_and_recreate_the_context(self, swa_full):
        """llama_free with or without a request in flight (it waits for it), then a fresh context."""
        self.n.free_context()
        self.flight = None
        self.pos = [[] for _ in range(N_SEQ)]
        self.hi = [-1] * N_SEQ
        self.swa_full = swa_full
        self.n.create_context(swa_full)
        if self.attached:
            self.n.same_drafting_threads()

    # --- invariants -----------------------------------------------------------------------------

    @invariant()
    def last_positions_are_the_models(self):
        if self.n.ctx == ffi.NULL:
            return
        for seq in range(N_SEQ):
            assert lib.llama_memory_seq_pos_max(self.n.mem, seq) == self.pos_max(seq), seq


CApiMachine.TestCase.settings = settings(deadline=None, suppress_health_check=list(HealthCheck), **PROFILE)
test_c_api_state_machine = pytest.mark.slow(CApiMachine.TestCase)


# --- examples the machine found, kept as plain tests ------------------------------------------------

def _run_steps(steps) -> None:
    machine = CApiMachine()
    try:
        for name, kwargs in steps:
            getattr(machine, name)(**kwargs)
            machine.last_positions_are_the_models()
    finally:
        machine.teardown()


# Found by the machine above (issue 17): past 256 KV cells the one-row flash-attention path split the KV
# by thread count, so a drafting request on the worker's threads differed from the synchronous call on the
# context's (h by ~7e-4). Patch 0108 splits it into a fixed number of chunks.
def test_async_drafts_equal_the_sync_call_past_256_cells_with_other_drafting_threads():
    machine = CApiMachine()
    try:
        machine.start(attach=True, swa_full=True, seed=0, prompt0=257, prompt1=0)
        assert lib.llama_mtp_set_n_threads(machine.n.ctx, 1) == OK  # the worker's default on 2 CPUs
        machine.submit(seq=0, n_steps=MAX_STEPS, token=0, offset=0, own_h=True)
        machine.wait()
    finally:
        machine.teardown()


def test_first_append_in_flight_keeps_the_drafts_of_a_wrapped_windowed_cache():
    """One token appended to the drafting sequence right behind a 16-step request (the append the KV
    contract lets through without waiting), on a windowed sliding cache of 256 cells that has wrapped."""
    _run_steps([("start", dict(attach=False, swa_full=False, seed=0, prompt0=257, prompt1=0)),
                ("attach", {}),
                ("submit_then_decode_at_once", dict(count_other=0, count_seq=1, seq=0)),
                ("wait", {})])


def _replay_tail_removals(swa_full: bool, prompts: tuple[int, int], middle: tuple[int, int], before_tails) -> None:
    """Start the machine, remove ``middle`` (indices of sequence 1's positions: remove_a_middle_range's draw),
    run ``before_tails(machine)``, then remove the tail twice, checking the last positions after each."""
    machine = CApiMachine()
    try:
        machine.start(attach=False, swa_full=swa_full, seed=0, prompt0=prompts[0], prompt1=prompts[1])
        pos = machine.pos[1]
        assert lib.llama_memory_seq_rm(machine.n.mem, 1, pos[middle[0]], pos[middle[1]])
        del pos[middle[0]:middle[1]]
        tails = before_tails(machine)
        for k in tails:
            machine.remove_the_tail(seq=1, k=k)
            machine.last_positions_are_the_models()
    finally:
        machine.teardown()


def test_removing_the_tail_after_a_middle_range_stays_inside_the_window():
    """Found by the long profile (tools/sanitize.sh): a middle range and then the tail removed from a
    sequence of the windowed sliding cache went further below its newest position than the window, where
    the cache had already let go of the cells (upstream's behaviour, so llama_memory_seq_pos_max said -1):
    the machine now skips such a tail removal."""
    _replay_tail_removals(False, (153, 285), (69, 284), lambda machine: (43, 24))


def test_a_full_size_sliding_cache_also_lets_go_of_cells_outside_the_window():
    """Found next by the long profile, with the full-size sliding cache (swa_full): removals, a shift, a
    decode and more removals left the sequence empty in the cache (-1) but not in the model (4): the cache
    had let go of cells outside the window of the decoded tokens, full-size or not."""
    def removals_shift_decode(machine):
        machine.remove_the_tail(seq=1, k=19)
        machine.remove_the_tail(seq=1, k=21)
        pos = machine.pos[1]
        lib.llama_memory_seq_add(machine.n.mem, 1, pos[0], -1, 1)  # shift_the_tail's draw: all of it, +1
        machine.pos[1] = [p + 1 for p in pos]
        machine.hi[1] += 1
        machine.decode_one_sequence(seq=1, count=8)
        return (19, 63)

    _replay_tail_removals(True, (230, 110), (43, 66), removals_shift_decode)


# The threadpool of patch 0015: the CPU backend pauses the pool it had when it is given another, so a pool that
# was detached and freed before the next request was paused after it was freed (a use after free wherever
# ggml has its own threads, e.g. the TSAN build of tools/sanitize.sh; with OpenMP the pause does nothing).
def test_a_detached_threadpool_may_be_freed_before_the_next_request():
    _run_steps([("start", dict(attach=True, swa_full=True, seed=0, prompt0=8, prompt1=0)),
                ("attach_a_threadpool", dict(n_threads=2)),
                ("submit", dict(seq=0, n_steps=4, token=0, offset=0, own_h=True)),
                ("wait", {}),
                ("attach_a_threadpool", dict(n_threads=0)),
                ("submit", dict(seq=0, n_steps=4, token=0, offset=0, own_h=True)),
                ("wait", {})])
