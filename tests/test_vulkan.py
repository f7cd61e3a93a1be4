"""MTP on a Vulkan device (issue 28; the ``vulkan`` tier, run by ``make test-vulkan``).

Every layer of the target and of its assistant on the device (``n_gpu_layers=-1, devices="Vulkan0"``, the
CLI's ``-ngl 99 -ngld 99 -dev Vulkan0``): the load puts the weights there, MTP at temperature 0 gives plain
decoding's tokens on the device up to near-ties (dense and centroid heads, depth 2 on and off; a device's
kernels are not batch-invariant as the CPU's are), the drafts are the CPU's
(the same argmax, or a near-tie of the CPU's draft logits), the asynchronous request equals the synchronous
one, KV edits with a request in flight behave as the C API promises, and the server answers from the device.

Without a Vulkan device (a build without ``-DGGML_VULKAN=ON``, or no device) the tier is skipped with the
reason; ``MTP_TEST_DEVICE=CUDA0`` runs the same tests on another device (``tools/device_check.sh``). Mesa's lavapipe (a Vulkan device on the CPU, Debian's ``mesa-vulkan-drivers``) counts: ggml-vulkan
takes a CPU-type device only when named, ``GGML_VK_VISIBLE_DEVICES=0``, which ``make test-vulkan`` sets.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from fixture_paths import PAIRS, fixture_path
from numerics import TOL, assert_agree, forced_rows
from native_log import native_log
from test_mtp_api import _prefill
from test_server import running_server

# another GPU device runs the same tests: MTP_TEST_DEVICE=CUDA0 (tools/device_check.sh does, on a lent GPU)
DEVICE = os.environ.get("MTP_TEST_DEVICE", "Vulkan0")
PROMPTS = ["def main(argv):\n", "import os\nimport sys\n", "class Queue:\n    def __init__(self):"]
N_TOKENS = 24


def _device_names() -> list[str]:
    from mtp_bindings.native.devices import list_devices

    return [d.name for d in list_devices()]


pytestmark = pytest.mark.skipif(
    DEVICE not in _device_names(),
    reason=f"no device {DEVICE} in this build (Vulkan: CMAKE_ARGS=-DGGML_VULKAN=ON, make test-vulkan; Mesa's lavapipe "
           "needs GGML_VK_VISIBLE_DEVICES=0)")


def _load(target: Path, assistant: Path, **placement: Any) -> tuple[Any, list[str]]:
    """The pair loaded with ``placement``, and llama.cpp's load log."""
    from mtp_bindings import Model

    with native_log() as lines:
        model = Model(target, assistant=assistant, verbose=True, **placement)
    return model, lines


@pytest.fixture(scope="module", params=["dense", "centroid", "trained"])
def pair(request: pytest.FixtureRequest, trained_paths: tuple[Path, Path]) -> Iterator[dict[str, Any]]:
    """The pair on the device and on the CPU, a context each, and the device's load log."""
    if request.param == "trained":
        target, assistant = trained_paths
    else:
        target, assistant = (fixture_path(p) for p in PAIRS[request.param])
    dev, log = _load(target, assistant, n_gpu_layers=-1, devices=DEVICE)
    cpu, _ = _load(target, assistant, devices="none")
    with dev, cpu, dev.create_context(n_ctx=512, n_threads=1, embeddings=True) as dctx, \
            cpu.create_context(n_ctx=512, n_threads=1, embeddings=True) as cctx:
        yield {"name": request.param, "dev": dev, "dctx": dctx, "cpu": cpu, "cctx": cctx, "log": log}


def test_every_layer_of_target_and_assistant_is_on_the_device(pair: dict[str, Any]) -> None:
    log = "\n".join(pair["log"])
    offloaded = [line for line in pair["log"] if "offloaded" in line and "layers to GPU" in line]
    assert offloaded, log
    for line in offloaded:  # "load_tensors: offloaded 5/5 layers to GPU", once for each model
        n, of = line.split("offloaded", 1)[1].split("layers")[0].strip().split("/")
        assert n == of, line
    assert len(offloaded) == 2, offloaded
    assert sum(f"{DEVICE} model buffer size" in line for line in pair["log"]) >= 2, log


