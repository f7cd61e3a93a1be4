"""Part 3, upstream's side: the costs of llama-server's own draft-mtp, read from its logs.

One job: run upstream's server (one per draft count and weight layout, one at a time) and read its
draft time per call and step (``dur(b,g,a)`` with ``-v``), its prompt processing with and without
``-md``, its RSS and the buffer sizes llama.cpp logs (:func:`logged_buffers`, which ours' memory
measurement in :mod:`.costs` reads too).
"""

from __future__ import annotations

import random
import re
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from .config import BenchConfig
from .util import ServerProcess, free_port, median, rss_bytes, upstream_argv


_STATS_RE = re.compile(r"statistics\s+draft-mtp: #calls\(b,g,a\) =\s*(\d+)\s+(\d+)\s+(\d+), #gen drafts =\s*(\d+), "
                       r"#acc drafts =\s*(\d+), #gen tokens =\s*(\d+), #acc tokens =\s*(\d+).*?"
                       r"dur\(b,g,a\) = ([\d.]+), ([\d.]+), ([\d.]+) ms")
_BUF_RE = re.compile(r"(\w+):\s+(\S+)\s+((?:MTP )?(?:model|KV|compute|output|RS)) buffer size =\s+([\d.]+) MiB")


def _parse_spec_stats(log_text: str) -> list[list[float]]:
    return [[float(x) for x in m] for m in _STATS_RE.findall(log_text)]


def logged_buffers(log_text: str) -> list[dict[str, Any]]:
    """The buffer sizes llama.cpp logged (the 0-MiB lines of its memory-fitting dry run left out)."""
    return [{"where": a, "buffer": b, "kind": c, "mib": float(d)} for a, b, c, d in _BUF_RE.findall(log_text)
            if float(d) > 0.0]


def upstream_draft_times(cfg: BenchConfig, target: Path, assistant: Path, log_dir: Path, *, steps: Sequence[int],
                         prompt: list[int], extra: Sequence[str] = (), memory: dict[str, Any] | None = None) -> dict[str, Any]:
    """Upstream's draft time per call and per step from its own counters (``dur(b,g,a)`` with
    ``-v``): one server per n_max, one at a time; a warm-up request, then up to 3 timed requests,
    the best one kept. With random weights every draft is rejected, so each round drafts n
    tokens. ``memory``: filled with the buffers the last server logged."""
    out: dict[str, Any] = {}
    for n in steps:
        port = free_port()
        name = f"upstream-draft-{target.stem}-{n}{'-' + '_'.join(x.strip('-') for x in extra if x.startswith('--')) if extra else ''}"
        srv = ServerProcess(name, upstream_argv(target, port, threads=cfg.threads, n_ctx=1024, kv="f16",
                                                assistant=assistant, draft_n=n, verbose=True, extra=list(extra)),
                            port, log_dir)
        deltas = []
        try:
            srv.wait_ready()
            body = {"prompt": prompt, "n_predict": cfg.upstream_steps_tokens, "temperature": 0.0, "cache_prompt": False}
            srv.client.request("POST", "/completion", body)
            time.sleep(0.3)
            for _ in range(max(1, min(cfg.cost_rounds, 3))):
                before = _parse_spec_stats(srv.log_text())
                srv.client.request("POST", "/completion", body)
                time.sleep(0.3)
                after = _parse_spec_stats(srv.log_text())
                if after and len(after) > len(before):
                    prev = before[-1] if before else [0.0] * 10
                    deltas.append([c - p for c, p in zip(after[-1], prev)])
        finally:
            srv.stop()
        if memory is not None and n == max(steps):
            # the buffers llama.cpp logged (-v): the target's, then the draft model's and its context's
            text = srv.log_text()
            cut = text.find("loading draft model")
            memory["buffers_target"] = logged_buffers(text[:cut] if cut >= 0 else text)
            memory["buffers_draft"] = logged_buffers(text[cut:]) if cut >= 0 else []
        deltas = [d for d in deltas if d[1] > 0 and d[5] > 0]
        if not deltas:
            out[str(n)] = {"error": "no statistics line in llama-server's log"}
            continue
        d = min(deltas, key=lambda d: d[8] / d[1])  # best request (least disturbed), as for ours
        calls, gen_tokens, t_draft_ms = d[1], d[5], d[8]
        out[str(n)] = {"calls": calls, "gen_tokens": gen_tokens, "t_draft_ms": t_draft_ms,
                       "ms_per_call": t_draft_ms / calls, "ms_per_step": t_draft_ms / gen_tokens,
                       "ms_per_call_all": [x[8] / x[1] for x in deltas], "acceptance": d[6] / gen_tokens}
    return out


