"""The run: every part in order, results written as they come."""

from __future__ import annotations

import contextlib
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from .config import BenchConfig, kv_setup_name, llama_server_path, log
from .costs import measure_draft_steps, measure_verify, run_cost
from .upstream_costs import upstream_draft_times
from .driver_time import driver_overhead, profile_driver, py_spy_driver_profile
from .matrix import MatrixRunner, eog_bias
from .samples import Sample, aggregate, identity_check, noise_summary
from .report import make_plots, write_report
from .speedup import expected_speedup
from .targets import targets



_OMP_AB_SCRIPT = """
import json, sys, time
from mtp_bindings import Model
m = Model(sys.argv[1], assistant=sys.argv[2])
ctx = m.create_context(n_ctx=1024, n_threads=int(sys.argv[3]), flash_attn="off", embeddings=True)
ctx.decode(list(range(10, 42)), pos=0)
h = ctx.get_embeddings(-1)
def best(f, n=200):
    f()
    ts = []
    for _ in range(n):
        t0 = time.perf_counter(); f(); ts.append(time.perf_counter() - t0)
    ts.sort()
    return ts[0] * 1e3
def dec1():
    ctx.seq_rm(0, 32, -1); ctx.decode([11], pos=32)
def dec3():
    ctx.seq_rm(0, 32, -1); ctx.decode([11, 12, 13], pos=32, logits="all")
r = {"decode 1 token": best(dec1), "decode 3 tokens": best(dec3)}
ctx.seq_rm(0, 32, -1)
r["draft 1 step"] = best(lambda: ctx.decode_mtp(attn_pos=31, last_token=12, h_prev=h, n_steps=1))
r["draft 4 steps"] = best(lambda: ctx.decode_mtp(attn_pos=31, last_token=12, h_prev=h, n_steps=4))
print("@@" + json.dumps(r))
"""


def omp_policy_ab(target: Path, assistant: Path, threads: int) -> list[dict[str, Any]]:
    """Best-of-200 latency (ms) of small graphs under each OMP_WAIT_POLICY and 1 vs ``threads``
    threads: what the passive policy used for the matrix costs when nothing else runs."""
    rows = []
    for policy in ("active", "passive"):
        for nt in sorted({1, threads}):
            env = {**os.environ, "OMP_WAIT_POLICY": policy}
            try:
                r = subprocess.run([sys.executable, "-c", _OMP_AB_SCRIPT, str(target), str(assistant), str(nt)],
                                   capture_output=True, text=True, timeout=300, env=env, cwd=tempfile.gettempdir())
                line = next((x for x in r.stdout.splitlines() if x.startswith("@@")), None)
                rows.append({"policy": policy, "threads": nt, **(json.loads(line[2:]) if line else {"error": r.stderr[-300:]})})
            except subprocess.SubprocessError as e:
                rows.append({"policy": policy, "threads": nt, "error": str(e)})
    return rows


def _trained_costs(cfg: BenchConfig, log_dir: Path) -> dict[str, Any]:
    """Draft step and verify costs of the matrix's own pair (for its expected speedup), and
    upstream's draft time on it."""
    from ..api import Model

    with Model(cfg.target, assistant=cfg.assistant) as m:
        d = measure_draft_steps({"dense": m}, threads=cfg.threads, n_prompt=32, steps=(1, 2, 3, 4),
                                rounds=max(cfg.cost_rounds, 5), calls=8)
        v = measure_verify(m, threads=cfg.threads, n_prompt=32, ns=(1, 2, 3, 4, 5), rounds=max(cfg.cost_rounds, 5))
        prompt = m.tokenize(cfg.prompt)
    out = {"draft": d["dense"], "verify": v}
    out["omp_policy"] = omp_policy_ab(cfg.target, cfg.assistant, cfg.threads)
    try:
        out["upstream_draft"] = upstream_draft_times(cfg, cfg.target, cfg.assistant, log_dir,
                                                     steps=cfg.draft_ns or (2,), prompt=prompt)
    except Exception as e:
        out["upstream_draft"] = {"error": f"{type(e).__name__}: {e}"}
    return out


