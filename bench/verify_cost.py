#!/usr/bin/env python3
"""What verifying drafts costs: decode(n) / decode(1) per CPU variant, against the machine's read bandwidth.

A decode of n <= 8 tokens reads every weight once, like a decode of one token, so on a CPU it should cost
about the same: that is what makes a speculative round pay. For each CPU variant given (a ``libggml-cpu.so``
preloaded in place of the package's, as ``decode_scaling.py --variant`` does; an empty LIBDIR is the
package's own), this measures in one run, interleaved:

* decode(n) for n = 1..8 on the E2B-width targets of ``decode_scaling.py`` (q4_K, q8_0, f16), after a
  64-token prefix, and the ratio decode(n) / decode(1);
* the machine's streaming read bandwidth (``bench/stream_read.c``, the same thread count);
* decode(1)'s share of it: the weight bytes one token reads (the GGUF's size: the tied LM head reads the
  whole embedding matrix) / decode(1)'s time / the bandwidth.

Results: ``bench/results/verify_cost.json`` and ``verify_cost.md`` (a table per weight type), and
``verify_cost.png``.

Usage::

    python bench/verify_cost.py --variant native= --variant haswell=/path/to/haswell/lib
    python bench/verify_cost.py --types q4_K --rounds 5

The portable build's variant modules are ``mtp_bindings/lib/libggml-cpu-NAME.so``; to compare them, pass
a directory holding that file named ``libggml-cpu.so``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import decode_scaling as ds  # noqa: E402  (the measuring machinery is decode_scaling's)

STREAM_SOURCE = ds.REPO / "bench" / "stream_read.c"
OUT = ds.RESULTS / "verify_cost.json"


def stream_bandwidth(threads: int, out_dir: Path) -> float:
    """GB/s of the best of 5 streaming reads of 1 GiB with ``threads`` threads."""
    exe = out_dir / "stream_read"
    subprocess.run(["cc", "-O2", "-march=native", "-fopenmp", str(STREAM_SOURCE), "-o", str(exe)], check=True)
    res = subprocess.run([str(exe), "--threads", str(threads)], capture_output=True, text=True, check=True)
    return float(json.loads(res.stdout)["gb_s"])


def summarize(decode: dict[str, Any], models: dict[str, Path], gb_s: float) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for wtype, per_variant in decode.items():
        size = models[wtype].stat().st_size
        out[wtype] = {}
        for v, e in per_variant.items():
            d1 = e["decode_ms"].get("1")
            token_gb_s = size / (d1 / 1e3) / 1e9 if d1 else None
            out[wtype][v] = {
                "decode_ms": e["decode_ms"], "ratio_to_n1": e["ratio_to_n1"], "pp_ms": e.get("pp_ms"),
                "weight_bytes": size, "decode1_gb_s": token_gb_s,
                "bandwidth_share": token_gb_s / gb_s if token_gb_s else None,
            }
    return out


def markdown(result: dict[str, Any]) -> str:
    m = result["meta"]
    lines = ["# Verify cost: decode(n) / decode(1)", "",
             f"{m['cpu']}, {m['threads']} threads, streaming read {m['stream_gb_s']:.1f} GB/s; {m['date']}; "
             f"E2B-width targets of decode_scaling.py (4 layers, vocab 262144); medians of {m['rounds']} "
             "interleaved rounds.", ""]
    for wtype, per_variant in result["types"].items():
        ns = sorted(next(iter(per_variant.values()))["ratio_to_n1"], key=int)
        lines += [f"## {wtype}", "",
                  "| variant | decode(1) ms | share of read bandwidth | " + " | ".join(f"n={n}" for n in ns[1:])
                  + " | prompt of 512, ms |",
                  "|---|---:|---:|" + "---:|" * (len(ns) - 1) + "---:|"]
        for v, e in per_variant.items():
            share = e["bandwidth_share"]
            cells = [f"{e['ratio_to_n1'][n]:.2f}" if e["ratio_to_n1"][n] else "-" for n in ns[1:]]
            pp = f"{e['pp_ms']:.0f}" if e.get("pp_ms") else "-"
            lines.append(f"| {v} | {e['decode_ms']['1']:.1f} | {share:.0%} | " + " | ".join(cells) + f" | {pp} |")
        lines.append("")
    return "\n".join(lines)


def plot(result: dict[str, Any], path: Path) -> None:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        ds.log("matplotlib not installed: no plot")
        return
    types = list(result["types"])
    fig, axes = plt.subplots(1, len(types), figsize=(5 * len(types), 4), squeeze=False)
    for ax, wtype in zip(axes[0], types):
        for v, e in result["types"][wtype].items():
            ns = sorted(e["ratio_to_n1"], key=int)
            ax.plot([int(n) for n in ns], [e["ratio_to_n1"][n] for n in ns], marker="o", label=v)
        ax.axhline(1.0, color="grey", lw=0.5)
        ax.set_title(f"{wtype}: decode(n) / decode(1)")
        ax.set_xlabel("tokens in the decode (n)")
        ax.legend(fontsize=7)
    fig.suptitle(f"{result['meta']['cpu']}, {result['meta']['threads']} threads")
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--types", nargs="+", default=["q4_K", "q8_0", "f16"], choices=ds.TYPES)
    p.add_argument("--variant", action="append", default=[], metavar="NAME=LIBDIR",
                   help="a libggml-cpu.so build to measure (LIBDIR empty: the package's own); repeatable")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--cache", type=Path, default=ds.DEFAULT_CACHE)
    p.add_argument("--out", type=Path, default=OUT)
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    variants = dict(spec.partition("=")[::2] for spec in (args.variant or ["package="]))
    models = ds.build_models(args.cache, args.types, args.threads)
    gb_s = stream_bandwidth(args.threads, args.cache)
    ds.log(f"streaming read: {gb_s:.1f} GB/s with {args.threads} threads")
    decode = ds.measure_decode(models, variants, list(range(1, 9)), args.threads, args.rounds, pp=512)
    result = {
        "meta": {"cpu": ds._cpu_name(), "threads": args.threads, "rounds": args.rounds, "stream_gb_s": gb_s,
                 "variants": variants, "date": time.strftime("%Y-%m-%d %H:%M"), "load_average": os.getloadavg()},
        "types": summarize(decode, models, gb_s),
    }
    plot(result, args.out.with_suffix(".png"))
    ds.write_results(args.out, result, markdown(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