def upstream_costs(cfg: BenchConfig, paths: dict[str, Path], log_dir: Path, *, n_prompt: int) -> dict[str, Any]:
    """Upstream's draft-mtp on the dense assistant: draft time per step from its own counters
    (``dur(b,g,a)`` with ``-v``; one server per n_max and weight layout, one at a time), prompt
    processing with and without ``-md`` (interleaved), server RSS and its buffer sizes (the
    second context's included)."""
    from ..api import Model

    with Model(paths["target"], vocab_only=True) as m:
        rng = np.random.default_rng(3)
        pp_prompt = rng.integers(10, min(m.n_vocab, 1000), size=n_prompt).tolist()
        gen_prompt = pp_prompt[:64]
    out: dict[str, Any] = {"pp": {}, "memory": {}}
    steps = (1, 2, 3, 4) if cfg.mode != "smoke" else (2,)
    batch = ["-ub", str(n_prompt), "-b", str(n_prompt)]
    layouts: list[tuple[str, list[str]]] = [("draft", [])] + ([("draft_no_repack", ["--no-repack"])] if cfg.mode != "smoke" else [])
    for key, layout in layouts:
        out[key] = upstream_draft_times(cfg, paths["target"], paths["dense"], log_dir, steps=steps, prompt=gen_prompt,
                                        extra=batch + layout, memory=out["memory"] if key == "draft" else None)
    # prompt processing, plain vs draft-mtp (default layout), interleaved
    servers: dict[str, ServerProcess] = {}
    try:
        for k, assistant in (("without assistant", None), ("with assistant", paths["dense"])):
            port = free_port()
            servers[k] = ServerProcess(f"cost-upstream-pp-{k.split()[0]}", upstream_argv(
                paths["target"], port, threads=cfg.threads, n_ctx=1024, kv="f16", assistant=assistant,
                draft_n=max(steps), extra=batch), port, log_dir)
        for srv in servers.values():
            srv.wait_ready()
        body = {"prompt": pp_prompt, "n_predict": 1, "temperature": 0.0, "cache_prompt": False}
        for srv in servers.values():
            srv.client.request("POST", "/completion", body)
        pp: dict[str, list[float]] = {k: [] for k in servers}
        order = random.Random(1)
        for _ in range(max(cfg.cost_rounds, 3)):
            for k in order.sample(list(pp), 2):
                status, payload, _ = servers[k].client.request("POST", "/completion", body)
                pp[k].append(float(payload["timings"]["prompt_per_second"]))
        tps = {k: median(v) for k, v in pp.items()}
        out["pp"] = {"n_prompt": n_prompt, "tokens_per_s": tps, "tokens_per_s_all": pp,
                     "ratio_with_vs_without": tps["with assistant"] / tps["without assistant"]}
        for k, srv in servers.items():
            out["memory"][k] = {"rss_mib": rss_bytes(srv.pid) / 2**20}
    finally:
        for srv in servers.values():
            srv.stop()
    if "with assistant" in out["memory"] and "without assistant" in out["memory"]:
        out["memory"]["rss_delta_mib"] = (out["memory"]["with assistant"]["rss_mib"]
                                          - out["memory"]["without assistant"]["rss_mib"])
    return out
