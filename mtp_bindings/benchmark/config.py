"""Configuration of ``mtp-bindings bench``: paths, :class:`BenchConfig` and the run modes."""

from __future__ import annotations

import importlib.util
import os
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any


PKG = Path(__file__).resolve().parent.parent  # the mtp_bindings package
BUNDLED = PKG / "models"


def llama_server_path() -> Path:
    """The bundled upstream ``llama-server`` (next to the compiled module), or
    ``$MTP_BENCH_LLAMA_SERVER``."""
    env = os.environ.get("MTP_BENCH_LLAMA_SERVER")
    if env:
        return Path(env)
    cands = [PKG / "bin" / "llama-server"]
    # found, not imported: importing the compiled module would load libgomp before the package sets
    # its spin count (mtp_bindings.config.threads)
    spec = importlib.util.find_spec("mtp_bindings._ffi")
    if spec is not None and spec.origin:
        cands.append(Path(spec.origin).resolve().parent / "bin" / "llama-server")
    return next((c for c in cands if c.is_file()), cands[0])

# A prompt of the kind the trained pair was trained on (Python source).
DEFAULT_PROMPT = "import os\nimport sys\n\n\ndef parse_args(argv):\n"


@dataclass(frozen=True)
class BenchSampling:
    """The sampling every cell uses on both systems, in process and in the HTTP body alike, with
    llama.cpp's names (``generate`` and both servers take them). The benchmark's choice, not the
    library's defaults: llama-server's top-k, no nucleus or min-p cut, so that only the temperature
    varies between cells."""

    top_k: int = 40
    top_p: float = 1.0
    min_p: float = 0.0

    def kwargs(self) -> dict[str, Any]:
        return asdict(self)


SAMPLING = BenchSampling()


def log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# ================================================================================================
# configuration
# ================================================================================================

@dataclass(frozen=True)
class Setup:
    """One group of cells of the matrix: the files every system uses and the KV cache type.
    ``assistant`` is ours (the centroid head on the E2B pair); upstream gets ``upstream_assistant``
    (the dense head, as its converter writes it: upstream's drafter has no centroid head, and our
    patch 0003 would quietly give the bundled llama-server ours on a centroid file); ``dense_assistant``
    runs our driver with the dense head too (acceptance compared with upstream's, same weights)."""

    name: str
    target: Path
    assistant: Path
    upstream_assistant: Path
    dense_assistant: Path | None
    kv: str


@dataclass
class BenchConfig:
    """What one benchmark run measures (see :func:`config_for`)."""

    mode: str = "full"
    # "e2b": the bundled pair scaled to Gemma 4 E2B's shapes (mtp_bindings.scale_pair.build), one setup per
    # weight type; "tiny": the bundled trained pair (or -m/-md), one setup per KV type
    pair: str = "tiny"
    weights: tuple[str, ...] = ("q4_K", "q8_0")   # e2b: target/assistant weight types (q4_K: Q4_K_M mix)
    depth2_ns: tuple[int, ...] | None = None       # draft_n measured with depth2 on (None: all of draft_ns)
    dense_ns: tuple[int, ...] = ()                 # e2b: draft_n measured with our driver on the dense head
    http_ns: tuple[int, ...] | None = None         # draft_n measured over HTTP (None: all)
    target: Path = BUNDLED / "trained-target.gguf"
    assistant: Path = BUNDLED / "trained-assistant.gguf"
    out_dir: Path = Path("bench/results")
    parts: tuple[str, ...] = ("inproc", "http", "cost")
    threads: int = 2
    runs: int = 3
    draft_ns: tuple[int, ...] = (1, 2, 3, 4)
    kv_types: tuple[str, ...] = ("f16", "q8_0")
    outputs: tuple[int, ...] = (128, 512)
    temperatures: tuple[float, ...] = (0.0, 0.7)
    prompt: str = DEFAULT_PROMPT
    n_ctx: int = 2048
    seed: int = 1234
    suppress_eog: bool = True          # fixed-length outputs: EOG tokens get a -100 logit bias (both systems)
    cost_shape: str = "e2b"            # "e2b" (real widths) or "tiny" (smoke test)
    cost_rounds: int = 7
    cost_cache: Path = Path("bench/.models")
    upstream_steps_tokens: int = 24    # tokens generated per upstream draft-step measurement (cost part)
    http_systems: bool = True
    plots: bool = True
    seed_shuffle: int = 0
    nice: int = 0                      # niceness increment for this process and its servers (negative: priority)
    omp_wait_policy: str = "default"   # OMP_WAIT_POLICY for every system (see main_args); "default": unset
    pyspy_seconds: float = 20.0        # py-spy profile of the driver loop (0: off; needs py-spy)

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        return {k: (str(v) if isinstance(v, Path) else v) for k, v in d.items()}