@pytest.mark.parametrize("depth2", [False, True], ids=["depth1", "depth2"])
def test_greedy_mtp_agrees_with_plain_greedy_on_the_device(pair: dict[str, Any], depth2: bool) -> None:
    """The same tokens, or a parting at a near-tie of plain decoding's row: a device's kernels round a verify
    batch's rows differently from one-token decodes (on the CPU the patches make them equal: exact there),
    by up to ``device_batch_vs_single`` (measured on lavapipe: a parting at token 7 of the dense pair, 8.1556
    vs 8.1357)."""
    model, ctx = pair["dev"], pair["dctx"]
    for prompt in PROMPTS:
        plain = model.generate(prompt, max_tokens=N_TOKENS, draft_n_max=0, context=ctx, temperature=0)
        rows = None
        for n in (1, 3):
            spec = model.generate(prompt, max_tokens=N_TOKENS, draft_n_max=n, depth2=depth2, context=ctx,
                                  temperature=0)
            assert spec.stats.n_drafted > 0
            if spec.tokens != plain.tokens and rows is None:
                rows = forced_rows(ctx, model.tokenize(prompt), plain.tokens)
            assert_agree(plain.tokens, spec.tokens, lambda i: rows[i], TOL["device_batch_vs_single"],
                         (pair["name"], prompt, n, "MTP vs plain on the device"))


def _drafts(model: Any, ctx: Any, prompt: list[int], n_steps: int) -> tuple[np.ndarray, np.ndarray, int]:
    """The assistant's ``n_steps`` drafts after ``prompt``, the h_prev they started from, and the greedy next
    token they follow (test_mtp_api's prefill)."""
    tok, h, attn_pos = _prefill(model, ctx, prompt)
    drafts, _ = ctx.decode_mtp(attn_pos=attn_pos, last_token=tok, h_prev=h, n_steps=n_steps)
    return np.asarray(drafts), h, tok


def test_greedy_picks_are_taken_on_the_host_when_the_logits_are_on_the_device(pair: dict[str, Any]) -> None:
    """llama.cpp's backend sampling (the graph's argmax) is used only where the logits are on the CPU: on lavapipe a
    context that had it, turned it off (a decode asking for rows) and decoded on corrupted the heap (glibc's
    "corrupted double-linked list"). This is that sequence: a greedy generation, then rows read by teacher
    forcing, then more decodes."""
    model, ctx = pair["dev"], pair["dctx"]
    plain = model.generate(PROMPTS[2], max_tokens=N_TOKENS, draft_n_max=0, context=ctx, temperature=0)
    assert not ctx.graph_greedy_seqs
    rows = forced_rows(ctx, model.tokenize(PROMPTS[2]), plain.tokens)
    assert [int(np.argmax(r)) for r in rows] == plain.tokens
    again = model.generate(PROMPTS[2], max_tokens=N_TOKENS, draft_n_max=3, context=ctx, temperature=0)
    assert_agree(plain.tokens, again.tokens, lambda i: rows[i], TOL["device_batch_vs_single"],
                 (pair["name"], "MTP after teacher forcing on the device"))


def test_the_device_drafts_what_the_cpu_drafts(pair: dict[str, Any]) -> None:
    """The same inputs give the same drafts on the device as on the CPU: the device's target rows are the
    CPU's within float noise (its first draft's input), and the drafting graph ran there."""
    prompt = pair["dev"].tokenize(PROMPTS[2])
    d_dev, h_dev, _ = _drafts(pair["dev"], pair["dctx"], prompt, 4)
    row_dev = np.asarray(pair["dctx"].get_logits(-1))
    d_cpu, h_cpu, _ = _drafts(pair["cpu"], pair["cctx"], prompt, 4)
    row_cpu = np.asarray(pair["cctx"].get_logits(-1))
    assert np.max(np.abs(row_dev - row_cpu)) < 0.25, "the target's logits on the device are not the CPU's"
    assert np.max(np.abs(h_dev - h_cpu)) < 0.2
    assert d_dev.tolist() == d_cpu.tolist()


def test_async_and_wait_equal_the_sync_call_on_the_device(pair: dict[str, Any]) -> None:
    model, ctx = pair["dev"], pair["dctx"]
    prompt = model.tokenize(PROMPTS[0])
    want, h, tok = _drafts(model, ctx, prompt, 3)
    got, _ = ctx.decode_mtp_async(attn_pos=len(prompt) - 1, last_token=tok, h_prev=h, n_steps=3).wait()
    assert np.asarray(got).tolist() == want.tolist()


def test_appending_past_attn_pos_while_in_flight_keeps_the_drafts_on_the_device(pair: dict[str, Any]) -> None:
    model, ctx = pair["dev"], pair["dctx"]
    prompt = [2, 10, 20, 30]
    want, h, tok = _drafts(model, ctx, prompt, 4)
    handle = ctx.decode_mtp_async(attn_pos=len(prompt) - 1, last_token=tok, h_prev=h, n_steps=4)
    ctx.decode([tok, 11, 12], pos=len(prompt))  # the verify batch, while the drafts are computed
    got, _ = handle.wait()
    assert np.asarray(got).tolist() == want.tolist()