def speedup_table(result: dict[str, Any], cfg: BenchConfig) -> dict[str, Any]:
    rows = result.get("inproc", {}).get("rows", [])
    drv = {(r["config"], r["draft_n"]): r["driver_us_per_round"] * 1e-6
           for r in result.get("driver", {}).get("rows", []) if r["temp"] == 0.0}
    out_rows = []
    kv, n_out = kv_setup_name(cfg.kv_types[0]), max(cfg.outputs)  # the tiny pair's first setup

    def cell(fam: str, k: int) -> dict[str, Any] | None:
        return next((r for r in rows if r["family"] == fam and r["draft_n"] == k and r["kv"] == kv
                     and r["n_out"] == n_out and r["temp"] == 0.0), None)

    tc = result.get("trained_costs")
    cost: dict[str, Any] = result.get("cost") or {}
    for k in cfg.draft_ns:
        d2, sync = cell("ours MTP depth2 on", k), cell("ours MTP depth2 off", k)
        if not d2 or d2["acceptance"] is None:
            continue
        a = d2["acceptance"]
        models = []
        if tc:
            models.append(("matrix pair", tc["draft"]["ms_per_step_slope"] / 1e3,
                           {int(n): ms / 1e3 for n, ms in tc["verify"]["ms_with_readback"].items()}, True))
        dd = cost.get("draft_ours", {})
        for dk, vk, name in (("dense", "verify", "E2B dense head, repack"),
                             ("centroid", "verify", "E2B centroid head, repack"),
                             ("dense no-repack", "verify_no_repack", "E2B dense head, no-repack"),
                             ("centroid no-repack", "verify_no_repack", "E2B centroid head, no-repack")):
            if dk in dd and cost.get(vk):
                models.append((name, dd[dk]["ms_per_step_slope"] / 1e3,
                               {int(n): ms / 1e3 for n, ms in cost[vk]["ms_with_readback"].items()}, False))
        drv_e2b: dict[str, float] = {}
        for rr in (cost or {}).get("driver_e2b", {}).get("dense", []):
            drv_e2b[rr["config"]] = rr["driver_us_per_round"] * 1e-6
        for name, td, tv, measured in models:
            t_round = drv.get(("mtp depth2 on", k), 0.0) if measured else drv_e2b.get("mtp depth2 on", 0.0)
            t_plain = drv.get(("plain", 0), 0.0) if measured else drv_e2b.get("plain", 0.0)
            e = expected_speedup(a, k, max(td, 0.0), tv, t_driver_round=t_round, t_driver_plain=t_plain)
            em = expected_speedup(a, k, max(td, 0.0), tv, t_driver_round=t_round, t_driver_plain=t_plain,
                                  tokens_per_round=d2["mean_tokens_per_round"]) if d2["mean_tokens_per_round"] else None
            row = {"model": name, "k": k, "a": a, "E_iid": e["E_tokens_per_round"], "E_measured": d2["mean_tokens_per_round"],
                   "c": e["c"], "leviathan": e["leviathan"], "with_verify_and_driver": e["with_verify_and_driver"],
                   "with_measured_E": em["with_verify_and_driver"] if em else None}
            if measured:
                row["measured_d2"] = d2["vs_ours_plain"]
                row["measured_sync"] = sync["vs_ours_plain"] if sync else None
            out_rows.append(row)
    formula = ("Expected speedup over plain decoding S(k) = E(k) * (T_v(1) + t_py,plain) / (k * t_d + T_v(k+1) + t_py,round), "
               "with E(k) the expected tokens per round: Leviathan et al.'s E(k) = (1 - a^(k+1)) / (1 - a) for i.i.d. "
               "acceptance a (= accepted/drafted, measured at temperature 0, KV "
               f"{kv}, {n_out} tokens, depth2 on), or the measured tokens per round of that cell (acceptance here is "
               "far from i.i.d.: repetitive text is accepted in runs); t_d = one draft step (slope of draft time over "
               "n_steps, best rounds), T_v(n) = target decode of n tokens with the logits read back, t_py = the driver's "
               "own time per round (matrix pair: measured per k; E2B: the k=2 figure). 'Leviathan S' is their own form "
               "E(k) / (k c + 1), c = t_d / T_v(1) (verify cost flat in n, no driver). E2B rows use the matrix pair's "
               "acceptance. Measured S = our tokens/s / our plain tokens/s in the same cell (median of runs).")
    return {"formula": formula, "rows": out_rows}