def config_for(mode: str, pair: str = "tiny", **overrides: Any) -> BenchConfig:
    """``full`` (issue 6's matrix), ``quick`` (a few minutes) or ``smoke`` (seconds, for tests), on the
    ``e2b`` pair (issue 13: the main pair) or the ``tiny`` bundled one."""
    if pair == "e2b" and mode in ("full", "quick"):
        cfg = _e2b_config(mode)
    elif pair not in ("e2b", "tiny"):
        raise ValueError(f"unknown pair {pair!r}")
    elif mode == "full":
        cfg = BenchConfig()
    elif mode == "quick":
        cfg = BenchConfig(mode="quick", runs=2, kv_types=("f16",), outputs=(128,), cost_rounds=3,
                          upstream_steps_tokens=12, pyspy_seconds=8.0)
    elif mode == "smoke":
        cfg = BenchConfig(mode="smoke", runs=1, draft_ns=(2,), kv_types=("f16",), outputs=(16,),
                          temperatures=(0.0,), cost_shape="tiny", cost_rounds=1, upstream_steps_tokens=6,
                          n_ctx=512, plots=False, pyspy_seconds=0.0)
    else:
        raise ValueError(f"unknown mode {mode!r}")
    for k, v in overrides.items():
        if v is not None:
            setattr(cfg, k, v)
    for k in ("target", "assistant", "out_dir", "cost_cache"):  # servers run elsewhere (cwd)
        setattr(cfg, k, Path(getattr(cfg, k)).resolve())
    return cfg


def _e2b_config(mode: str) -> BenchConfig:
    """The main pair (issue 13). Quick (6-7 min here): the q4_K (Q4_K_M) pair, 128 tokens, draft_n 1..3,
    one run. Full (estimated ~1 hour on 2 cores, not yet timed): q4_K and q8_0, 128 and 512 tokens,
    draft_n 1..4 (depth2 on and the dense head at 2..3, HTTP at 1..3: the whole grid would not fit the
    hour), one run."""
    common: dict[str, Any] = dict(pair="e2b", kv_types=("f16",), temperatures=(0.0, 0.7), parts=("inproc", "http"), pyspy_seconds=0.0,
                  n_ctx=1024)
    if mode == "quick":
        return BenchConfig(mode="quick", weights=("q4_K",), runs=1, draft_ns=(1, 2, 3), depth2_ns=(3,),
                           dense_ns=(1, 2, 3), http_ns=(1, 3), outputs=(128,), **common)
    return BenchConfig(mode="full", weights=("q4_K", "q8_0"), runs=1, draft_ns=(1, 2, 3, 4), depth2_ns=(2, 3),
                       dense_ns=(2, 3), http_ns=(1, 2, 3), outputs=(128, 512), **common)


def kv_setup_name(kv: str) -> str:
    """The name of the tiny pair's setup for KV type ``kv`` (the cells' key in the results)."""
    return f"KV {kv}"


def setups(cfg: BenchConfig) -> list[Setup]:
    """The setups of ``cfg``; on the E2B pair the files are built on first use (minutes) and cached."""
    if cfg.pair != "e2b":
        return [Setup(kv_setup_name(kv), cfg.target, cfg.assistant, cfg.assistant, None, kv) for kv in cfg.kv_types]
    from ..scale_pair.build import ScaleConfig, scale_pair

    sp = scale_pair(ScaleConfig(), types=cfg.weights, progress=True)
    return [Setup(f"{w} weights", sp.target[w], sp.centroid[w], sp.dense[w], sp.dense[w], kv)
            for w in cfg.weights for kv in cfg.kv_types]
