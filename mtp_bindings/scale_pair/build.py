"""Write a Gemma 4 E2B-shaped target + assistant that computes exactly what the bundled trained pair
computes (``mtp-bindings scale-pair``), in f16, q8_0 and q4_K, cached under the user cache directory.

The construction (zero padding, rescaled norms, added heads/units/layers with zero output
projections, RoPE dimensions placed to keep their frequencies, padding tokens held at the softcap
floor) is explained in :mod:`mtp_bindings.scale_pair.tensors`. Token ids of the trained vocabulary keep
their meaning, so prompts for the small pair work unchanged. File names say size, role and weight
type: ``e2b-target-q4_K.gguf``, ``e2b-assistant-centroid-f16.gguf``, ``e2b-assistant-dense-f16.gguf``
(the dense-head assistant has no centroid tensors: what upstream's converter would give).
``q4_K`` is llama.cpp's Q4_K_M mix (what Gemma 4 E2B users download), ``q8_0`` pure Q8_0.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import logging
import math
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from . import tensors as st
from .writer import VOCAB_PAD_KEY, Source, quantize, read_source, write_gguf
from ..exceptions import InvalidParameterError, ModelFileNotFoundError, ModelLoadError

logger = logging.getLogger(__name__)

#: Bump when the construction changes: it is part of the cache key.
CONSTRUCTION_VERSION = 1
TYPES = ("f16", "q8_0", "q4_K")
BUNDLED = Path(__file__).parent.parent / "models"
#: Gemma 4 E2B's text decoder: 35 layers, every fifth one full attention (True = sliding window).
E2B_LAYERS = tuple(i % 5 != 4 for i in range(35))


@dataclass(frozen=True)
class ScaleConfig:
    """Shapes of the scaled pair (defaults: Gemma 4 E2B's text decoder without per-layer embeddings,
    and its assistant; :meth:`small` for tests).

    Heads are E2B's (8 query heads, 1 K/V head, head_dim 256 / 512), not the trained head_dim
    with more heads: the trained 32 / 64 divide them (x8), so every rotary pair can sit where its
    frequency is the trained one, and the attention kernels, KV cache and RoPE run on E2B's real
    shapes (what a benchmark on this pair is for). The cost is rounding only: V's RMSNorm over the
    wider head gives sqrt(8) V, which the f16 KV cache rounds at other values (logits move by
    ~5e-3; see tests/test_scale_pair.py). The assistant's FFN width and query heads are not
    published; 2048 and 4 are the benchmark's assumption (``benchmark/models.py``)."""

    name: str = "e2b"
    layers: tuple[bool, ...] = E2B_LAYERS  # True = sliding-window layer
    hidden: int = 1536
    ffn: int = 6144
    n_head: int = 8
    n_head_kv: int = 1
    head_dim: int = 256          # sliding layers; 8x the trained 32, so RoPE frequencies stay exact
    global_head_dim: int = 512   # full layers; 8x the trained 64
    vocab: int = 262144
    a_hidden: int = 256
    a_ffn: int = 2048
    a_n_head: int = 4
    n_centroids: int = 2048
    centroid_top_k: int = 32
    seed: int = 0

    @classmethod
    def small(cls) -> ScaleConfig:
        """A few-second configuration with every feature of the full one (added layers, heads,
        FFN units, wider heads, padding tokens, a centroid head)."""
        return cls(name="small", layers=(True, True, False, True, True, False), hidden=256, ffn=1024,
                   n_head=8, n_head_kv=1, head_dim=64, global_head_dim=128, vocab=4096, a_hidden=128,
                   a_ffn=512, a_n_head=4, n_centroids=64, centroid_top_k=24)


@dataclass(frozen=True)
class ScaledPair:
    """The files of one scaled pair, by weight type."""

    directory: Path
    target: dict[str, Path]
    centroid: dict[str, Path]
    dense: dict[str, Path]
    cached: bool  # True when every file was found in the cache

    def paths(self) -> list[Path]:
        return [p for group in (self.target, self.centroid, self.dense) for p in group.values()]


