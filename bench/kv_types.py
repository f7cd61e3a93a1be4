#!/usr/bin/env python3
"""KV cache types on one trained pair: memory, quality against an f16 cache, and decode speed at long contexts
(issue 29), in one run.

The pair is the bundled trained one with its heads widened to 128 / 256 (``scale-pair``'s zero padding, as
``tests/test_turbo_kv.py`` uses it): a trained pair whose heads the TurboQuant 128-value blocks divide, 4
sliding-window and 2 full-attention layers, built in a second. Its weights are tiny, so at 4K-32K tokens a decode
is mostly attention over the cache: the speed figures show what each type's kernels cost per cached token, not
what an E2B-sized decode would lose (a 2-core CPU cannot fill an E2B-sized cache of 32K tokens in a session).

* quality: a source file of the package teacher-forced through the target (``--text-tokens`` tokens, every
  position's distribution), mean and max KL(f16 || type) and how often the argmax agrees; MTP acceptance with
  ``draft_n_max`` 3 at temperature 0 on three prompts, next to f16's;
* memory: the full-attention and sliding-window caches' sizes as llama.cpp reports them at ``n_ctx`` 32K;
* speed: after a prompt of 2K / 4K / 8K tokens (``--lengths``; random tokens), one-token decodes (plain decoding's
  step) and generation as users get it (``auto``, which drafts where it pays: the greedy continuation of random
  tokens often repeats itself, and the E2B-sized pair's drafts were all accepted at 4K) per type, and each one's
  ratio to f16 at the same length. Flash attention is each type's default: llama.cpp's auto for f16 (on for a
  CPU; off before 2026-12-07, as the older tables say), on for the quantized types (they need it).

A type names both halves of the cache (the sliding-window layers take ``type_k`` / ``type_v``, the default) unless
the setting gives the window its own. The pin's contexts keep a full-size window cache (``swa_full``), so the window
is no smaller than a full-attention layer's cache: see the memory columns.

    python bench/kv_types.py                          # -> bench/results/kv_types.{json,md}, ~10 minutes on 2 cores
    python bench/kv_types.py --lengths 1024 --quick   # a check that it runs
    python bench/kv_types.py --pair e2b --no-quality --lengths 4096 16384   # -> kv_types_e2b.{json,md}
    python bench/kv_types.py --pair e2b --no-quality --lengths 32768 --types f16 turbo3 --out bench/results/kv_types_e2b_32k.json

``--pair e2b`` measures the demo's E2B-sized q4_K pair instead (E2B's heads and layer pattern, q4_K weights): what
a user's decode costs with each cache, where the weights' reading dominates until the cache grows large.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import logging
import re
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import auto_draft  # noqa: E402  (the CPU's name and ISA, as the other benches report them)
import decode_scaling as ds  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
# (name, type_k, type_v, type_k_swa, type_v_swa); None: the sliding-window layers take type_k / type_v (the default)
QUALITY = [("f16", "f16", "f16", None, None), ("q8_0", "q8_0", "q8_0", None, None), ("q4_0", "q4_0", "q4_0", None, None),
           ("turbo4", "turbo4", "turbo4", None, None), ("turbo3", "turbo3", "turbo3", None, None),
           ("turbo2", "turbo2", "turbo2", None, None), ("q8_0 K + turbo4 V", "q8_0", "turbo4", None, None),
           ("q8_0 K + turbo3 V", "q8_0", "turbo3", None, None),
           ("turbo4, window f16", "turbo4", "turbo4", "f16", "f16"), ("turbo3, window f16", "turbo3", "turbo3", "f16", "f16")]
SPEED = ["f16", "q8_0", "turbo4", "turbo3"]
PAIRS = {"wide": "the wide trained pair (heads 128 / 256, 4 sliding-window + 2 full-attention layers)",
         "e2b": "the E2B-sized q4_K pair (35 layers, heads 256 / 512, 7 full-attention layers)"}
PROMPTS = ["def main(argv):\n", "import os\nimport sys\n", "class Queue:\n    def __init__(self):"]
TEXT = Path(__file__).resolve().parent.parent / "mtp_bindings" / "generation" / "loop.py"


def pair_files(name: str, tmp: Path) -> tuple[str, str]:
    """The pair's target and assistant GGUFs: the wide one is built in ``tmp`` (a second), the E2B-sized one is
    ``scale_pair``'s cached q4_K pair (built once, minutes)."""
    from mtp_bindings.scale_pair.build import ScaleConfig, scale_pair

    if name == "wide":
        wide = dataclasses.replace(ScaleConfig.small(), name="wide", head_dim=128, global_head_dim=256)
        pair = scale_pair(wide, types=("f16",), cache_dir=tmp, progress=False)
        return str(pair.target["f16"]), str(pair.centroid["f16"])
    return auto_draft.pair_files(name)