def _git_head() -> str | None:
    """The commit of the source checkout in the working directory, if any (what was installed)."""
    try:
        r = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=10)
        return r.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def _sha1(path: Path) -> str | None:
    import hashlib

    try:
        return hashlib.sha1(Path(path).read_bytes()).hexdigest()[:12]
    except OSError:
        return None


def _sample_json(s: Sample) -> dict[str, Any]:
    """A sample for the JSON: token ids and text replaced by their length and a short hash."""
    import hashlib

    d = asdict(s)
    toks, text = d.pop("tokens"), d.pop("text")
    d["tokens_sha1"] = hashlib.sha1(json.dumps(toks).encode()).hexdigest()[:12] if toks is not None else None
    d["text_sha1"] = hashlib.sha1(text.encode()).hexdigest()[:12] if text is not None else None
    d["text_head"] = text[:40] if text is not None else None
    return d


def machine_info() -> dict[str, Any]:
    cpu = platform.processor() or platform.machine()
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    return {"cpu": cpu, "cores": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform()}


MATRIX_KEYS = ("inproc", "http", "samples", "driver", "trained_costs")


def rerender(out_dir: Path) -> dict[str, Any]:
    """Rewrite ``bench.md`` and the plots from ``bench.json`` (no measurement)."""
    result = json.loads((out_dir / "bench.json").read_text())
    c = result["config"]
    fields: dict[str, Any] = {k: (Path(v) if k in ("target", "assistant", "out_dir", "cost_cache") else
                             tuple(v) if isinstance(v, list) else v) for k, v in c.items() if k in BenchConfig.__dataclass_fields__}
    cfg = BenchConfig(**fields)
    cfg.out_dir = out_dir
    result["speedup"] = speedup_table(result, cfg)
    result["targets"] = targets(result)
    if cfg.plots:
        result["plots"] = make_plots(result, out_dir)
    (out_dir / "bench.json").write_text(json.dumps(result, indent=1, default=str))
    write_report(result, out_dir)
    return result


def package_fingerprint() -> dict[str, Any]:
    """mtime + size of the installed package's native libraries and driver modules: the package
    is rebuilt by others while benchmarks run; a change mid-run is reported."""
    from .. import low_level

    pkg = Path(low_level.__file__).parent
    out = {}
    # the speculative loop lives in generation/ (every module there), on llama_context.py (its logits
    # reader: core/outputs.py) and mtp.py
    files = [*sorted(low_level.library_dir().glob("*.so")), llama_server_path(),
             pkg / "llama_context.py", pkg / "core" / "outputs.py", pkg / "mtp.py",
             *sorted((pkg / "generation").glob("*.py"))]
    for f in files:
        with contextlib.suppress(OSError):
            st = f.stat()
            name = f"{f.parent.name}/{f.name}" if f.parent.name in ("generation", "core") else f.name
            out[name] = [int(st.st_mtime), st.st_size]
    return out


def _finish(result: dict[str, Any], cfg: BenchConfig, t0: float) -> None:
    fp = package_fingerprint()
    if result.get("package_fingerprint") and fp != result["package_fingerprint"]:
        msg = "the installed package changed during this run (rebuilt by someone else): results mix two builds"
        if msg not in result["errors"]:
            result["errors"].append(msg)
            log(msg)
    result["speedup"] = speedup_table(result, cfg)
    result["targets"] = targets(result)
    result["wall_s"] = time.perf_counter() - t0
    if cfg.plots:
        result["plots"] = make_plots(result, cfg.out_dir)
    (cfg.out_dir / "bench.json").write_text(json.dumps(result, indent=1, default=str))
    write_report(result, cfg.out_dir)