def default_cache_dir() -> Path:
    """``$MTP_BINDINGS_CACHE``, else ``$XDG_CACHE_HOME/mtp-bindings``, else ``~/.cache/mtp-bindings``."""
    if env := os.environ.get("MTP_BINDINGS_CACHE"):
        return Path(env)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "mtp-bindings"


def cache_key(config: ScaleConfig, target: Path, assistant: Path) -> str:
    """Hash of everything the files depend on: the construction, the shapes and the trained pair."""
    h = hashlib.sha256()
    gains = {name: getattr(st, name) for name in ("DELTA", "FEATURE_GAIN", "PAD_ROW", "PRE_GAIN", "A_FEATURE_GAIN",
                                                  "POST_GAIN", "CENTROID_GAIN")}
    h.update(json.dumps({"version": CONSTRUCTION_VERSION, "config": dataclasses.asdict(config), "gains": gains},
                        sort_keys=True).encode())
    for p in (target, assistant):
        h.update(hashlib.sha256(p.read_bytes()).digest())
    return h.hexdigest()[:16]


def file_name(config: ScaleConfig, role: str, wtype: str) -> str:
    return f"{config.name}-{role}-{wtype}.gguf"


def scale_pair(config: ScaleConfig | None = None, *, types: Sequence[str] = TYPES,
               target: str | os.PathLike[str] | None = None, assistant: str | os.PathLike[str] | None = None,
               cache_dir: str | os.PathLike[str] | None = None, threads: int | None = None,
               progress: bool = True, force: bool = False) -> ScaledPair:
    """Build (or find cached) the scaled target, centroid-head and dense-head assistant of the
    trained pair ``target`` + ``assistant`` (default: the bundled one) in each of ``types``.

    Raises :class:`InvalidParameterError` for shapes the construction cannot keep exact and
    :class:`ModelLoadError` for unreadable inputs."""
    config = config or ScaleConfig()
    bad = [t for t in types if t not in TYPES]
    if bad or not types:
        raise InvalidParameterError(f"weight types must be among {', '.join(TYPES)}, got {list(types)!r}")
    src_t = _existing(target or BUNDLED / "trained-target.gguf")
    src_a = _existing(assistant or BUNDLED / "trained-assistant.gguf")
    directory = Path(cache_dir or default_cache_dir()) / "scale-pair" / cache_key(config, src_t, src_a)
    names = {role: {t: directory / file_name(config, role, t) for t in TYPES}
             for role in ("target", "assistant-centroid", "assistant-dense")}
    wanted = [names[role][t] for role in names for t in types]
    cached = not force and all(p.is_file() for p in wanted)
    if cached:
        logger.info("scale-pair: found cached in %s", directory)
    else:
        _build(config, src_t, src_a, names, types, threads, progress, force)
        (directory / "manifest.json").write_text(json.dumps(
            {"version": CONSTRUCTION_VERSION, "config": dataclasses.asdict(config),
             "sources": [str(src_t), str(src_a)], "files": sorted(p.name for p in directory.glob("*.gguf"))},
            indent=2) + "\n")
    return ScaledPair(directory, {t: names["target"][t] for t in types},
                      {t: names["assistant-centroid"][t] for t in types},
                      {t: names["assistant-dense"][t] for t in types}, cached)


def _existing(path: str | os.PathLike[str]) -> Path:
    p = Path(path)
    if not p.is_file():
        raise ModelFileNotFoundError(f"no such file: {p}")
    return p


