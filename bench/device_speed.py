"""Plain vs MTP decoding with every layer on one device (a GPU, or Vulkan on Mesa's lavapipe), ours and upstream's.

``mtp-bindings bench`` measures the CPU; this measures a device (issue 28), as users run one: target and
assistant fully offloaded (``n_gpu_layers=-1``, the CLI's ``-ngl 99 -ngld 99 -dev DEVICE``), greedy, the same
prompt for every system, in one run:

* ours in process: plain decoding, MTP with ``draft_n_max`` 1..3, and ``auto`` (the default);
* upstream's ``llama-server`` (built with the package when ``MTP_BUILD_LLAMA_SERVER=ON``) plain and with
  ``--spec-type draft-mtp`` at the same draft counts, timed by its own generation timings.

Tokens per second of generation (the prompt excluded), the median of ``--runs``, and each system's ratio to our
plain decoding; whether every temperature-0 output equals ours plain. JSON on stdout (or ``--out``).

    python bench/device_speed.py --device CUDA0 --pair tiny --runs 3
    GGML_VK_VISIBLE_DEVICES=0 .venv-vulkan/bin/python bench/device_speed.py --device Vulkan0 --tokens 32 --runs 1

``--pair e2b`` takes the E2B-sized q4_K pair ``mtp-bindings bench`` runs (``mtp-bindings scale-pair``; built first
if absent).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

PROMPT = "import os\nimport sys\n\n\ndef parse_args(argv):\n"
DRAFTS = (1, 2, 3)


def _pair(name: str) -> tuple[Path, Path]:
    if name == "tiny":
        from mtp_bindings.models import ASSISTANT, TARGET

        return TARGET, ASSISTANT
    from mtp_bindings.scale_pair.build import ScaleConfig, scale_pair

    # the files `mtp-bindings bench` uses (built on first use, minutes, then cached): the q4_K target and its
    # centroid-head assistant, as the bench's own E2B cells run them
    sp = scale_pair(ScaleConfig(), types=("q4_K",), progress=True)
    return sp.target["q4_K"], sp.centroid["q4_K"]


def ours(target: Path, assistant: Path, device: str, n_tokens: int, runs: int) -> dict[str, dict[str, Any]]:
    from mtp_bindings import Model

    out: dict[str, dict[str, Any]] = {}
    with Model(target, assistant=assistant, n_gpu_layers=-1, devices=device) as model, \
            model.create_context(n_ctx=1024, embeddings=True) as ctx:
        model.generate(PROMPT, max_tokens=8, temperature=0, context=ctx)  # warm-up: the device's pipelines
        for label, draft in [("ours plain", 0), *((f"ours mtp {k}", k) for k in DRAFTS), ("ours auto", None)]:
            tps, tokens, acc = [], None, []
            for _ in range(runs):
                kw: dict[str, Any] = {} if draft is None else {"draft_n_max": draft}
                r = model.generate(PROMPT, max_tokens=n_tokens, temperature=0, context=ctx, **kw)
                t_gen = r.stats.t_total - r.stats.t_prompt
                tps.append(r.stats.n_generated / t_gen if t_gen > 0 else 0.0)
                tokens = list(r.tokens)
                acc.append(r.stats.n_accepted / r.stats.n_drafted if r.stats.n_drafted else 0.0)
            out[label] = {"tokens_per_s": statistics.median(tps), "runs": tps, "tokens": tokens,
                          "acceptance": statistics.median(acc)}
    return out


def upstream(target: Path, assistant: Path, device: str, n_tokens: int, runs: int) -> dict[str, dict[str, Any]]:
    from mtp_bindings.benchmark.config import llama_server_path
    from mtp_bindings.benchmark.util import ServerProcess, free_port, upstream_argv

    if not llama_server_path().is_file():
        return {"upstream": {"skipped": f"{llama_server_path()} missing (MTP_BUILD_LLAMA_SERVER=ON builds it)"}}
    out: dict[str, dict[str, Any]] = {}
    offload = ["-ngl", "99", "-dev", device]
    body = {"prompt": PROMPT, "n_predict": n_tokens, "temperature": 0, "cache_prompt": False, "return_tokens": True}
    with tempfile.TemporaryDirectory() as logs:
        for label, draft in [("upstream plain", 0), *((f"upstream draft-mtp {k}", k) for k in DRAFTS)]:
            port = free_port()
            argv = upstream_argv(target, port, threads=2, n_ctx=1024, kv="f16",
                                 assistant=assistant if draft else None, draft_n=draft,
                                 extra=offload + (["-ngld", "99", "-devd", device] if draft else []))
            srv = ServerProcess(label, argv, port, Path(logs))
            try:
                srv.wait_ready()
                srv.client.request("POST", "/completion", {**body, "n_predict": 8})  # warm-up
                tps, tokens = [], None
                for _ in range(runs):
                    status, payload, _ = srv.client.request("POST", "/completion", body)
                    if status != 200:
                        raise RuntimeError(f"{label}: HTTP {status}: {str(payload)[:300]}")
                    tps.append(float(payload["timings"]["predicted_per_second"]))
                    tokens = payload.get("tokens")
                out[label] = {"tokens_per_s": statistics.median(tps), "runs": tps, "tokens": tokens}
            except Exception as e:  # noqa: BLE001 (one system failing is a result to report, not a crash)
                out[label] = {"error": f"{e}", "log": srv.log_tail(20)}
            finally:
                srv.stop()
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="CUDA0")
    ap.add_argument("--pair", choices=["tiny", "e2b"], default="tiny")
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--no-upstream", action="store_true")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)

    target, assistant = _pair(args.pair)
    systems = ours(target, assistant, args.device, args.tokens, args.runs)
    if not args.no_upstream:
        systems.update(upstream(target, assistant, args.device, args.tokens, args.runs))
    base = systems["ours plain"]
    for s in systems.values():
        if "tokens_per_s" in s:
            s["vs_ours_plain"] = s["tokens_per_s"] / base["tokens_per_s"] if base["tokens_per_s"] else None
            s["same_tokens_as_ours_plain"] = s.get("tokens") == base["tokens"] if s.get("tokens") else None
    result = {"device": args.device, "pair": args.pair, "tokens": args.tokens, "runs": args.runs, "systems": systems}
    text = json.dumps(result, indent=1)
    if args.out:
        args.out.write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
