"""The command line of ``mtp-bindings bench``."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from ..exceptions import InvalidParameterError
from .config import config_for, log
from .runner import rerender, run



def add_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_mutually_exclusive_group()
    g.add_argument("--full", dest="mode", action="store_const", const="full",
                   help="the full matrix (default): 5 systems x draft_n 1..4 x KV f16/q8_0 x 128/512 tokens x "
                        "T 0/0.7, 3 runs (hours)")
    g.add_argument("--quick", dest="mode", action="store_const", const="quick",
                   help="a few minutes: KV f16, 128 tokens, 2 runs")
    g.add_argument("--smoke", dest="mode", action="store_const", const="smoke", help="seconds (tests)")
    p.set_defaults(mode="full")
    p.add_argument("--pair", choices=["e2b", "tiny"], default=None,
                   help="e2b (default): the bundled pair scaled to Gemma 4 E2B's shapes (mtp-bindings scale-pair; "
                        "built on first use, then cached), ours on its centroid head, upstream on its dense head; "
                        "tiny: the bundled trained pair (the default with -m/-md)")
    p.add_argument("--parts", default=None, help="comma list of inproc,http,cost,driver (default: inproc,http,cost; "
                                                 "inproc and http include driver)")
    p.add_argument("-m", "--model", dest="target", type=Path, default=None, help="target GGUF (default: the bundled trained pair)")
    p.add_argument("-md", "--mtp-head", dest="assistant", type=Path, default=None, help="assistant GGUF")
    p.add_argument("-t", "--threads", type=int, default=None, help="threads per system (default 2)")
    p.add_argument("--runs", type=int, default=None, help="runs a cell (default 3)")
    p.add_argument("-o", "--out", dest="out_dir", type=Path, default=None, help="results directory (default bench/results)")
    p.add_argument("--cache", dest="cost_cache", type=Path, default=None, help="random-weight models (default bench/.models)")
    p.add_argument("--prompt", default=None, help="the prompt every system continues (default: a short Python snippet)")
    p.add_argument("--no-plots", dest="plots", action="store_false", default=None,
                   help="write no PNG plots (default: plots, except with --smoke; needs matplotlib)")
    p.add_argument("--report-only", action="store_true", help="rewrite bench.md and the plots from bench.json")
    p.add_argument("--omp-wait-policy", choices=["passive", "active", "default"], default="default",
                   help="OMP_WAIT_POLICY for every system (default: unset, i.e. what users get: the package's own "
                        "threading default, see mtp_bindings.config.threads; passive/active: an A/B of libgomp's policies)")
    p.add_argument("--nice", type=int, default=None,
                   help="niceness increment for the benchmark and its servers (negative needs root: priority "
                        "over other work on a shared machine; default 0)")


def _reexec_with_omp_policy(policy: str) -> None:
    """libgomp reads ``OMP_WAIT_POLICY`` once, when it is loaded (importing the bindings loads it):
    set it and start this command again. Servers inherit it, so every system runs with it."""
    if policy == "default" or os.environ.get("OMP_WAIT_POLICY", "").lower() == policy:
        return
    if os.environ.get("_MTP_BENCH_REEXEC"):
        return  # never loop
    env = {**os.environ, "OMP_WAIT_POLICY": policy, "_MTP_BENCH_REEXEC": "1"}
    log(f"re-running with OMP_WAIT_POLICY={policy}")
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, [sys.executable, *sys.argv], env)


def _default_out_dir(pair: str, mode: str) -> Path:
    """``bench/results/<pair>[/<mode>]`` in a checkout, else ``bench-results/...`` here."""
    out = (Path("bench/results") if Path("bench").is_dir() else Path("bench-results")) / pair
    return out if mode == "full" else out / mode


def main_args(args: argparse.Namespace, command: str) -> int:
    if args.report_only:
        out = args.out_dir or _default_out_dir(args.pair or "e2b", args.mode)
        rerender(out.resolve())
        print((out / "bench.md").read_text())
        return 0
    if args.omp_wait_policy:
        _reexec_with_omp_policy(args.omp_wait_policy)
    parts = tuple(x.strip() for x in args.parts.split(",")) if args.parts else None
    if parts and not set(parts) <= {"inproc", "http", "cost", "driver"}:
        raise InvalidParameterError(f"--parts: unknown part in {args.parts!r} (inproc, http, cost; driver: only the "
                                    "driver time, its profiles and the matrix pair's costs)")
    pair = args.pair or ("tiny" if args.target or args.assistant or args.mode == "smoke" else "e2b")
    if pair == "e2b" and (args.target or args.assistant):
        raise InvalidParameterError("--pair e2b builds its own files: drop -m/-md, or use --pair tiny")
    out_dir = args.out_dir or _default_out_dir(pair, args.mode)
    cfg = config_for(args.mode, pair, target=args.target, assistant=args.assistant, threads=args.threads, runs=args.runs,
                     out_dir=out_dir, cost_cache=args.cost_cache, prompt=args.prompt, plots=args.plots, parts=parts,
                     nice=args.nice, omp_wait_policy=args.omp_wait_policy)
    result = run(cfg, command=command)
    print((cfg.out_dir / "bench.md").read_text())
    return 0 if not result["errors"] else 1


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="mtp-bindings bench", description=__doc__.split("\n")[0])
    add_arguments(p)
    args = p.parse_args(argv)
    try:
        return main_args(args, "mtp-bindings bench " + " ".join(argv if argv is not None else sys.argv[1:]))
    except InvalidParameterError as e:
        p.error(str(e))