def _build(config: ScaleConfig, src_t: Path, src_a: Path, names: dict[str, dict[str, Path]],
           types: Sequence[str], threads: int | None, progress: bool, force: bool) -> None:
    """Write the f16 files (always: the quantized ones are made from them), quantize, and remove the
    f16 files this call wrote unless they were asked for."""
    from tqdm import tqdm

    target, assistant = read_source(src_t), read_source(src_a)
    if target.arch != "gemma4" or assistant.arch != "gemma4-assistant":
        raise ModelLoadError(f"expected a gemma4 target and a gemma4-assistant (upstream layout) assistant, "
                             f"got {target.arch!r} and {assistant.arch!r}")
    tside, aside = _sides(config, target, assistant)
    t_tensors, t_fields = target_spec(config, target, tside)
    a_tensors, a_fields, (c_tensors, c_fields) = assistant_spec(config, target, assistant, tside, aside)
    names["target"]["f16"].parent.mkdir(parents=True, exist_ok=True)
    plan = [("target", target, t_tensors, t_fields),
            ("assistant-centroid", assistant, {**a_tensors, **c_tensors}, {**a_fields, **c_fields}),
            ("assistant-dense", assistant, a_tensors, a_fields)]
    written = []
    for role, source, tensors, fields in plan:
        path = names[role]["f16"]
        if force or not path.is_file():
            write_gguf(path, source, fields, tensors, progress=progress, desc=path.name)
            written.append(path)
    todo = [names[role][w] for w in types if w != "f16" for role in names
            if force or not names[role][w].is_file()]
    with tqdm(total=len(todo), unit="file", desc="quantizing", disable=not progress or not todo) as bar:
        for path in todo:
            role, wtype = path.stem.removeprefix(f"{config.name}-").rsplit("-", 1)
            bar.set_postfix_str(path.name)
            quantize(names[role]["f16"], path, wtype, threads)
            bar.update()
    if "f16" not in types:
        # f16 files written only as the quantizer's input: at E2B size 3.7 of the 4.7 GB they would keep
        for path in written:
            path.unlink(missing_ok=True)


