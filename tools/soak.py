"""Soak campaign: many generate calls in one process (MTP on, mixed parameters), RSS sampled.

    python tools/soak.py --calls 1000

Prints a JSON report: calls, errors, RSS after warm-up and at the end (MB), growth.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

PROMPTS = ["def main(argv):\n", "import os\nimport sys\n", "class Queue:\n", "for i in range(10):\n",
           "    return self._data[key]\n", "x = {'a': 1}\n"]


def rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def one_call(model, ctx, rng: random.Random) -> None:
    kwargs = dict(max_tokens=rng.choice([1, 8, 24, 48]), draft_n_max=rng.choice([0, 1, 2, 3, 4]),
                  temperature=rng.choice([0.0, 0.0, 0.7, 1.0]), seed=rng.randrange(1 << 30),
                  depth2=rng.choice([True, False]), context=ctx)
    if rng.random() < 0.2:
        kwargs["stop"] = ["\n\n", "return"]
    if rng.random() < 0.2:
        stream = model.generate(rng.choice(PROMPTS), stream=True, **kwargs)
        for i, _ in enumerate(stream):
            if i == 2:
                break
        stream.close()
    else:
        model.generate(rng.choice(PROMPTS), **kwargs)


def run(target: Path, assistant: Path, calls: int, warmup: int, seed: int = 0) -> dict:
    from mtp_bindings import Model

    rng = random.Random(seed)
    errors = 0
    with Model(target, assistant=assistant) as model, model.create_context(n_ctx=512, embeddings=True) as ctx:
        rss_warm = 0.0
        for i in range(calls):
            try:
                one_call(model, ctx, rng)
            except Exception:  # counted, reported
                errors += 1
            if i + 1 == warmup:
                rss_warm = rss_mb()
        rss_end = rss_mb()
    return {"calls": calls, "warmup": warmup, "errors": errors, "rss_after_warmup_mb": round(rss_warm, 1),
            "rss_end_mb": round(rss_end, 1), "rss_growth_mb": round(rss_end - rss_warm, 1)}


def main(argv: list[str] | None = None) -> int:
    import mtp_bindings

    models = Path(mtp_bindings.__file__).parent / "models"
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--calls", type=int, default=1000)
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument("-m", "--model", type=Path, default=models / "trained-target.gguf")
    ap.add_argument("-md", "--mtp-head", type=Path, default=models / "trained-assistant.gguf")
    args = ap.parse_args(argv)
    report = run(args.model, args.mtp_head, args.calls, args.warmup)
    print(json.dumps(report, indent=1))
    return 1 if report["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