def test_removing_kv_below_attn_pos_while_in_flight_drains_first_on_the_device(pair: dict[str, Any]) -> None:
    from mtp_bindings.low_level import ffi, lib
    from mtp_bindings.mtp import session_of

    model, ctx = pair["dev"], pair["dctx"]
    prompt = [2, 10, 20, 30, 40]
    want, h, tok = _drafts(model, ctx, prompt, 4)
    ctx.decode_mtp_async(attn_pos=len(prompt) - 1, last_token=tok, h_prev=h, n_steps=4)
    # straight to C, bypassing the Python drain: the library must drain by itself
    assert lib.llama_memory_seq_rm(lib.llama_get_memory(ctx.ptr), 0, 1, -1)
    out = np.zeros(16, dtype=np.int32)
    assert lib.llama_decode_mtp_wait(ctx.ptr, ffi.from_buffer("llama_token[]", out), ffi.NULL) == 0
    assert out[:4].tolist() == want.tolist()
    session_of(ctx).in_flight = None  # the Python handle was bypassed on purpose


def test_the_server_answers_from_the_device(tmp_path: Path, trained_paths: tuple[Path, Path]) -> None:
    """``serve -ngl 99 -ngld 99 -dev Vulkan0``: a greedy completion equals the in-process device run."""
    target, assistant = trained_paths
    dev, _ = _load(target, assistant, n_gpu_layers=-1, devices=DEVICE)
    with dev, dev.create_context(n_ctx=1024, n_threads=1, embeddings=True) as ctx:
        ref = dev.generate(PROMPTS[0], max_tokens=N_TOKENS, temperature=0, draft_n_max=2, context=ctx)
    with running_server(["-c", "1024", "-ngl", "99", "-ngld", "99", "-dev", DEVICE, "-v"], tmp_path) as server:
        resp = server.openai().completions.create(model="any", prompt=PROMPTS[0], max_tokens=N_TOKENS, temperature=0)
        log = server.log.read_text(errors="replace")
    assert resp.choices[0].text == ref.text
    assert resp.usage.completion_tokens == ref.stats.n_generated
    # -v: llama.cpp's load log, which names the weights' buffer on the device
    assert f"{DEVICE} model buffer size" in log, log[-3000:]


def _traffic(model: Any, n_prompt: int, n_steps: int) -> dict[str, int]:
    """One drafting request's host<->device traffic (the counters of llama_mtp_stats) after a prompt of
    ``n_prompt`` tokens: the drafting graph attends to that many cells of the target's KV cache."""
    from mtp_bindings.mtp import graph_stats

    prompt = [2 + i % 500 for i in range(n_prompt)]
    with model.create_context(n_ctx=1024, n_threads=1, embeddings=True) as ctx:
        _drafts(model, ctx, prompt, n_steps)  # builds the drafting graph for this KV size and step count
        before = graph_stats(ctx)
        _drafts(model, ctx, prompt, n_steps)
        after = graph_stats(ctx)
    return {k: after[k] - before[k] for k in ("n_transfers", "n_transfer_bytes", "n_syncs")}


def test_a_drafting_requests_host_device_traffic_is_counted(pair: dict[str, Any]) -> None:
    """A request moves its inputs and results between the host and the device and waits for it, and the
    counters say so (on the CPU they stay at zero: test_mtp_api.py)."""
    got = _traffic(pair["dev"], 40, 4)
    assert got["n_transfers"] >= 2 and got["n_transfer_bytes"] > 0, got
    assert got["n_syncs"] >= 1, got


def test_a_requests_draft_steps_wait_for_the_device_once(pair: dict[str, Any]) -> None:
    """The steps of a request are chained on the device (patch 0021) and its inputs go up without a wait each
    (patch 0124): one request, of one step or four, waits for the device once, to read its drafts."""
    one, four = _traffic(pair["dev"], 40, 1), _traffic(pair["dev"], 40, 4)
    assert one["n_syncs"] == four["n_syncs"] == 1, (one, four)


def test_more_draft_steps_upload_nothing_the_size_of_the_context(pair: dict[str, Any]) -> None:
    """The inputs (the KQ masks grow with the KV cells attended to) go up once a request: three more steps
    cost the same bytes after 700 cells as after 40 (three more drafted ids, read with the others)."""
    extra = {n: _traffic(pair["dev"], n, 4)["n_transfer_bytes"] - _traffic(pair["dev"], n, 1)["n_transfer_bytes"]
             for n in (40, 700)}
    assert extra[700] == extra[40], extra
    assert extra[700] <= 1024, extra
