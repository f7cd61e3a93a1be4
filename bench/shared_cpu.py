"""Speed on a shared CPU: one generating process alone, two at once, and one beside a busy loop.

Each measured process is a fresh Python that loads the bundled trained pair, warms up, waits for a
start signal (so processes of one scenario time the same seconds), then generates ``--gens`` x
``--tokens`` tokens (plain: ``draft_n_max=0``; MTP: the default preset) and reports the generation
time. A process still running after ``--timeout`` seconds is stopped and its time extrapolated from
the tokens it had produced (marked ``>=`` in the table: a lower bound of the collapse).

Configurations are environments, so the same installed package is measured as users get it:

* ``default``: nothing set (what ``pip install`` users get now);
* ``fixed-threads``: ``n_threads`` given explicitly (the usable CPUs), so the context does not give
  way to other work: the barrier and spin-count part of the default alone;
* ``libgomp-default``: ``GOMP_SPINCOUNT=300000``, libgomp's own spin count when
  ``OMP_WAIT_POLICY`` is unset (what users got before the package chose a default);
* ``passive`` / ``active``: ``OMP_WAIT_POLICY`` set by the user;
* anything else given as ``NAME=VAR=VALUE[,VAR=VALUE]`` with ``--config`` (``threads=N``: the
  context's ``n_threads``, not an environment variable), e.g. an older
  ``libggml-cpu.so`` with ``LD_PRELOAD=DIR/libggml-cpu.so,LD_LIBRARY_PATH=DIR`` (DIR: a copy of the
  package's ``lib/`` with that library in it).

    python bench/shared_cpu.py                      # the standard table -> bench/results/shared_cpu.{json,md}
    python bench/shared_cpu.py --config spin1k=GOMP_SPINCOUNT=1000 --scenarios alone busy

Ratios are within one run: every scenario's time is divided by the same configuration's
``alone`` time of that repetition.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"

STANDARD_CONFIGS = {
    "default": {},
    "fixed-threads": {"threads": str(len(os.sched_getaffinity(0)))},
    "libgomp-default": {"GOMP_SPINCOUNT": "300000"},
    "passive": {"OMP_WAIT_POLICY": "passive"},
    "active": {"OMP_WAIT_POLICY": "active"},
}
# variables that choose a threading behaviour: cleared before a configuration sets its own
THREAD_ENV = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "OMP_NUM_THREADS", "MTP_BINDINGS_THREADS")
PROMPTS = ["def parse_args(argv):\n", "import os\nimport sys\n", "class Queue:\n",
           "for i in range(10):\n", "# Copyright (c) 2024\n"]

WORKER = r"""
import json, sys, time
from mtp_bindings import Model
from mtp_bindings.models import ASSISTANT, TARGET
mode, gens, tokens, threads = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
prompts = json.loads(sys.argv[5])
target, assistant = sys.argv[6] or TARGET, sys.argv[7] or ASSISTANT
kw = {} if mode == "mtp" else {"draft_n_max": 0}
with Model(target, assistant=assistant) as model:
    ctx = model.create_context(n_ctx=1024, n_threads=threads or None, embeddings=True)
    model.generate(prompts[0], context=ctx, max_tokens=16, ignore_eos=True, **kw)  # warm-up
    print("ready", flush=True)
    sys.stdin.readline()
    t0 = time.perf_counter()
    done = 0
    for i in range(gens):
        for piece in model.generate(prompts[i % len(prompts)], context=ctx, max_tokens=tokens,
                                    ignore_eos=True, stream=True, **kw):
            done += len(piece.tokens)
            print(f"progress {done} {time.perf_counter() - t0:.6f}", flush=True)
    print(json.dumps({"tokens": done, "seconds": time.perf_counter() - t0}), flush=True)
