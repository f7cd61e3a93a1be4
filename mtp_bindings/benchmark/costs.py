"""Part 3: cost structure at Gemma 4 shapes (draft step, verify, prompt processing, memory).

Ours measured here, in process (the memory in a fresh one); upstream's from its server's logs, by
:mod:`.upstream_costs`; :func:`run_cost` runs both."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np

from .config import BenchConfig, log
from .driver_time import driver_overhead
from .models import SHAPES, build_cost_models
from .upstream_costs import logged_buffers, upstream_costs
from .util import CpuMeter, median, rss_bytes


# --- cost measurements ---------------------------------------------------------------------------

def measure_draft_steps(models: dict[str, Any], *, threads: int, n_prompt: int, steps: Sequence[int], rounds: int,
                        calls: int = 4, seed: int = 5) -> dict[str, Any]:
    """Time of one ``ctx.decode_mtp(n_steps)`` per assistant kind: each round times ``calls``
    calls in a row (their mean), kinds and step counts interleaved; ``ms`` is the best round (the
    machine is shared: the least disturbed round), ``ms_median`` the median round."""
    ctxs, args = {}, {}
    rng = np.random.default_rng(seed)
    for kind, model in models.items():
        ctx = model.create_context(n_ctx=max(1024, n_prompt + 64), n_threads=threads, flash_attn="off", embeddings=True)
        toks = rng.integers(10, min(model.n_vocab, 1000), size=n_prompt).tolist()
        ctx.decode(toks, pos=0)
        x = int(np.argmax(ctx.get_logits(-1)))
        h = ctx.get_embeddings(-1)
        ctxs[kind], args[kind] = ctx, dict(attn_pos=n_prompt - 1, last_token=x, h_prev=h)
        for _ in range(2):
            ctx.decode_mtp(n_steps=max(steps), **args[kind])
    times: dict[str, dict[int, list[float]]] = {k: {n: [] for n in steps} for k in models}
    jobs = [(k, n) for k in models for n in steps]
    order_rng = random.Random(seed)

    def block(k: str, n: int) -> float:
        t0 = time.perf_counter()
        for _ in range(calls):
            ctxs[k].decode_mtp(n_steps=n, **args[k])
        return (time.perf_counter() - t0) / calls

    for _ in range(rounds):
        for k, n in order_rng.sample(jobs, len(jobs)):
            times[k][n].append(block(k, n))
    from ..mtp import graph_stats

    out: dict[str, Any] = {}
    for k, ctx in ctxs.items():
        best = {n: min(times[k][n]) for n in steps}
        slope = float(np.polyfit(list(steps), [best[n] for n in steps], 1)[0]) if len(steps) > 1 else best[steps[0]]
        out[k] = {"ms": {str(n): best[n] * 1e3 for n in steps},
                  "ms_median": {str(n): median(times[k][n]) * 1e3 for n in steps},
                  "ms_all": {str(n): [t * 1e3 for t in times[k][n]] for n in steps},
                  "ms_per_step_slope": slope * 1e3, "ms_per_step_at_max": best[max(steps)] / max(steps) * 1e3,
                  "graph_stats": graph_stats(ctx)}
        ctx.close()
    return out


def measure_verify(model: Any, *, threads: int, n_prompt: int, ns: Sequence[int], rounds: int, seed: int = 6) -> dict[str, Any]:
    """Median time of one target decode of n tokens (logits for all, embeddings on as MTP needs),
    and the same plus reading every logits row back (what the driver does)."""
    rng = np.random.default_rng(seed)
    ctx = model.create_context(n_ctx=max(1024, n_prompt + 64), n_threads=threads, flash_attn="off", embeddings=True)
    toks = rng.integers(10, min(model.n_vocab, 1000), size=n_prompt + max(ns)).tolist()
    ctx.decode(toks[:n_prompt], pos=0, logits="none")
    t_dec: dict[int, list[float]] = {n: [] for n in ns}
    t_read: dict[int, list[float]] = {n: [] for n in ns}

    def one(n: int, read: bool) -> float:
        ctx.seq_rm(0, n_prompt, -1)
        t0 = time.perf_counter()
        ctx.decode(toks[n_prompt:n_prompt + n], pos=n_prompt, logits="all")
        if read:
            ctx.get_logits_all()
            ctx.get_embeddings(0)
        return time.perf_counter() - t0

    for n in ns:
        one(n, True)
    order = random.Random(seed)
    jobs = [(n, r) for n in ns for r in (False, True)]
    for _ in range(rounds):
        for n, r in order.sample(jobs, len(jobs)):
            (t_read if r else t_dec)[n].append(one(n, r))
    ctx.close()
    best = {n: min(t_dec[n]) for n in ns}
    best_r = {n: min(t_read[n]) for n in ns}
    return {"ms": {str(n): best[n] * 1e3 for n in ns},
            "ms_with_readback": {str(n): best_r[n] * 1e3 for n in ns},
            "ms_median": {str(n): median(t_dec[n]) * 1e3 for n in ns},
            "ratio_to_1": {str(n): best[n] / best[ns[0]] for n in ns},
            "ratio_to_1_with_readback": {str(n): best_r[n] / best_r[ns[0]] for n in ns},
            "estimator": "best of the rounds (the machine is shared)"}


def measure_prompt_processing(target: Path, assistant: Path, *, threads: int, n_prompt: int, rounds: int,
                              seed: int = 4) -> dict[str, Any]:
    """Ours: prompt-processing tokens/s of an ``n_prompt``-token prompt, interleaved, as the driver
    does it (``GenerationStats.t_prompt`` of ``generate(max_tokens=1)``): the model without an
    assistant vs with the assistant attached and drafting on; and, for reference, one decode of the
    whole prompt with embeddings on (llama.cpp then outputs every prompt row, logits included:
    what the driver did before it decoded all but the last prompt token without embeddings)."""
    from ..api import Model

    rng = np.random.default_rng(seed)
    plain = Model(target)
    mtp = Model(target, assistant=assistant)
    toks = rng.integers(10, min(plain.n_vocab, 1000), size=n_prompt).tolist()
    kw: dict[str, Any] = dict(n_ctx=n_prompt + 64, n_batch=n_prompt, n_ubatch=n_prompt, n_threads=threads, flash_attn="off")
    ctxs = {"without assistant": plain.create_context(**kw),
            "with assistant": mtp.create_context(**kw, embeddings=True),
            "with assistant, embeddings on for the whole prompt": mtp.create_context(**kw, embeddings=True)}

    def one(k: str) -> float:
        ctx = ctxs[k]
        if k.endswith("whole prompt"):
            ctx.clear()
            t0 = time.perf_counter()
            ctx.decode(toks, pos=0)
            ctx.get_embeddings(-1)
            return time.perf_counter() - t0
        model = plain if k == "without assistant" else mtp
        r = model.generate(toks, context=ctx, max_tokens=1, draft_n_max=0 if model is plain else 2)
        return r.stats.t_prompt

    for k in ctxs:
        one(k)
    times: dict[str, list[float]] = {k: [] for k in ctxs}
    order = random.Random(seed)
    for _ in range(rounds):
        for k in order.sample(list(ctxs), len(ctxs)):
            times[k].append(one(k))
    for c in ctxs.values():
        c.close()
    plain.close()
    mtp.close()
    tps = {k: n_prompt / median(v) for k, v in times.items()}
    return {"n_prompt": n_prompt, "tokens_per_s": tps, "tokens_per_s_all": {k: [n_prompt / t for t in v] for k, v in times.items()},
            "ratio_with_vs_without": tps["with assistant"] / tps["without assistant"],
            "ratio_whole_prompt_embeddings_vs_without": tps["with assistant, embeddings on for the whole prompt"]
            / tps["without assistant"]}


def _memory_worker(target: str, assistant: str, threads: int) -> dict[str, Any]:
    """Run in a fresh process: RSS before/after attaching the assistant and after its first
    draft, and the buffer sizes llama.cpp logs (ours: the MTP scheduler's compute buffer)."""
    import logging

    from ..api import Model

    lines: list[str] = []

    class Grab(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append(record.getMessage())

    lg = logging.getLogger("mtp_bindings.native")
    lg.addHandler(Grab())
    lg.setLevel(logging.DEBUG)
    lg.propagate = False
    out: dict[str, Any] = {}
    model = Model(target, verbose=True)
    ctx = model.create_context(n_ctx=1024, n_threads=threads, flash_attn="off", embeddings=True)
    toks = list(range(10, 138))
    ctx.decode(toks, pos=0)
    ctx.decode([11], pos=len(toks))
    out["rss_target_mib"] = rss_bytes() / 2**20
    n0 = len(lines)
    model.attach_assistant(assistant)
    out["rss_attached_mib"] = rss_bytes() / 2**20
    h = ctx.get_embeddings(-1)
    ctx.decode_mtp(attn_pos=len(toks), last_token=12, h_prev=h, n_steps=4)
    out["rss_after_draft_mib"] = rss_bytes() / 2**20
    out["rss_delta_mib"] = out["rss_after_draft_mib"] - out["rss_target_mib"]
    out["assistant_file_mib"] = Path(assistant).stat().st_size / 2**20
    out["buffers_target"] = logged_buffers("\n".join(lines[:n0]))
    out["buffers_assistant"] = logged_buffers("\n".join(lines[n0:]))
    out["kv_buffers_added"] = [b for b in out["buffers_assistant"] if b["kind"] == "KV"]
    ctx.close()
    model.close()
    return out


def measure_memory_ours(target: Path, assistant: Path, threads: int) -> dict[str, Any]:
    code = ("import json,sys; from mtp_bindings.benchmark.costs import _memory_worker; "
            "print('@@' + json.dumps(_memory_worker(sys.argv[1], sys.argv[2], int(sys.argv[3]))))")
    r = subprocess.run([sys.executable, "-c", code, str(target.resolve()), str(assistant.resolve()), str(threads)],
                       capture_output=True, text=True, timeout=900, cwd=tempfile.gettempdir())
    for line in r.stdout.splitlines():
        if line.startswith("@@"):
            return json.loads(line[2:])
    return {"error": f"memory worker failed ({r.returncode}): {r.stderr[-2000:]}"}


def _try_draft_subprocess(target: Path, assistant: Path, threads: int) -> dict[str, Any]:
    """One MTP draft in a fresh process (a native abort must not take the benchmark down)."""
    code = ("import sys; from mtp_bindings import Model; m = Model(sys.argv[1], assistant=sys.argv[2]); "
            "c = m.create_context(n_ctx=512, n_threads=int(sys.argv[3]), flash_attn='off', embeddings=True); "
            "c.decode(list(range(10, 42)), pos=0); "
            "print('drafts', c.decode_mtp(attn_pos=31, last_token=12, h_prev=c.get_embeddings(-1), n_steps=2)[0])")
    try:
        r = subprocess.run([sys.executable, "-c", code, str(target), str(assistant), str(threads)], capture_output=True,
                           text=True, timeout=600, cwd=tempfile.gettempdir(), env={**os.environ, "GGML_NO_BACKTRACE": "1"})
    except subprocess.TimeoutExpired:
        return {"ok": False, "error": "timed out"}
    if r.returncode == 0 and "drafts" in r.stdout:
        return {"ok": True}
    why = next((line.strip() for line in r.stderr.splitlines() if "GGML_ASSERT" in line or "error" in line.lower()),
               r.stderr.strip().splitlines()[-1] if r.stderr.strip() else f"exit {r.returncode}")
    return {"ok": False, "returncode": r.returncode, "error": why}


def run_cost(cfg: BenchConfig, log_dir: Path, acceptance: dict[str, Any] | None) -> dict[str, Any]:
    """The cost part. Weight layouts: llama.cpp's default (``repack``: extra buffer types, AMX on
    this kind of CPU) and ``no-repack``; the centroid head runs only without repacking (with it,
    libllama aborts: reported in ``centroid_repack``)."""
    from ..api import Model

    shape = SHAPES[cfg.cost_shape]
    paths = build_cost_models(cfg)
    res: dict[str, Any] = {"shape": asdict(shape), "files": {k: str(v) for k, v in paths.items()},
                           "file_mib": {k: v.stat().st_size / 2**20 for k, v in paths.items()}}
    meter = CpuMeter()
    meter.begin()
    steps = (1, 2, 3, 4)
    n_prompt = 128 if cfg.mode != "smoke" else 32
    rounds = cfg.cost_rounds if cfg.mode != "smoke" else 2

    log("cost: does the centroid head run with repacked weights? (subprocess)")
    res["centroid_repack"] = _try_draft_subprocess(paths["target"], paths["centroid"], cfg.threads)
    log("cost: our draft steps (dense vs centroid head; repack and no-repack)")
    models: dict[str, Any] = {}
    try:
        # repack: llama.cpp's default weight layouts (AMX / repacked); no-repack: llama-server's --no-repack
        models["dense"] = Model(paths["target"], assistant=paths["dense"])
        if res["centroid_repack"]["ok"]:
            models["centroid"] = Model(paths["target"], assistant=paths["centroid"])
        models["dense no-repack"] = Model(paths["target"], assistant=paths["dense"], repack=False)
        models["centroid no-repack"] = Model(paths["target"], assistant=paths["centroid"], repack=False)
        res["draft_ours"] = measure_draft_steps(models, threads=cfg.threads, n_prompt=n_prompt, steps=steps,
                                                rounds=max(rounds, 3))
        log("cost: verify 1..5 tokens")
        res["verify"] = measure_verify(models["dense"], threads=cfg.threads, n_prompt=n_prompt, ns=(1, 2, 3, 4, 5),
                                       rounds=max(rounds, 3))
        res["verify_no_repack"] = measure_verify(models["dense no-repack"], threads=cfg.threads, n_prompt=n_prompt,
                                                 ns=(1, 2, 3, 4, 5), rounds=max(rounds, 3))
        log(f"cost: Python driver time per round ({shape.name} shape)")
        rng = np.random.default_rng(2)
        prompt = rng.integers(10, 1000, size=32).tolist()
        n_drv = 24 if cfg.mode != "smoke" else 8
        res["driver_e2b"] = {k: driver_overhead(models[k], prompt, threads=cfg.threads, n_out=n_drv, draft_ns=(2,),
                                                temps=(0.0,), runs=1 if cfg.mode != "full" else 2)
                             for k in ("dense", "centroid no-repack")}
    finally:
        for m in models.values():
            m.close()

    log("cost: prompt processing with/without the assistant (ours)")
    n_pp = 512 if cfg.mode != "smoke" else 64
    res["pp_ours"] = measure_prompt_processing(paths["target"], paths["dense"], threads=cfg.threads, n_prompt=n_pp,
                                               rounds=max(rounds, 3))
    log("cost: upstream draft-mtp (draft steps, prompt processing, memory)")
    try:
        res["upstream"] = upstream_costs(cfg, paths, log_dir, n_prompt=n_pp)
    except Exception as e:  # keep the rest of the results
        res["upstream"] = {"error": f"{type(e).__name__}: {e}"}
        log(f"cost: upstream part failed: {e}")
    log("cost: memory of attaching an assistant (ours)")
    res["memory_ours"] = measure_memory_ours(paths["target"], paths["dense"], cfg.threads)
    n_vocab, n_bb = shape.vocab, shape.hidden
    res["bytes_per_draft_step"] = {
        "ours": 4 + 4 * n_bb,
        "upstream_cpu_sampling": 4 * n_vocab + 4 * n_bb,
        "upstream_backend_topk10": 4 + 2 * 4 * 10 + 4 * n_bb,
        "note": "ours: the argmax token (4 B) and the next h (4*n_embd_backbone) per step (patch 0003); upstream "
                "reads the [n_vocab] logits row (4*n_vocab) and the h row per step, or with its default backend "
                "sampling (top-k 10 in the graph) the sampled token and 10 candidates/logits; computed from the "
                "code paths, not measured",
    }
    res["noise"] = meter.end()
    return res
