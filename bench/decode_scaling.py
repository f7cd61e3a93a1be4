#!/usr/bin/env python3
"""Decode scaling on CPU: what does one decode of n = 1..8 tokens cost relative to n = 1?

Speculative decoding verifies k drafted tokens with one decode of k+1 tokens; on CPU that only pays
off when such a decode costs about as much as decoding one token (the weights are read once either
way). This tool measures it at real Gemma 4 widths:

1. ``build``: writes a Gemma 4 target of E2B width with random weights (hidden 1536, 4 layers
   [S, S, S, F], 8 heads, 1 KV head, head_dim 256, global head_dim 512, sliding window 512,
   FFN 6144, vocab 262144, tied embeddings) directly with gguf-py, as f16, then quantizes it to
   q8_0 and q4_K (``llama_model_quantize``, pure) through the package's own libllama (the writer:
   ``mtp_bindings.benchmark.models``). The tokenizer is the tiny test fixture's, padded with unused
   tokens to 262144.
2. ``decode``: for each weight type, times one ``ctx.decode(tokens, pos=P, logits="all")`` of
   n = 1..8 tokens through the project's Python API, and prompt processing of 512 tokens;
   configurations interleaved in rounds, medians reported, ratios taken within one process.
3. ``ggml``: the same per matrix shape through ggml alone, with the small C program
   ``bench/mulmat_bench.c`` (compiled here against the package's ggml headers and libraries;
   weights placed in the buffer type llama.cpp would pick, i.e. repacked/AMX where available).

Before/after comparisons in one run: ``--variant NAME=LIBDIR`` (repeatable) runs every measurement
once per variant, with ``LIBDIR/libggml-cpu.so`` preloaded in place of the package's (worker
processes, driven in alternation so that only one computes at a time).

Results go to ``bench/results/decode_scaling.json`` (a ``decode_scaling`` section) and a PNG plot.

Usage::

    python bench/decode_scaling.py                      # build (cached) + decode + ggml + plot
    python bench/decode_scaling.py --types f16 --rounds 5
    python bench/decode_scaling.py --variant upstream=/path/to/upstream/lib --variant patched=

An empty LIBDIR means the package's own libraries.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from mtp_bindings.benchmark.models import FTYPES, TARGET_SEED, Dims, quantize, write_f16_target
from mtp_bindings.config.threads import OPENMP_SPIN_COUNT

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "bench" / "results"
C_TOOL = REPO / "bench" / "mulmat_bench.c"
TOKENIZER_SOURCE = REPO / "tests" / "fixtures" / "dense-target.gguf"
DEFAULT_CACHE = Path(os.environ.get("MTP_BENCH_CACHE", Path.home() / ".cache" / "mtp-bindings" / "decode-scaling"))

E2B = Dims()  # Gemma 4 E2B widths (the text decoder), 4 layers: the model writer's defaults
TYPES = ("f16", "q8_0", "q4_K", "q4_K_M")  # q4_K_M: Q6_K LM head and part of ffn_down, as published files
SEED = TARGET_SEED


def write_results(out: Path, result: dict[str, Any], md: str) -> None:
    """A bench's results: ``out`` (JSON) and the markdown table beside it (``.md``), printed too."""
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    out.with_suffix(".md").write_text(md + "\n")
    print(md)


def log(msg: str) -> None:
    print(f"[decode_scaling] {msg}", file=sys.stderr, flush=True)


# ----------------------------------------------------------------------------------------------
# model files
# ----------------------------------------------------------------------------------------------