def _check_heads(config: ScaleConfig, t: Source) -> tuple[int, int]:
    """The head_dim growth factors (sliding, full); RoPE must rotate whole heads in the trained pair."""
    k = []
    for small, big, rot in ((t.key("attention.key_length_swa"), config.head_dim, t.key("rope.dimension_count_swa")),
                            (t.key("attention.key_length"), config.global_head_dim, t.key("rope.dimension_count"))):
        if rot != small:
            raise InvalidParameterError(f"trained RoPE rotates {rot} of {small} head dimensions; only full rotation is supported")
        if big % small:
            raise InvalidParameterError(f"head_dim {big} is not a multiple of the trained {small}")
        k.append(big // small)
    return k[0], k[1]


def _sides(config: ScaleConfig, t: Source, a: Source) -> tuple[st.Side, st.Side]:
    """Target and assistant geometry; raises for shapes the construction cannot keep exact."""
    _check_heads(config, t)
    hd_src = (int(t.key("attention.key_length_swa")), int(t.key("attention.key_length")))
    hd = (config.head_dim, config.global_head_dim)
    t_h, a_h = int(t.key("embedding_length")), int(a.key("embedding_length"))
    for what, new, old in (("hidden", config.hidden, t_h), ("ffn", config.ffn, t.key("feed_forward_length")),
                           ("n_head", config.n_head, t.key("attention.head_count")),
                           ("n_head_kv", config.n_head_kv, t.key("attention.head_count_kv")),
                           ("vocab", config.vocab, t.n_vocab), ("a_hidden", config.a_hidden, a_h),
                           ("a_ffn", config.a_ffn, a.key("feed_forward_length")),
                           ("a_n_head", config.a_n_head, a.key("attention.head_count"))):
        if new < int(old):
            raise InvalidParameterError(f"{what} {new} is smaller than the trained {old}")
    if config.vocab > t.n_vocab and not _added(config, t):
        raise InvalidParameterError("padding tokens need at least one added layer (it makes the feature that holds them down)")
    kv_src = int(t.key("attention.head_count_kv"))
    tside = st.Side(t_h, config.hidden, config.ffn, int(t.key("attention.head_count")), config.n_head,
                    kv_src, config.n_head_kv, hd_src, hd, 1 / math.sqrt(config.hidden / t_h), 1.0,
                    st.feature_dim(t_h, config.hidden))
    r_a = config.a_hidden / a_h
    aside = st.Side(a_h, config.a_hidden, config.a_ffn, int(a.key("attention.head_count")), config.a_n_head,
                    kv_src, config.n_head_kv, hd_src, hd, 1 / math.sqrt(r_a), 1 / math.sqrt(r_a),
                    st.feature_dim(a_h, config.a_hidden))
    return tside, aside


def _added(config: ScaleConfig, t: Source) -> list[int]:
    placed = set(st.place_layers(t.swa, config.layers))
    return [j for j in range(len(config.layers)) if j not in placed]


def target_spec(config: ScaleConfig, t: Source, side: st.Side) -> tuple[dict[str, st.Lazy], dict[str, Any]]:
    """Tensors and metadata of the scaled target."""
    placed = st.place_layers(t.swa, config.layers)
    added = _added(config, t)
    feature_layer = max(added) if added else -1
    s = t.tensors
    tensors: dict[str, st.Lazy] = {
        "rope_freqs.weight": st.lazy((config.global_head_dim // 2,), np.float32, st.rope_freqs,
                                     s["rope_freqs.weight"], config.global_head_dim // 2),
        "token_embd.weight": st.lazy((config.vocab, config.hidden), np.float16, st.pad_embedding,
                                     s["token_embd.weight"], config.vocab, config.hidden, side.feature),
    }
    for j, swa in enumerate(config.layers):
        if j in placed:
            tensors.update(st.trained_layer(s, side, placed.index(j), j, swa, with_kv=True))
        else:
            tensors.update(st.added_layer(side, j, swa, feature=(j == feature_layer)))
    later = [float(s[f"blk.{i}.layer_output_scale.weight"][0]) for i, j in enumerate(placed) if j > feature_layer]
    gain = st.FEATURE_GAIN * st.product_sign(later)
    tensors["output_norm.weight"] = st.lazy((config.hidden,), np.float32, st.output_norm, s["output_norm.weight"],
                                            config.hidden, side.pre_scale, side.feature, gain)
    r = config.hidden / side.hidden_src
    fields = _common_fields(config, t, config.hidden, config.ffn, config.n_head, r)
    fields[f"{t.arch}.block_count"] = len(config.layers)
    fields[f"{t.arch}.attention.sliding_window_pattern"] = list(config.layers)
    fields["general.name"] = f"{config.name} scaled {t.field('general.name')}"
    fields["general.size_label"] = config.name
    return tensors, fields


def _common_fields(config: ScaleConfig, m: Source, hidden: int, ffn: int, n_head: int, r: float) -> dict[str, Any]:
    a = m.arch
    return {
        f"{a}.embedding_length": hidden, f"{a}.feed_forward_length": ffn, f"{a}.attention.head_count": n_head,
        f"{a}.attention.head_count_kv": config.n_head_kv,
        f"{a}.attention.key_length": config.global_head_dim, f"{a}.attention.value_length": config.global_head_dim,
        f"{a}.attention.key_length_swa": config.head_dim, f"{a}.attention.value_length_swa": config.head_dim,
        f"{a}.rope.dimension_count": config.global_head_dim, f"{a}.rope.dimension_count_swa": config.head_dim,
        f"{a}.attention.layer_norm_rms_epsilon": float(m.key("attention.layer_norm_rms_epsilon")) / r,
        "general.file_type": 1,
        VOCAB_PAD_KEY: config.vocab,  # write_gguf pads the token lists to it
    }


def assistant_spec(config: ScaleConfig, t: Source, a: Source, tside: st.Side, side: st.Side
                   ) -> tuple[dict[str, st.Lazy], dict[str, Any], tuple[dict[str, st.Lazy], dict[str, Any]]]:
    """Tensors and metadata of the scaled dense-head assistant, and what the centroid head adds."""
    s = a.tensors
    A, p, q = config.a_hidden, tside.feature, side.feature
    tensors: dict[str, st.Lazy] = {
        "rope_freqs.weight": st.lazy((config.global_head_dim // 2,), np.float32, st.rope_freqs,
                                     s["rope_freqs.weight"], config.global_head_dim // 2),
        "token_embd.weight": st.lazy((config.vocab, A), np.float16, st.pad_embedding, s["token_embd.weight"],
                                     config.vocab, A, q),
    }
    for i, swa in enumerate(a.swa):
        tensors.update(st.trained_layer(s, side, i, i, swa, with_kv=False))
    scales = [float(s[f"blk.{i}.layer_output_scale.weight"][0]) for i in range(len(a.swa))]
    tensors["output_norm.weight"] = st.lazy((A,), np.float32, st.output_norm, s["output_norm.weight"], A,
                                            side.pre_scale, q,
                                            st.A_FEATURE_GAIN * side.pre_scale * st.product_sign(scales))
    tensors["nextn.post_projection.weight"] = st.lazy((config.hidden, A), np.float16, st.post_projection,
                                                      s["nextn.post_projection.weight"], config.hidden, A, p, q)
    tensors["nextn.pre_projection.weight"] = st.lazy((A, 2 * config.hidden), np.float32, st.pre_projection,
                                                     s["nextn.pre_projection.weight"], A, tside.hidden_src,
                                                     config.hidden, p, q)
    fields = _common_fields(config, a, A, config.a_ffn, config.a_n_head, A / side.hidden_src)
    fields[f"{a.arch}.embedding_length_out"] = config.hidden
    fields["general.name"] = f"{config.name} scaled {a.field('general.name')}"
    fields["general.size_label"] = config.name
    cents, ordering = st.centroid_head(t.n_vocab, config.vocab, config.n_centroids, config.centroid_top_k, A, q,
                                       config.seed)
    extra_t = {"masked_embd_centroids.weight": st.lazy(cents.shape, np.float16, lambda: cents),
               "masked_embd_ordering": st.lazy(ordering.shape, np.int32, lambda: ordering)}
    extra_f = {f"{a.arch}.num_centroids": config.n_centroids,
               f"{a.arch}.centroid_intermediate_top_k": config.centroid_top_k}
    return tensors, fields, (extra_t, extra_f)


# --- command line -------------------------------------------------------------------------------


def _configure(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    parser.add_argument("--types", nargs="+", choices=TYPES, default=list(TYPES), help="weight types (default: all)")
    parser.add_argument("--small", action="store_true", help="the small test configuration instead of E2B's shapes")
    parser.add_argument("--target", type=Path, default=None, help="trained target GGUF (default: the bundled one)")
    parser.add_argument("--assistant", type=Path, default=None, help="trained assistant GGUF (default: the bundled one)")
    parser.add_argument("--cache-dir", type=Path, default=None, help=f"cache root (default: {default_cache_dir()})")
    parser.add_argument("-t", "--threads", type=int, default=None, help="quantization threads")
    parser.add_argument("--force", action="store_true", help="rebuild even when cached")
    parser.add_argument("--check", action="store_true",
                        help="compare the scaled pair with the trained one (logits, greedy tokens, drafts, padding)")
    parser.add_argument("--check-type", choices=TYPES, default="f16", help="weight type --check loads (default f16)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")
    parser.add_argument("-v", "--verbose", action="store_true", help="log what is written and loaded")
    parser.set_defaults(func=run)
    return parser


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register the ``scale-pair`` subcommand on an argparse ``subparsers`` object; it sets
    ``func=run`` (call ``args.func(args)``; a second argument is accepted and ignored)."""
    return _configure(subparsers.add_parser(
        "scale-pair", help="write an E2B-shaped pair that behaves exactly like the bundled trained pair",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter))


def run(args: argparse.Namespace, interrupt: object | None = None) -> int:
    """The command: build or find the files, print every path, optionally check them.
    (``interrupt``: the ``mtp-bindings`` CLI's Ctrl-C handler, passed to every command; unused.)"""
    config = ScaleConfig.small() if args.small else ScaleConfig()
    types = list(args.types)
    if args.check and args.check_type not in types:
        types.append(args.check_type)
    start = time.perf_counter()
    pair = scale_pair(config, types=types, target=args.target, assistant=args.assistant, cache_dir=args.cache_dir,
                      threads=args.threads, progress=not args.no_progress, force=args.force)
    took = time.perf_counter() - start
    for path in pair.paths():
        print(f"{path}  ({path.stat().st_size / 1e6:.1f} MB)")
    print(f"{'found cached' if pair.cached else 'built'} in {took:.1f} s: {pair.directory}")
    if args.check:
        from .check import check, format_report

        report = check(pair, config, args.check_type, target=args.target, assistant=args.assistant)
        print(format_report(report))
        return 0 if report["ok"] else 1
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = _configure(argparse.ArgumentParser(prog="python -m mtp_bindings.scale_pair", description=__doc__,
                                                formatter_class=argparse.RawDescriptionHelpFormatter))
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(message)s")
    try:
        return args.func(args)
    except (InvalidParameterError, ModelLoadError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2

