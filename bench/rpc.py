"""Tokens/s over ggml RPC: a pair with every target layer split across ``rpc-server`` workers on
loopback (``-ngl 99``), plain decoding vs MTP, beside the same runs on the local CPU.

Setups: ``local`` (repacked weights, llama.cpp's default), ``local, no repack`` (what the workers
hold: a remote buffer is never repacked), ``rpc`` (the assistant follows the target onto the workers)
and ``rpc, assistant local`` (``n_gpu_layers_draft=0``, the command line's ``-ngld 0``). Each run is
greedy on a fresh context; the table gives the median tokens/s of ``--reps`` runs after a warm-up,
the MTP acceptance and whether the tokens equal the local no-repack run's.

    python bench/rpc.py                       # the bundled trained pair, 2 workers
    python bench/rpc.py --pair e2b --tokens 64 --reps 2

Loopback measures the protocol's cost (a round trip per graph, per worker), not a network's: on a
real network each round trip adds its latency. Writes ``bench/results/rpc.md`` (and prints it); run it
on a quiet machine.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from mtp_bindings import Model
from mtp_bindings.cli.rpc_server import rpc_server_path

BUNDLED = Path(__file__).resolve().parent.parent / "mtp_bindings" / "models"
RESULTS = Path(__file__).resolve().parent / "results" / "rpc.md"
PROMPT = "import os\nimport sys\n\n\ndef parse_args(argv):\n"
HEADER = "# Tokens/s over ggml RPC (`bench/rpc.py`)\n\nOne section per pair, its latest run.\n"


def pair_paths(name: str, head: str) -> tuple[Path, Path]:
    """``trained`` (bundled; its assistant has a dense head) or ``e2b`` (the E2B-sized q4_K pair, built
    once and cached, with the ``head`` assistant: ``centroid`` or ``dense``)."""
    if name == "trained":
        return BUNDLED / "trained-target.gguf", BUNDLED / "trained-assistant.gguf"
    from mtp_bindings.scale_pair.build import scale_pair

    pair = scale_pair(types=("q4_K",), progress=False)
    return pair.target["q4_K"], (pair.centroid if head == "centroid" else pair.dense)["q4_K"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def workers(n: int, threads: int) -> Iterator[list[str]]:
    """``n`` bundled rpc-servers on loopback; their endpoints; stopped on exit."""
    procs, endpoints = [], []
    try:
        for _ in range(n):
            port = _free_port()
            cmd = [str(rpc_server_path()), "-H", "127.0.0.1", "-p", str(port), "-t", str(threads)]
            procs.append(subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
            deadline = time.monotonic() + 20
            while True:
                try:
                    socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
                    break
                except OSError:
                    if time.monotonic() > deadline or procs[-1].poll() is not None:
                        raise RuntimeError(f"rpc-server on {port} did not start") from None
                    time.sleep(0.05)
            endpoints.append(f"127.0.0.1:{port}")
        yield endpoints
    finally:
        for p in procs:
            p.terminate()
            p.wait(10)


def run(model: Any, draft_n_max: int | None, tokens: int, threads: int) -> Any:
    with model.create_context(n_ctx=1024, n_threads=threads, embeddings=model.has_assistant) as ctx:
        return model.generate(PROMPT, max_tokens=tokens, temperature=0.0, draft_n_max=draft_n_max, context=ctx,
                              ignore_eos=True)


def measure(model: Any, args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    out = {}
    for mode, draft in (("plain", 0), ("mtp", args.draft_n_max)):
        run(model, draft, 8, args.threads)  # warm-up: first graphs, first transfers
        results = [run(model, draft, args.tokens, args.threads) for _ in range(args.reps)]
        out[mode] = {"tps": statistics.median(r.stats.tokens_per_second for r in results),
                     "drafted": results[-1].stats.n_drafted, "accepted": results[-1].stats.n_accepted,
                     "tokens": results[-1].tokens}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pair", choices=["trained", "e2b"], default="trained")
    ap.add_argument("--head", choices=["centroid", "dense"], default="centroid",
                    help="the e2b pair's assistant head (default centroid)")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--server-threads", type=int, default=2,
                    help="threads of each worker (default 2: the workers compute one after the other)")
    ap.add_argument("--threads", type=int, default=2, help="threads of the local context (default 2)")
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--draft-n-max", type=int, default=None, help="drafts per round (default: the library's)")
    args = ap.parse_args()
    load_before = os.getloadavg()[0]
    target, assistant = pair_paths(args.pair, args.head)
    rows: dict[str, dict[str, dict[str, Any]]] = {}
    for name, load in (("local", {}), ("local, no repack", {"repack": False})):
        with Model(target, assistant=assistant, **load) as model:
            rows[name] = measure(model, args)
    with workers(args.workers, args.server_threads) as endpoints:
        rpc = ",".join(endpoints)
        for name, load in (("rpc", {}), ("rpc, assistant local", {"n_gpu_layers_draft": 0})):
            with Model(target, assistant=assistant, rpc_servers=rpc, n_gpu_layers=99, **load) as model:
                rows[name] = measure(model, args)
    ref = rows["local, no repack"]
    pair = args.pair if args.pair == "trained" else f"{args.pair}, {args.head} head"
    lines = [f"## {pair} pair", "",
             f"`python bench/rpc.py {' '.join(sys.argv[1:])}`: {args.workers} rpc-servers on loopback "
             f"(`-t {args.server_threads}` each) holding every target layer (`-ngl 99`), the local context "
             f"`-t {args.threads}`; greedy, {args.tokens} tokens, median of {args.reps} after a warm-up; "
             f"MTP with draft_n_max {args.draft_n_max if args.draft_n_max is not None else 'default'}. "
             f"{os.cpu_count()} CPUs, load average before: {load_before:.2f}.", "",
             "| setup | plain tok/s | MTP tok/s | MTP vs plain | accepted / drafted | tokens = local no-repack |",
             "|---|---:|---:|---:|---:|---|"]
    for name, r in rows.items():
        same = r["plain"]["tokens"] == ref["plain"]["tokens"] and r["mtp"]["tokens"] == ref["mtp"]["tokens"]
        lines.append(f"| {name} | {r['plain']['tps']:.1f} | {r['mtp']['tps']:.1f} | "
                     f"{r['mtp']['tps'] / r['plain']['tps']:.2f}x | {r['mtp']['accepted']} / {r['mtp']['drafted']} | "
                     f"{'yes' if same else 'no'} |")
    text = "\n".join(lines) + "\n"
    print(text)
    write_section(RESULTS, text)


def write_section(path: Path, section: str) -> None:
    """Put ``section`` (starting ``## title``) into the results file, replacing the one of the same
    title: each pair's latest run is kept."""
    title = section.split("\n", 1)[0]
    old = path.read_text() if path.is_file() else ""
    parts = [p for p in old.split("\n## ")[1:] if ("## " + p).split("\n", 1)[0] != title]
    body = "".join("\n## " + p.rstrip("\n") + "\n" for p in parts) + "\n" + section
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(HEADER + body)


if __name__ == "__main__":
    main()
