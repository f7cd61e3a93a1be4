"""Our single-context MTP drafts equal upstream llama.cpp's own MTP path — a second context of
type ``LLAMA_CONTEXT_TYPE_MTP`` on the assistant loaded as its own model, reading the target's KV
through ``ctx_other`` — driven from Python through the same library (public API only: the
extended batch carries the token, its position and ``h``)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fixture_paths import PAIRS, fixture_path
from mtp_bindings import Model
from mtp_bindings.low_level import ffi, lib
from test_c_api_stateful import cpu_model_params


class UpstreamDrafter:
    """Upstream's second-context drafter for one target context."""

    def __init__(self, assistant_path: str, target_ctx) -> None:
        self.model = lib.llama_model_load_from_file(assistant_path.encode(), cpu_model_params())
        assert self.model != ffi.NULL
        cp = lib.llama_context_default_params()
        cp.n_ctx, cp.n_batch, cp.n_ubatch = target_ctx.n_ctx, 8, 8
        cp.ctx_type = lib.LLAMA_CONTEXT_TYPE_MTP
        cp.ctx_other = target_ctx.ptr
        cp.flash_attn_type = lib.LLAMA_FLASH_ATTN_TYPE_DISABLED
        self.ctx = lib.llama_init_from_model(self.model, cp)
        assert self.ctx != ffi.NULL
        self.batch = lib.llama_batch_ext_init(self.ctx)
        self.n_vocab = target_ctx.model.n_vocab

    def step(self, token: int, pos: int, h: np.ndarray) -> np.ndarray:
        """One draft step: the full logits row upstream computes."""
        h = np.ascontiguousarray(h, dtype=np.float32)
        lib.llama_batch_ext_clear(self.batch)
        idx = lib.llama_batch_ext_add_token(self.batch, 0, token)
        p = ffi.new("llama_pos *", pos)
        lib.llama_batch_ext_set_pos(self.batch, idx, p)
        embd = ffi.new("struct llama_embd *", {"data": ffi.from_buffer("float[]", h), "n_rows": 1, "n_embd": h.size})
        assert lib.llama_batch_ext_set_embd_token(self.batch, idx, embd[0])
        assert lib.llama_batch_ext_set_output_logits(self.batch, idx, True)
        assert lib.llama_process(self.ctx, lib.LLAMA_PROCESS_TYPE_DECODE, self.batch) == 0
        row = lib.llama_get_logits_ith(self.ctx, idx)
        return np.frombuffer(ffi.buffer(row, self.n_vocab * 4), dtype=np.float32).copy()

    def close(self) -> None:
        lib.llama_batch_ext_free(self.batch)
        lib.llama_free(self.ctx)
        lib.llama_model_free(self.model)


@pytest.fixture(scope="module")
def setup():
    target, assistant = PAIRS["dense"]
    with Model(fixture_path(target), assistant=fixture_path(assistant)) as m, \
            m.create_context(n_ctx=256, embeddings=True, flash_attn="off") as ctx:
        up = UpstreamDrafter(str(fixture_path(assistant)), ctx)
        yield m, ctx, up
        up.close()


@settings(max_examples=15, deadline=None, suppress_health_check=list(HealthCheck))
@given(prompt=st.lists(st.integers(4, 1023), min_size=1, max_size=60), n_steps=st.integers(1, 6))
def test_drafts_and_logits_equal_upstreams_second_context(setup, prompt, n_steps):
    model, ctx, up = setup
    ctx.clear()
    ctx.decode([2] + prompt, pos=0)
    tok, h, attn_pos = int(np.argmax(ctx.get_logits(-1))), ctx.get_embeddings(-1), len(prompt)
    drafts, _, logits = ctx.decode_mtp(attn_pos=attn_pos, last_token=tok, h_prev=h, n_steps=n_steps,
                                       return_logits=True)
    for k in range(n_steps):
        # upstream is fed our step-k inputs (the previous draft and our projected h): both paths
        # then compute the same step, and every step is compared, not just the first
        theirs = up.step(tok, attn_pos + 1, h)
        assert np.array_equal(theirs, logits[k]), (k, np.abs(theirs - logits[k]).max())
        assert int(np.argmax(theirs)) == int(drafts[k])
        d, h = ctx.decode_mtp(attn_pos=attn_pos, last_token=tok, h_prev=h, n_steps=1)
        tok = int(d[0])