def matrix_shapes() -> list[tuple[str, int, int]]:
    """(name, rows, cols) of every matrix product of one decode, rows = output features (ne01)."""
    shapes = []
    d = E2B
    for i, swa in enumerate(d.layers):
        hd = d.head_dim if swa else d.global_head_dim
        shapes += [
            (f"blk.{i}.attn_q", d.heads * hd, d.hidden),
            (f"blk.{i}.attn_k", d.kv_heads * hd, d.hidden),
            (f"blk.{i}.attn_v", d.kv_heads * hd, d.hidden),
            (f"blk.{i}.attn_output", d.hidden, d.heads * hd),
            (f"blk.{i}.ffn_gate", d.ffn, d.hidden),
            (f"blk.{i}.ffn_up", d.ffn, d.hidden),
            (f"blk.{i}.ffn_down", d.hidden, d.ffn),
        ]
    shapes.append(("output", d.vocab, d.hidden))
    return shapes


def distinct_shapes() -> list[dict[str, Any]]:
    """The distinct (rows, cols) of one decode with how often each occurs."""
    seen: dict[tuple[int, int], dict[str, Any]] = {}
    for name, rows, cols in matrix_shapes():
        kind = name.split(".")[-1]
        entry = seen.setdefault((rows, cols), {"rows": rows, "cols": cols, "count": 0, "names": []})
        entry["count"] += 1
        if kind not in entry["names"]:
            entry["names"].append(kind)
    return list(seen.values())


def build_models(cache: Path, types: Sequence[str], threads: int) -> dict[str, Path]:
    cache.mkdir(parents=True, exist_ok=True)
    paths = {t: cache / f"e2b-width-{t}.gguf" for t in TYPES}
    if not paths["f16"].is_file():
        log(f"writing {paths['f16']}")
        write_f16_target(paths["f16"], E2B, SEED, TOKENIZER_SOURCE, name="Decode scaling target (E2B width, random)")
    for t in types:
        if not paths[t].is_file():
            log(f"quantizing {paths[t]}")
            tmp = paths[t].with_suffix(".tmp")
            quantize(paths["f16"], tmp, FTYPES[t], threads)
            tmp.rename(paths[t])
    return {t: paths[t] for t in types}


# ----------------------------------------------------------------------------------------------
# worker processes (one per weight type and variant): timed decodes on request
# ----------------------------------------------------------------------------------------------

PREFIX = 64  # tokens in the KV cache before every timed decode


def worker_main(model_path: str, threads: int) -> int:
    """Serve timing requests on stdin/stdout: one JSON line in, one JSON line out."""
    from mtp_bindings import Model

    model = Model(model_path)
    ctx = model.create_context(n_ctx=1024, n_batch=512, n_ubatch=512, n_threads=threads)
    rng = np.random.default_rng(SEED)
    tokens = rng.integers(10, 1000, size=512).astype(np.int32)

    def prefix() -> None:  # one token at a time: a build that cannot decode batches still starts
        ctx.seq_rm(0, 0, -1)
        for i in range(PREFIX):
            ctx.decode(tokens[i:i + 1], pos=i, logits="none")

    prefix()
    print(json.dumps({"ready": True, "n_vocab": model.n_vocab}), flush=True)
    for line in sys.stdin:
        req = json.loads(line)
        if req["cmd"] == "quit":
            break
        n = int(req["n"])
        if req["cmd"] == "decode":  # n tokens after the prefix, logits for all of them
            ctx.seq_rm(0, PREFIX, -1)
            c0, t0 = time.process_time(), time.perf_counter()
            ctx.decode(tokens[PREFIX:PREFIX + n], pos=PREFIX, logits="all")
            dt, dc = time.perf_counter() - t0, time.process_time() - c0
            out: dict[str, Any] = {"ms": dt * 1e3, "cpu_ms": dc * 1e3}
            if req.get("logits"):
                out["logits"] = ctx.get_logits_all().tolist()
        elif req["cmd"] == "pp":  # prompt processing: n tokens from position 0, last logits
            ctx.seq_rm(0, 0, -1)
            c0, t0 = time.process_time(), time.perf_counter()
            ctx.decode(tokens[:n], pos=0, logits="last")
            dt, dc = time.perf_counter() - t0, time.process_time() - c0
            if n >= PREFIX:
                ctx.seq_rm(0, PREFIX, -1)  # the first PREFIX tokens are the prefix again
            else:
                prefix()
            out = {"ms": dt * 1e3, "cpu_ms": dc * 1e3}
        else:
            out = {"error": f"unknown command {req['cmd']!r}"}
        print(json.dumps(out), flush=True)
    ctx.close()
    model.close()
    return 0