def log(msg: str) -> None:
    print(f"[kv_types] {msg}", file=sys.stderr, flush=True)


@contextlib.contextmanager
def native_lines() -> Iterator[list[str]]:
    """llama.cpp's log lines while the block runs (the model must be loaded with ``verbose=True``)."""
    lines: list[str] = []

    class Handler(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append(record.getMessage())

    h, native = Handler(logging.DEBUG), logging.getLogger("mtp_bindings.native")
    native.addHandler(h)
    level = native.level
    native.setLevel(logging.DEBUG)
    try:
        yield lines
    finally:
        native.removeHandler(h)
        native.setLevel(level)


def kv_caches(lines: list[str]) -> dict[str, tuple[str, str, float]]:
    """The target's full-attention and sliding-window caches (``"full"``, ``"swa"``) as (K type, V type, MiB), from
    llama.cpp's lines of one context's creation (the first of each: the assistant's mirror, created next, shares the
    target's tensors)."""
    out: dict[str, tuple[str, str, float]] = {}
    half = None
    for line in lines:
        if "creating non-SWA KV cache" in line:
            half = "full"
        elif "creating     SWA KV cache" in line:
            half = "swa"
        elif half and (m := re.match(r"llama_kv_cache: size = +([\d.]+) MiB.*K \((\w+)\):.*V \((\w+)\):", line)):
            out.setdefault(half, (m.group(2), m.group(3), float(m.group(1))))
            half = None
    return out


def kv(setting: tuple) -> dict[str, Any]:
    _, k, v, ks, vs = setting
    return {"type_k": k, "type_v": v, "type_k_swa": ks, "type_v_swa": vs}


def quality(model: Any, n_text: int, n_tokens: int) -> dict[str, dict[str, float]]:
    tokens = model.tokenize(TEXT.read_text())[:n_text]
    rows: dict[str, np.ndarray] = {}
    out: dict[str, dict[str, float]] = {}
    for setting in QUALITY:
        name = setting[0]
        with model.create_context(n_ctx=1024, n_batch=n_text, n_ubatch=min(512, n_text), **kv(setting)) as ctx:
            ctx.decode(tokens, pos=0, logits="all")
            logits = ctx.get_logits_all().astype(np.float64)
            rows[name] = logits - logits.max(axis=1, keepdims=True)
            rows[name] -= np.log(np.exp(rows[name]).sum(axis=1, keepdims=True))
            acc = []
            for prompt in PROMPTS:
                r = model.generate(prompt, max_tokens=n_tokens, draft_n_max=3, temperature=0, context=ctx,
                                   cache_prompt=False)
                acc.append((r.stats.n_accepted, r.stats.n_drafted))
        ref = rows["f16"]
        kl = (np.exp(ref) * (ref - rows[name])).sum(axis=1)
        out[name] = {"kl_mean": float(kl.mean()), "kl_max": float(kl.max()),
                     "argmax_agree": float((ref.argmax(axis=1) == rows[name].argmax(axis=1)).mean()),
                     "acceptance": sum(a for a, _ in acc) / max(1, sum(d for _, d in acc))}
        log(f"quality {name}: {out[name]}")
    return out


def speed(model: Any, lengths: list[int], n_decode: int, n_gen: int, types: list[str]) -> dict[str, dict[str, Any]]:
    rng = np.random.default_rng(0)
    vocab = model.n_vocab
    out: dict[str, dict[str, Any]] = {}
    for length in lengths:
        prompt = [int(t) for t in rng.integers(10, vocab - 10, size=length)]
        for name in types:
            setting = next(s for s in QUALITY if s[0] == name)
            with native_lines() as lines, \
                    model.create_context(n_ctx=length + n_gen + 64, n_batch=2048, n_ubatch=512, **kv(setting)) as ctx:
                # generation as users get it (auto): the prompt's prefill, then the tokens
                r = model.generate(prompt, max_tokens=n_gen, temperature=0, context=ctx)
                gen_s = r.stats.t_total - r.stats.t_prompt
                end = length + r.stats.n_generated - 1  # the KV holds the prompt and all generated tokens but the last
                steps = []
                for i in range(n_decode):  # plain decoding's step at this length (then taken back)
                    t = time.perf_counter()
                    ctx.decode([prompt[i]], pos=end)
                    steps.append(time.perf_counter() - t)
                    ctx.seq_rm(0, end, -1)
                cell = {"length": length, "prompt_s": r.stats.t_prompt, "decode_ms": 1e3 * statistics.median(steps),
                        "mtp_tokens_per_s": r.stats.n_generated / gen_s if gen_s > 0 else 0.0,
                        "mtp_acceptance": r.stats.n_accepted / r.stats.n_drafted if r.stats.n_drafted else None,
                        "cache_mib": {half: mib for half, (_, _, mib) in kv_caches(lines).items()}}
            out[f"{name}@{length}"] = cell
            log(f"speed {name} @ {length}: {cell}")
    return out


def report(res: dict[str, Any]) -> str:
    q, s = res["quality"], res["speed"]
    md = ["# KV cache types: quality, memory and decode speed (issue 29)", "",
          f"{res['machine']}; {res['date']}; {PAIRS[res.get('pair', 'wide')]}; {res['threads']} threads. A type names "
          "both the full-attention and the sliding-window caches unless the setting gives the window its own (the "
          "window cache is full-size: `swa_full`)."]
    if q:
        md += ["", f"## Quality against an f16 cache ({res['n_text']} tokens of `{TEXT.name}` teacher-forced; MTP "
               f"acceptance at draft_n_max 3, temperature 0, three prompts of {res.get('n_accept', 64)} tokens)", "",
               "| setting | mean KL | max KL | argmax agrees | MTP acceptance |", "|---|---:|---:|---:|---:|"]
    for name, r in q.items():
        md.append(f"| {name} | {r['kl_mean']:.2e} | {r['kl_max']:.2e} | {100 * r['argmax_agree']:.1f}% | "
                  f"{100 * r['acceptance']:.1f}% |")
    md += ["", "## Memory and speed after a long prompt", "",
           "decode = one plain decoding step at that length (median); generate = `auto` generation of "
           f"{res['n_gen']} tokens after the same prompt (its KV reused; `auto` drafts where it pays: the greedy "
           "continuation of random tokens often repeats itself; its acceptance is in the JSON); "
           "ratios against f16 at the same length; flash attention as each type gets it by default (f16: llama.cpp's "
           "auto, on for a CPU, since 2026-12-07; off in the tables before).", "",
           "| type | length | full-attention cache MiB | window cache MiB | prompt s | decode ms | vs f16 | generate "
           "tok/s | vs f16 |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for key, c in s.items():
        name, length = key.split("@")
        base = s[f"f16@{length}"]
        md.append(f"| {name} | {length} | {c['cache_mib'].get('full', float('nan')):.1f} | "
                  f"{c['cache_mib'].get('swa', float('nan')):.1f} | {c['prompt_s']:.1f} | {c['decode_ms']:.2f} | "
                  f"{base['decode_ms'] / c['decode_ms']:.2f} | {c['mtp_tokens_per_s']:.1f} | "
                  f"{c['mtp_tokens_per_s'] / base['mtp_tokens_per_s']:.2f} |")
    return "\n".join(md) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    # 16K and 32K fit the wide pair's cache; on the E2B-sized pair a 32K prompt is long: with the f16 cache (no flash
    # attention) it had not finished after 28 minutes on a 2-core Zen 3
    ap.add_argument("--lengths", type=int, nargs="+", default=[2048, 4096, 8192])
    ap.add_argument("--text-tokens", type=int, default=512)
    ap.add_argument("--tokens", type=int, default=64, help="tokens generated per prompt for MTP acceptance")
    ap.add_argument("--quick", action="store_true", help="fewer decodes and tokens (a check that it runs)")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--pair", choices=sorted(PAIRS), default="wide",
                    help="wide: the wide trained pair (tiny weights: attention's cost per cached token); e2b: the "
                         "demo's E2B-sized q4_K pair (what a user's decode costs; its prompts take minutes)")
    ap.add_argument("--no-quality", action="store_true", help="the speed table only")
    ap.add_argument("--types", nargs="+", default=SPEED, choices=SPEED,
                    help="the speed table's cache types (f16, the reference, always among them)")
    ap.add_argument("--out", type=Path, default=None, help="default: bench/results/kv_types[_e2b].json")
    args = ap.parse_args(argv)
    if "f16" not in args.types:
        ap.error("--types needs f16: the speed table's ratios are against it")

    from mtp_bindings import Model

    n_decode, n_gen = (3, 16) if args.quick else (9, 64)
    n_accept = 16 if args.quick else args.tokens
    out = args.out or RESULTS / ("kv_types.json" if args.pair == "wide" else f"kv_types_{args.pair}.json")
    with tempfile.TemporaryDirectory() as tmp:
        target, assistant = pair_files(args.pair, Path(tmp))
        with Model(target, assistant=assistant, verbose=True,
                   **({"n_threads": args.threads} if args.threads else {})) as model:
            res = {"machine": f"{ds._cpu_name()} ({auto_draft._isa()})", "date": time.strftime("%Y-%m-%d %H:%M"),
                   "pair": args.pair, "threads": args.threads or "default", "n_text": args.text_tokens,
                   "n_gen": n_gen, "n_accept": n_accept,
                   "quality": {} if args.no_quality else quality(model, args.text_tokens, n_accept),
                   "speed": speed(model, sorted(args.lengths), n_decode, n_gen, args.types)}
    out.write_text(json.dumps(res, indent=1) + "\n")
    md = report(res)
    out.with_suffix(".md").write_text(md)
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
