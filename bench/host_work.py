#!/usr/bin/env python3
"""Host work per round: what a generation spends outside the target's decode and the drafting, per round.

A CPU round of the E2B-sized pair lasts ~90 ms, so a millisecond of host work is ~1 %; on a GPU (a few ms a
token) the same millisecond is a fifth of the round. This measures it on the CPU, where it runs the same.

For each pair (``e2b``: the demo's E2B-sized q4_K pair, vocabulary 262,144; ``tiny``: the bundled trained
pair), sampling setting (greedy; the library's defaults: temperature 0.8, top_k 40, top_p 0.95, min_p 0.05)
and draft count (plain; 3 drafts), interleaved, ``--repeats`` runs of ``--tokens`` tokens on one context:

* ``sample``: the sampler's time per round (the stats' ``t_sample``: picking, or the chain and acceptance);
* ``other``: the rest of the loop's time per round (wall time less prompt, decode/verify, drafting and
  sampling: the loop's own bookkeeping, the KV edits' calls, the policy, handing text to the caller);
* ``drafting``: the stats' ``t_draft`` (submitting each drafting request, with the hidden state it starts from,
  and waiting for its drafts);
* for greedy, the same with ``MTP_BINDINGS_GRAPH_GREEDY=0`` (picks on the host from the logits rows), the
  baseline of the graph's picks, in the same run.

Results: ``bench/results/host_work.json`` and ``host_work.md`` (medians over the repeats).

Usage::

    python bench/host_work.py
    python bench/host_work.py --pairs tiny --tokens 256 --repeats 5
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import auto_draft  # noqa: E402  (the pairs and the machine's description)
import decode_scaling as ds  # noqa: E402

from mtp_bindings.config.env import ENV_GRAPH_GREEDY  # noqa: E402

OUT = ds.RESULTS / "host_work.json"
PROMPT = "class Queue:\n    def __init__(self):"
# (name, sampling keywords, graph greedy): greedy in the graph and on the host, and the defaults (sampled)
SETTINGS = [("greedy", {"temperature": 0.0}, "1"), ("greedy, host picks", {"temperature": 0.0}, "0"),
            ("sampled (defaults)", {"seed": 7}, "1")]
DRAFTS = (0, 3)


def measure(model: Any, sampling: dict[str, Any], graph: str, k: int, tokens: int) -> dict[str, float]:
    before = os.environ.get(ENV_GRAPH_GREEDY)
    os.environ[ENV_GRAPH_GREEDY] = graph
    try:
        with model.create_context(n_ctx=1024, embeddings=True) as ctx:
            model.generate("def main():\n", context=ctx, max_tokens=8, draft_n_max=k, **sampling)  # warm-up
            t0 = time.perf_counter()
            r = model.generate(PROMPT, context=ctx, max_tokens=tokens, draft_n_max=k, ignore_eos=True, **sampling)
            wall = time.perf_counter() - t0
    finally:
        if before is None:
            os.environ.pop(ENV_GRAPH_GREEDY)
        else:
            os.environ[ENV_GRAPH_GREEDY] = before
    s = r.stats
    other = wall - s.t_prompt - s.t_verify - s.t_draft - s.t_sample
    return {"sample_us": s.t_sample / s.n_rounds * 1e6, "other_us": other / s.n_rounds * 1e6,
            "verify_ms": s.t_verify / s.n_rounds * 1e3, "draft_ms": s.t_draft / s.n_rounds * 1e3,
            "tokens_per_s": len(r.tokens) / wall,
            "rounds": s.n_rounds}


def run(pairs: Sequence[str], tokens: int, repeats: int) -> dict[str, Any]:
    from mtp_bindings import Model

    out: dict[str, Any] = {}
    for pair in pairs:
        target, assistant = auto_draft.pair_files(pair)
        samples: dict[str, list[dict[str, float]]] = {}
        with Model(target, assistant=assistant) as model:
            for _ in range(repeats):
                for name, sampling, graph in SETTINGS:
                    for k in DRAFTS:
                        samples.setdefault(f"{name} | {k}", []).append(measure(model, sampling, graph, k, tokens))
        out[pair] = {key: {m: statistics.median(x[m] for x in v) for m in v[0]} for key, v in samples.items()}
    return out


def markdown(result: dict[str, Any]) -> str:
    lines = ["# Host work per round", "", f"{result['cpu']}, {result['isa']}; {result['date']}; "
             f"{result['tokens']} tokens after a short prompt, medians of {result['repeats']} interleaved runs.", ""]
    for pair, cells in result["pairs"].items():
        lines += [f"## {pair}", "", "| setting | drafts | sample, us/round | other loop work, us/round | "
                  "verify, ms/round | drafting, ms/round | tokens/s |", "|---|---:|---:|---:|---:|---:|---:|"]
        for key, c in cells.items():
            name, k = key.split(" | ")
            lines.append(f"| {name} | {k} | {c['sample_us']:.1f} | {c['other_us']:.1f} | {c['verify_ms']:.2f} | "
                         f"{c['draft_ms']:.2f} | {c['tokens_per_s']:.1f} |")
        lines.append("")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--pairs", nargs="+", default=["e2b", "tiny"], choices=["e2b", "tiny"])
    p.add_argument("--tokens", type=int, default=96)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--out", type=Path, default=OUT)
    a = p.parse_args(argv)
    result = {"cpu": ds._cpu_name(), "isa": auto_draft._isa(), "date": time.strftime("%Y-%m-%d %H:%M"),
              "tokens": a.tokens, "repeats": a.repeats, "pairs": run(a.pairs, a.tokens, a.repeats)}
    ds.write_results(a.out, result, markdown(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