OMP_WAIT_POLICY = ""  # set by --omp-wait


def _variant_env(libdir: str) -> dict[str, str]:
    env = dict(os.environ)
    if OMP_WAIT_POLICY:
        # threads that wait at ggml's barriers (OpenMP) sleep instead of spinning: on a shared
        # machine a spinning thread takes the core from the one it waits for
        env["OMP_WAIT_POLICY"] = OMP_WAIT_POLICY
    if libdir:
        lib = Path(libdir) / "libggml-cpu.so"
        if not lib.exists():
            raise SystemExit(f"--variant: {lib} does not exist")
        env["LD_PRELOAD"] = str(lib.resolve())
        # the preloaded library loads libgomp before the package can set its spin count: set it here, or a
        # variant runs with libgomp's default spinning and the package's own build without (not comparable)
        env.setdefault("GOMP_SPINCOUNT", str(OPENMP_SPIN_COUNT))
    return env


class Worker:
    """This script in a child process (``args``: ``_worker MODEL THREADS`` or ``_mtp_worker THREADS``) with
    ``LIBDIR``'s ggml-cpu; one JSON line per request and answer."""

    def __init__(self, args: Sequence[str], libdir: str) -> None:
        self.proc = subprocess.Popen([sys.executable, __file__, *args], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True, env=_variant_env(libdir))
        ready = self._read()
        if not ready.get("ready"):
            raise RuntimeError(f"worker {' '.join(args)} failed to start: {ready}")

    def _read(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"worker exited with {self.proc.wait()}")
        return json.loads(line)

    def ask(self, **req: Any) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(req) + "\n")
        self.proc.stdin.flush()
        return self._read()

    def close(self) -> None:
        try:
            self.ask(cmd="quit")
        except (RuntimeError, BrokenPipeError, json.JSONDecodeError):
            pass
        self.proc.wait(timeout=60)

    def exit_reason(self) -> str:
        return _exit_reason(self.proc.wait(timeout=60))