"""

BUSY = "while True:\n    pass\n"


def config_env(overrides: dict[str, str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in THREAD_ENV}
    env.update(overrides)
    return env


def run_scenario(scenario: str, mode: str, overrides: dict[str, str], args: argparse.Namespace) -> list[dict]:
    """Start the scenario's processes, release them together, and collect each one's time."""
    n_workers = 2 if scenario == "pair" else 1
    overrides = dict(overrides)
    threads = overrides.pop("threads", str(args.threads))
    env = config_env(overrides)
    cmd = [sys.executable, "-c", WORKER, mode, str(args.gens), str(args.tokens), threads, json.dumps(PROMPTS),
           str(args.model or ""), str(args.mtp_head or "")]
    procs = [subprocess.Popen(cmd, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1)
             for _ in range(n_workers)]
    busy = None
    try:
        for p in procs:
            line = p.stdout.readline()
            if line.strip() != "ready":
                raise RuntimeError(f"worker failed to start: {line!r}")
        if scenario == "busy":
            busy = subprocess.Popen([sys.executable, "-c", BUSY])
            time.sleep(0.5)  # let it take its core
        for p in procs:
            p.stdin.write("go\n")
            p.stdin.flush()
        return [collect(p, args) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait()
        if busy is not None:
            busy.kill()
            busy.wait()


def collect(proc: subprocess.Popen, args: argparse.Namespace) -> dict:
    """Read a worker's progress until it finishes or the timeout passes (then extrapolate)."""
    import selectors

    total = args.gens * args.tokens
    deadline = time.monotonic() + args.timeout
    last = (0, 0.0)
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    while True:
        left = deadline - time.monotonic()
        if left <= 0 or not sel.select(timeout=left):
            proc.kill()
            done, secs = last
            secs = max(secs, args.timeout) if done else float(args.timeout)
            return {"seconds": secs * total / max(done, 1), "complete": False, "tokens_done": done}
        line = proc.stdout.readline()
        if not line:
            raise RuntimeError(f"worker exited early (rc {proc.wait()})")
        if line.startswith("progress "):
            _, done, secs = line.split()
            last = (int(done), float(secs))
        elif line.startswith("{"):
            r = json.loads(line)
            return {"seconds": r["seconds"], "complete": True, "tokens_done": r["tokens"]}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", action="append", default=[], metavar="NAME=VAR=VALUE[,VAR=VALUE]",
                   help="a configuration (environment) to measure; repeatable (default: the standard four)")
    p.add_argument("--scenarios", nargs="+", default=["alone", "pair", "busy"], choices=["alone", "pair", "busy"])
    p.add_argument("--modes", nargs="+", default=["plain", "mtp"], choices=["plain", "mtp"])
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--gens", type=int, default=5)
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--threads", type=int, default=0, help="n_threads of the context (0: the package default)")
    p.add_argument("-m", "--model", type=Path, default=None, help="target GGUF (default: the bundled trained pair's)")
    p.add_argument("-md", "--mtp-head", type=Path, default=None, help="assistant GGUF (default: the bundled one)")
    p.add_argument("--timeout", type=float, default=20.0, help="seconds before a process is stopped and extrapolated")
    p.add_argument("--out", type=Path, default=RESULTS / "shared_cpu", help="writes OUT.json and OUT.md")
    args = p.parse_args(argv)

    configs: dict[str, dict[str, str]] = {}
    for c in args.config:
        name, _, rest = c.partition("=")
        configs[name] = dict(kv.split("=", 1) for kv in rest.split(",") if kv) if rest else {}
    configs = configs or dict(STANDARD_CONFIGS)
    if "alone" not in args.scenarios:
        args.scenarios = ["alone", *args.scenarios]

    runs: list[dict] = []
    for rep in range(args.reps):
        for mode in args.modes:
            for name, overrides in configs.items():
                for scenario in args.scenarios:
                    for i, r in enumerate(run_scenario(scenario, mode, overrides, args)):
                        r.update(rep=rep, mode=mode, config=name, scenario=scenario, process=i)
                        runs.append(r)
                        print(f"rep {rep} {mode:5s} {name:16s} {scenario:5s} #{i}: {r['seconds']:8.3f} s"
                              f"{'' if r['complete'] else ' (extrapolated)'}", flush=True)
    result = {"args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
              "configs": configs, "cpus": len(os.sched_getaffinity(0)), "loadavg": os.getloadavg(),
              "date": time.strftime("%Y-%m-%d %H:%M:%S"), "runs": runs}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".json").write_text(json.dumps(result, indent=1))
    md = report(result)
    args.out.with_suffix(".md").write_text(md)
    print(md)
    return 0


def report(result: dict) -> str:
    """Median seconds per (mode, config, scenario) and the ratio to the same config's solo time."""
    runs = result["runs"]
    a = result["args"]
    pair = f"`{Path(a['model']).name}` + `{Path(a['mtp_head']).name}`" if a.get("model") else "bundled trained pair"
    lines = [f"# Generation on a shared CPU ({result['date']}, {result['cpus']} CPUs)", "",
             f"`python bench/shared_cpu.py` — {pair}, {a['gens']} x {a['tokens']} tokens per process, "
             f"{a['reps']} repetitions, medians; ratio = scenario / the same configuration alone in the same repetition; "
             f"`>=`: stopped after {a['timeout']:.0f} s and extrapolated from the tokens done.", "",
             "| mode | configuration | alone s | two at once s (ratio) | beside a busy loop s (ratio) | alone vs default |",
             "|---|---|---:|---:|---:|---:|"]
    modes = list(dict.fromkeys(r["mode"] for r in runs))
    configs = list(dict.fromkeys(r["config"] for r in runs))

    def cell(mode: str, config: str, scenario: str) -> tuple[float, float, bool] | None:
        sel = [r for r in runs if (r["mode"], r["config"], r["scenario"]) == (mode, config, scenario)]
        if not sel:
            return None
        ratios = []
        for r in sel:
            solo = [s["seconds"] for s in runs if (s["mode"], s["config"], s["scenario"], s["rep"]) ==
                    (mode, config, "alone", r["rep"])]
            ratios.append(r["seconds"] / solo[0])
        return (statistics.median(r["seconds"] for r in sel), statistics.median(ratios),
                all(r["complete"] for r in sel))

    for mode in modes:
        base = cell(mode, "default", "alone")
        for config in configs:
            alone = cell(mode, config, "alone")
            if alone is None:
                continue
            row = [mode, f"`{config}`", f"{alone[0]:.3f}"]
            for scenario in ("pair", "busy"):
                c = cell(mode, config, scenario)
                row.append("—" if c is None else f"{'' if c[2] else '>='}{c[0]:.2f} ({c[1]:.1f}x)")
            row.append(f"{base[0] / alone[0]:.2f}x" if base else "—")
            lines.append("| " + " | ".join(row) + " |")
    lines += ["", "Configurations (`threads`: the context's n_threads; the rest: environment): " + "; ".join(
        f"`{n}` = {', '.join(f'{k}={v}' for k, v in env.items()) or 'nothing set'}"
        for n, env in result["configs"].items()), ""]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