def run(cfg: BenchConfig, command: str = "mtp-bindings bench") -> dict[str, Any]:
    """Run the benchmark parts of ``cfg``; writes ``bench.json``, ``bench.md`` and plots (after
    each part, so an interrupted run keeps what it measured). A run of only some parts keeps the
    other parts' results from an earlier ``bench.json`` in the same directory."""
    if not llama_server_path().is_file():
        raise FileNotFoundError(f"{llama_server_path()} is missing: build the package with MTP_BUILD_LLAMA_SERVER=ON")
    cfg.out_dir.mkdir(parents=True, exist_ok=True)
    log_dir = Path(tempfile.mkdtemp(prefix="mtp-bench-logs-"))
    if cfg.nice:
        os.nice(cfg.nice)  # inherited by every server started below
    result: dict[str, Any] = {}
    prev_path = cfg.out_dir / "bench.json"
    if not {"inproc", "http", "cost"} <= set(cfg.parts) and prev_path.is_file():
        with contextlib.suppress(ValueError, OSError):
            prev = json.loads(prev_path.read_text())
            keep = (MATRIX_KEYS if "inproc" not in cfg.parts else ()) + (("cost",) if "cost" not in cfg.parts else ())
            result.update({k: prev[k] for k in keep if k in prev})
            if result:
                result["merged_from_earlier_run"] = {"keys": sorted(result), "started": prev.get("started")}
    omp = os.environ.get("OMP_WAIT_POLICY")
    if cfg.omp_wait_policy != "default" and (omp or "").lower() != cfg.omp_wait_policy:
        log(f"note: OMP_WAIT_POLICY is {omp!r} in this process, not {cfg.omp_wait_policy!r} (set it before "
            "libgomp loads: `mtp-bindings bench` does)")
    result.update({"config": cfg.to_json(), "machine": machine_info(), "command": command,
                   "omp_wait_policy": omp,
                   "model_sha1": {k: _sha1(getattr(cfg, k)) for k in ("target", "assistant")},
                   "started": time.strftime("%Y-%m-%d %H:%M:%S"), "errors": [], "server_logs": str(log_dir),
                   "package_fingerprint": package_fingerprint(), "git_head": _git_head()})
    t0 = time.perf_counter()
    from ..api import Model

    if "inproc" in cfg.parts or "http" in cfg.parts:
        runner = MatrixRunner(cfg, log_dir)
        info = runner.run()
        for part in ("inproc", "http"):
            result.pop(part, None)
            rows = aggregate(runner.samples, part)
            if not rows:
                continue
            result[part] = {"rows": rows, "identity": [i for i in identity_check(runner.samples) if i["part"] == part],
                            "noise": noise_summary(rows, info["noise"]), "prompt_ids": info["prompt_ids"]}
        result["samples"] = [_sample_json(s) for s in runner.samples]
        result["setups"] = info["setups"]
        _finish(result, cfg, t0)
    # the driver's own time and the pair's costs: with the matrix on the tiny pair; on the E2B pair
    # only when asked for (minutes per configuration at that size)
    if "driver" in cfg.parts or (cfg.pair != "e2b" and {"inproc", "http"} & set(cfg.parts)):
        log("driver: Python time per round on the trained pair")
        with Model(cfg.target, assistant=cfg.assistant) as m:
            prompt_ids = m.tokenize(cfg.prompt)
            bias = eog_bias(m) if cfg.suppress_eog else {}
            result["driver"] = {"rows": driver_overhead(m, prompt_ids, threads=cfg.threads, n_out=max(cfg.outputs),
                                                        draft_ns=cfg.draft_ns, temps=cfg.temperatures,
                                                        runs=max(1, min(cfg.runs, 2)), bias=bias, n_ctx=cfg.n_ctx)}
            if cfg.mode != "smoke":
                result["driver"]["profile"] = profile_driver(m, prompt_ids, threads=cfg.threads, n_out=max(cfg.outputs),
                                                             draft_n=cfg.draft_ns[len(cfg.draft_ns) // 2] if cfg.draft_ns else 0,
                                                             temp=0.0, out_path=log_dir / "driver.prof")
        if cfg.pyspy_seconds > 0 and cfg.draft_ns:
            log("driver: py-spy profile of the generation loop")
            result["driver"]["pyspy"] = py_spy_driver_profile(
                cfg.target, cfg.assistant, threads=cfg.threads, n_out=max(cfg.outputs),
                draft_n=cfg.draft_ns[len(cfg.draft_ns) // 2], seconds=cfg.pyspy_seconds, prompt=cfg.prompt,
                out_dir=cfg.out_dir)
        log("costs of the matrix's pair (for its expected speedup)")
        result["trained_costs"] = _trained_costs(cfg, log_dir)
        _finish(result, cfg, t0)
    if "cost" in cfg.parts:
        try:
            result["cost"] = run_cost(cfg, log_dir, None)
        except Exception as e:
            result["errors"].append(f"cost part failed: {type(e).__name__}: {e}")
            log(f"cost part failed: {e}")
    _finish(result, cfg, t0)
    log(f"done in {result['wall_s']:.0f} s: {cfg.out_dir / 'bench.md'}")
    return result