def measure_decode(models: dict[str, Path], variants: dict[str, str], ns: Sequence[int], threads: int,
                   rounds: int, pp: int) -> dict[str, Any]:
    """Per weight type: median ms of decode(n) and of pp per variant, all interleaved in rounds.
    A configuration that crashes a variant's worker is recorded as such (and not retried); the
    worker is restarted for the others."""
    out: dict[str, Any] = {}
    for wtype, path in models.items():
        log(f"decode: {wtype} ({', '.join(variants)})")
        workers = {name: Worker(["_worker", str(path), str(threads)], libdir) for name, libdir in variants.items()}
        crashed: dict[str, dict[str, str]] = {v: {} for v in variants}

        def timed(v: str, cmd: str, n: int) -> tuple[float, float] | None:
            key = str(n) if cmd == "decode" else f"pp{n}"
            if key in crashed[v]:
                return None
            try:
                r = workers[v].ask(cmd=cmd, n=n)
                return float(r["ms"]), float(r["cpu_ms"])
            except (RuntimeError, BrokenPipeError):
                crashed[v][key] = workers[v].exit_reason()
                log(f"{wtype} {v}: {cmd} of {n} tokens {crashed[v][key]}")
                workers[v] = Worker(["_worker", str(path), str(threads)], variants[v])
                return None

        try:
            for v in variants:  # warm-up: page in the weights, first-call allocations
                for n in ns:
                    timed(v, "decode", n)
                if pp:
                    timed(v, "pp", pp)
            ms: dict[str, dict[str, list[float]]] = {v: {str(n): [] for n in ns} for v in variants}
            cpu: dict[str, dict[str, list[float]]] = {v: {str(n): [] for n in ns} for v in variants}
            pp_ms: dict[str, list[float]] = {v: [] for v in variants}
            pp_cpu: dict[str, list[float]] = {v: [] for v in variants}
            names = list(variants)
            for r in range(rounds):
                order = [(v, n) for n in ns for v in (names if r % 2 == 0 else names[::-1])]
                k = (r * 5) % len(order)
                for v, n in order[k:] + order[:k]:
                    t = timed(v, "decode", n)
                    if t is not None:
                        ms[v][str(n)].append(t[0])
                        cpu[v][str(n)].append(t[1])
                if pp:
                    for v in (names if r % 2 == 0 else names[::-1]):
                        t = timed(v, "pp", pp)
                        if t is not None:
                            pp_ms[v].append(t[0])
                            pp_cpu[v].append(t[1])
        finally:
            for w in workers.values():
                w.close()
        entry: dict[str, Any] = {}
        for v in variants:
            med = {n: (statistics.median(x) if x else None) for n, x in ms[v].items()}
            med_cpu = {n: (statistics.median(x) if x else None) for n, x in cpu[v].items()}
            entry[v] = {
                "decode_ms": med,
                "decode_min_ms": {n: (min(x) if x else None) for n, x in ms[v].items()},
                "ratio_to_n1": _ratios(med),
                "decode_cpu_ms": med_cpu,
                "cpu_ratio_to_n1": _ratios(med_cpu),
                "decode_ms_all": ms[v],
                "decode_cpu_ms_all": cpu[v],
            }
            if pp:
                entry[v]["pp_ms"] = statistics.median(pp_ms[v]) if pp_ms[v] else None
                entry[v]["pp_cpu_ms"] = statistics.median(pp_cpu[v]) if pp_cpu[v] else None
                entry[v]["pp_ms_all"] = pp_ms[v]
                entry[v]["pp_cpu_ms_all"] = pp_cpu[v]
            if crashed[v]:
                entry[v]["crashed"] = crashed[v]
        out[wtype] = entry
    return out


# ----------------------------------------------------------------------------------------------
# ggml alone: bench/mulmat_bench.c
# ----------------------------------------------------------------------------------------------


def _ratios(ms: dict[str, float | None]) -> dict[str, float | None]:
    base = ms.get("1")
    return {n: (None if v is None or not base else v / base) for n, v in ms.items()}


MTP_PROMPTS = (
    "Once upon a time, there was a little girl who",
    "The dog ran to the park and",
    "Tom and his mom went to the store to buy",
)


def mtp_worker_main(threads: int) -> int:
    """Serve generation requests with the bundled trained pair: one JSON line in, one JSON line out."""
    from mtp_bindings import Model
    from mtp_bindings.models import ASSISTANT as DEFAULT_ASSISTANT, TARGET as DEFAULT_TARGET

    model = Model(DEFAULT_TARGET)
    model.attach_assistant(DEFAULT_ASSISTANT)
    ctx = model.create_context(n_ctx=1024, embeddings=True, n_threads=threads)
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        req = json.loads(line)
        if req["cmd"] == "quit":
            break
        res = model.generate(req["prompt"], max_tokens=int(req["max_tokens"]), temperature=0.0,
                             draft_n_max=int(req["draft_n_max"]), ignore_eos=True, context=ctx)
        st = res.stats
        print(json.dumps({"tokens_per_s": st.tokens_per_second, "acceptance": st.acceptance_rate,
                          "tokens": list(res.tokens)}), flush=True)
    ctx.close()
    model.close()
    return 0


def measure_mtp(variants: dict[str, str], drafts: Sequence[int], threads: int, rounds: int,
                max_tokens: int) -> dict[str, Any]:
    """The trained pair's throughput (temperature 0) per variant and draft_n_max (0 = plain), interleaved."""
    workers = {name: Worker(["_mtp_worker", str(threads)], libdir) for name, libdir in variants.items()}
    tps: dict[str, dict[int, list[float]]] = {v: {k: [] for k in drafts} for v in variants}
    acc: dict[str, dict[int, float]] = {v: {} for v in variants}
    outputs: dict[int, set[tuple[int, ...]]] = {k: set() for k in range(len(MTP_PROMPTS))}
    try:
        for r in range(rounds):
            log(f"mtp: round {r + 1}/{rounds}")
            for pi, prompt in enumerate(MTP_PROMPTS):
                for k in drafts:
                    for name, w in workers.items():
                        out = w.ask(cmd="gen", prompt=prompt, max_tokens=max_tokens, draft_n_max=k)
                        tps[name][k].append(out["tokens_per_s"])
                        acc[name][k] = out["acceptance"]
                        outputs[pi].add(tuple(out["tokens"]))
    finally:
        for w in workers.values():
            w.close()
    res: dict[str, Any] = {"max_tokens": max_tokens, "prompts": len(MTP_PROMPTS), "rounds": rounds,
                           "outputs_identical": all(len(v) == 1 for v in outputs.values()), "variants": {}}
    for name in variants:
        med = {str(k): statistics.median(tps[name][k]) for k in drafts}
        res["variants"][name] = {
            "tokens_per_s": med,
            "speedup_vs_plain": {str(k): med[str(k)] / med["0"] for k in drafts if k} if 0 in drafts else {},
            "acceptance": {str(k): acc[name][k] for k in drafts if k},
        }
    return res


def build_c_tool(out_dir: Path) -> Path:
    from mtp_bindings.low_level import include_dir, library_dir

    exe = out_dir / "mulmat_bench"
    if exe.exists() and exe.stat().st_mtime >= C_TOOL.stat().st_mtime:
        return exe
    cc = os.environ.get("CC", "cc")
    cmd = [cc, "-O2", "-std=c11", str(C_TOOL), f"-I{include_dir()}", f"-L{library_dir()}",
           f"-Wl,-rpath,{library_dir()}", "-lggml", "-lggml-base", "-lggml-cpu", "-lm", "-o", str(exe)]
    subprocess.run(cmd, check=True)
    return exe


def run_c_tool(exe: Path, wtype: str, shapes: Sequence[tuple[int, int]], ns: Sequence[int], threads: int,
               rounds: int, libdir: str = "", check: bool = False, plain: bool = False) -> dict[str, Any]:
    cmd = [str(exe), "--type", wtype, "--n", ",".join(map(str, ns)), "--threads", str(threads),
           "--rounds", str(rounds)]
    for rows, cols in shapes:
        cmd += ["--shape", f"{rows}x{cols}"]
    if check:
        cmd.append("--check")
    if plain:
        cmd.append("--plain")
    res = subprocess.run(cmd, capture_output=True, text=True, env=_variant_env(libdir))
    if res.returncode in (0, 1):
        data = json.loads(res.stdout)
        data["ok"] = res.returncode == 0
        return data
    if len(ns) == 1:  # this configuration crashes: say so, and go on with the others
        why = _exit_reason(res.returncode)
        log(f"{wtype} n={ns[0]} {libdir or 'package'}: mulmat_bench {why}")
        return {"results": [{"rows": r, "cols": c, "n": ns[0], "buft": "?", "ms": [], "crashed": why}
                            for r, c in shapes], "ok": False}
    parts = [run_c_tool(exe, wtype, shapes, [n], threads, rounds, libdir, check, plain) for n in ns]
    return {"results": [r for p in parts for r in p["results"]], "ok": all(p["ok"] for p in parts)}


def _exit_reason(rc: int) -> str:
    import signal

    if rc < 0:
        try:
            return f"crashed ({signal.Signals(-rc).name})"
        except ValueError:
            return f"crashed (signal {-rc})"
    return f"failed (exit {rc})"


def measure_ggml(exe: Path, types: Sequence[str], variants: dict[str, str], ns: Sequence[int], threads: int,
                 rounds: int, repeats: int) -> dict[str, Any]:
    """Per weight type and distinct shape: median ms of W x X[n] per variant (processes alternated)."""
    shapes = [(s["rows"], s["cols"]) for s in distinct_shapes()]
    out: dict[str, Any] = {}
    for wtype in types:
        log(f"ggml: {wtype} ({', '.join(variants)})")
        runs: dict[str, list[dict[str, Any]]] = {v: [] for v in variants}
        names = list(variants)
        for rep in range(repeats):
            for v in (names if rep % 2 == 0 else names[::-1]):
                runs[v].append(run_c_tool(exe, wtype, shapes, ns, threads, rounds, variants[v]))
        entry: dict[str, Any] = {}
        for v in variants:
            per_shape: dict[str, Any] = {}
            crashed: dict[str, str] = {}
            for s in distinct_shapes():
                key = f"{s['rows']}x{s['cols']}"
                ms: dict[str, float | None] = {}
                cpu: dict[str, float | None] = {}
                for n in ns:
                    rs = [r for run in runs[v] for r in run["results"]
                          if r["rows"] == s["rows"] and r["cols"] == s["cols"] and r["n"] == n]
                    xs = [x for r in rs for x in r["ms"]]
                    ms[str(n)] = statistics.median(xs) if xs else None
                    cs = [r["median_cpu_ms"] for r in rs if "median_cpu_ms" in r]
                    cpu[str(n)] = statistics.median(cs) if cs else None
                    for r in rs:
                        if "crashed" in r:
                            crashed[str(n)] = r["crashed"]
                buft = next((r["buft"] for run in runs[v] for r in run["results"]
                             if r["rows"] == s["rows"] and r["cols"] == s["cols"] and r["buft"] != "?"), "?")
                per_shape[key] = {"rows": s["rows"], "cols": s["cols"], "count": s["count"], "names": s["names"],
                                  "buft": buft, "ms": ms, "ratio_to_n1": _ratios(ms), "cpu_ms": cpu,
                                  "cpu_ratio_to_n1": _ratios(cpu)}

            # one decode's worth of matrix products: every shape weighted by how often it occurs
            def total(key: str) -> dict[str, float | None]:
                return {str(n): (None if any(p[key][str(n)] is None for p in per_shape.values())
                                 else sum(p[key][str(n)] * p["count"] for p in per_shape.values())) for n in ns}

            entry[v] = {"shapes": per_shape, "sum_ms": total("ms"), "sum_ratio_to_n1": _ratios(total("ms")),
                        "sum_cpu_ms": total("cpu_ms"), "sum_cpu_ratio_to_n1": _ratios(total("cpu_ms"))}
            if crashed:
                entry[v]["crashed"] = crashed
        out[wtype] = entry
    return out


# ----------------------------------------------------------------------------------------------
# report
# ----------------------------------------------------------------------------------------------


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sec = result["decode_scaling"]
    panels = [("decode", "ratio_to_n1", "llama_decode via the Python API, wall clock"),
              ("decode", "cpu_ratio_to_n1", "llama_decode via the Python API, process CPU time"),
              ("ggml", "sum_ratio_to_n1", "ggml: one decode's matrix products, wall clock"),
              ("ggml", "sum_cpu_ratio_to_n1", "ggml: one decode's matrix products, process CPU time")]
    fig, axes = plt.subplots(2, 2, figsize=(13, 9))
    colors = {"f16": "tab:blue", "q8_0": "tab:orange", "q4_K": "tab:green"}
    styles = ["--", ":", "-"]
    for ax, (kind, key, title) in zip(axes.flat, panels):
        data = sec.get(kind)
        if not data:
            ax.set_visible(False)
            continue
        for t, entry in data.items():
            names = list(entry)
            for i, (v, e) in enumerate(entry.items()):
                ratios = e.get(key) or {}
                ns = [int(n) for n in ratios if ratios[n] is not None]
                if len(ns) < 2:
                    continue
                ax.plot(ns, [ratios[str(n)] for n in ns], marker="o", markersize=3, color=colors.get(t),
                        linestyle=styles[(i - len(names)) % len(styles)], label=f"{t} {v}")
        ax.axhline(1.3, color="grey", linewidth=0.8, linestyle=":")
        ax.set_xlabel("tokens per decode (n)")
        ax.set_ylabel("time / time(n=1)")
        ax.set_title(title, fontsize=9)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=6)
    meta = sec["meta"]
    fig.suptitle(f"Gemma 4 E2B width, random weights, {meta['threads']} threads, {meta['cpu']} "
                 f"(dotted line: 1.3)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def table(result: dict[str, Any]) -> str:
    sec = result["decode_scaling"]
    lines = []
    if "decode" in sec:
        for clock, key, rkey, pkey in (("wall clock", "decode_ms", "ratio_to_n1", "pp_ms"),
                                       ("process CPU time", "decode_cpu_ms", "cpu_ratio_to_n1", "pp_cpu_ms")):
            pps = sorted({str(m.get("pp")) for m in sec.get("decode_meta", {}).values() if isinstance(m, dict)})
            lines.append(f"decode (Python API), {clock}: median ms at n=1, t(n)/t(1) for n=2..8, "
                         f"pp{'/'.join(pps)} ms")
            for t, entry in sec["decode"].items():
                for v, e in entry.items():
                    if key not in e:
                        continue
                    r = e[rkey]
                    pp = f"  pp={_fmt(e.get(pkey), '.0f')}" if pkey in e else ""
                    lines.append(f"  {t:5s} {v:16s} n1={_fmt(e[key]['1'], '7.1f')}  " +
                                 " ".join(_fmt(r[n], ".2f") for n in r if n != "1") + pp)
    if "ggml" in sec:
        for clock, key, rkey in (("wall clock", "sum_ms", "sum_ratio_to_n1"),
                                 ("process CPU time", "sum_cpu_ms", "sum_cpu_ratio_to_n1")):
            lines.append(f"ggml alone (sum over one decode's products), {clock}: ms at n=1, ratios for n=2..8")
            for t, entry in sec["ggml"].items():
                for v, e in entry.items():
                    if key not in e:
                        continue
                    r = e[rkey]
                    lines.append(f"  {t:5s} {v:16s} n1={_fmt(e[key]['1'], '7.2f')}  " +
                                 " ".join(_fmt(r[n], ".2f") for n in r if n != "1"))
    if "mtp" in sec:
        m = sec["mtp"]
        lines.append(f"trained pair, temperature 0, {m['max_tokens']} tokens x {m['prompts']} prompts x "
                     f"{m['rounds']} rounds: median tokens/s (plain, draft_n_max 1, 3), MTP speedup over plain; "
                     f"outputs identical: {'yes' if m['outputs_identical'] else 'NO'}")
        for v, e in m["variants"].items():
            tps, sp = e["tokens_per_s"], e["speedup_vs_plain"]
            lines.append(f"  {v:16s} " + " ".join(_fmt(tps[k], "7.0f") for k in tps) + "   x" +
                         " x".join(_fmt(sp[k], ".2f") for k in sp) +
                         "   acceptance " + " ".join(_fmt(a, ".2f") for a in e["acceptance"].values()))
    lines.append("(x: crashed)")
    return "\n".join(lines)


def _fmt(v: float | None, spec: str) -> str:
    return "x" if v is None else format(v, spec)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("what", nargs="*", default=["decode", "ggml"], choices=["build", "decode", "ggml", "mtp"],
                   help="what to run (default: decode and ggml; both build the models first; mtp: the bundled "
                   "trained pair's generation throughput per variant)")
    p.add_argument("--types", nargs="+", default=list(TYPES), choices=TYPES)
    p.add_argument("--n-max", type=int, default=8)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=7, help="decode: interleaved rounds (default 7)")
    p.add_argument("--pp", type=int, default=512, help="prompt-processing length timed too (0: none)")
    p.add_argument("--ggml-rounds", type=int, default=5)
    p.add_argument("--ggml-repeats", type=int, default=2, help="processes per variant, alternated")
    p.add_argument("--mtp-rounds", type=int, default=3, help="mtp: interleaved rounds (default 3)")
    p.add_argument("--mtp-tokens", type=int, default=256, help="mtp: tokens generated per request")
    p.add_argument("--variant", action="append", default=[], metavar="NAME=LIBDIR",
                   help="compare libggml-cpu.so builds (LIBDIR empty: the package's own)")
    p.add_argument("--omp-wait", default="", help="OMP_WAIT_POLICY of the measured processes "
                   "(default '': the environment as it is, i.e. the package's threading default)")
    p.add_argument("--cache", type=Path, default=DEFAULT_CACHE, help=f"model files (default {DEFAULT_CACHE})")
    p.add_argument("--out", type=Path, default=RESULTS / "decode_scaling.json")
    p.add_argument("--plot", type=lambda v: Path(v) if v else None, default=RESULTS / "decode_scaling.png",
                   help="PNG plot ('' for none)")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    if argv is None and len(sys.argv) > 1 and sys.argv[1] == "_worker":
        return worker_main(sys.argv[2], int(sys.argv[3]))
    if argv is None and len(sys.argv) > 1 and sys.argv[1] == "_mtp_worker":
        return mtp_worker_main(int(sys.argv[2]))
    args = parse_args(argv)
    global OMP_WAIT_POLICY
    OMP_WAIT_POLICY = args.omp_wait
    variants: dict[str, str] = {}
    for spec in args.variant or ["package="]:
        name, _, libdir = spec.partition("=")
        variants[name] = libdir
    ns = list(range(1, args.n_max + 1))
    models = build_models(args.cache, args.types, args.threads)
    if args.what == ["build"]:
        return 0

    result: dict[str, Any] = {}
    if args.out.exists():
        try:
            result = json.loads(args.out.read_text())
        except json.JSONDecodeError:
            result = {}
    sec: dict[str, Any] = result.get("decode_scaling", {})  # a part not run this time is kept
    meta = {
            "cpu": _cpu_name(), "cores": os.cpu_count(), "threads": args.threads, "pp": args.pp,
            "rounds": args.rounds, "ggml_rounds": args.ggml_rounds, "ggml_repeats": args.ggml_repeats,
            "variants": variants, "date": time.strftime("%Y-%m-%d %H:%M:%S"),
            "load_average": os.getloadavg(), "omp_wait_policy": args.omp_wait,
    }
    sec.update({
        "meta": {
            "cpu": _cpu_name(), "cores": os.cpu_count(), "threads": args.threads,
            "python": platform.python_version(),
            "model": {**dataclasses.asdict(E2B), "layers": ["S" if s else "F" for s in E2B.layers]},
            "note": "medians of interleaved runs; ratios within one process; the machine may be shared",
        },
        "shapes": distinct_shapes(),
    })
    if "decode" in args.what:
        # per weight type: a type not measured this time keeps its earlier result (and meta)
        sec.setdefault("decode", {}).update(measure_decode(models, variants, ns, args.threads, args.rounds, args.pp))
        sec.setdefault("decode_meta", {}).update({t: meta for t in args.types})
    if "ggml" in args.what:
        exe = build_c_tool(args.cache)
        sec.setdefault("ggml", {}).update(
            measure_ggml(exe, args.types, variants, ns, args.threads, args.ggml_rounds, args.ggml_repeats))
        sec.setdefault("ggml_meta", {}).update({t: meta for t in args.types})
    if "mtp" in args.what:
        sec["mtp"] = measure_mtp(variants, [0, 1, 3], args.threads, args.mtp_rounds, args.mtp_tokens)
        sec["mtp_meta"] = meta
    result["decode_scaling"] = sec
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(table(result))
    if args.plot:
        plot(result, args.plot)
        log(f"wrote {args.out} and {args.plot}")
    else:
        log(f"wrote {args.out}")
    return 0


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


if __name__ == "__main__":
    sys.exit(main())
