"""The tensor arithmetic of ``scale_pair``: every tensor of a wider, deeper Gemma 4 target and
assistant computed from a small trained pair so that the large pair computes the same function.

Notation: ``H`` the trained target width, ``H'`` the new one, ``r = H'/H``; ``h``/``h'`` a head
dimension and ``k = h'/h``; the assistant's widths ``A``/``A'``, ``r_a = A'/A``. Matrices are numpy
arrays ``[out, in]`` (the reverse of ggml's order). Why each piece keeps the function:

* Target residual stream: real dimensions first, the rest zero. Token embeddings are copied, so the
  input ``E[t] * sqrt(H')`` is ``c = sqrt(r)`` times the trained one. Pre-norms (attention, FFN,
  output) then see ``c x`` padded with zeros: their RMS over ``H'`` equals the trained RMS over
  ``H`` and weights ``w / sqrt(r)`` give the trained normalised values. Branch outputs are the
  trained ones (same weights, same inputs); their post-norm over ``H'`` gives ``sqrt(r)`` times the
  trained value, which is exactly the ``c`` the residual needs, so post-norm weights are copied.
* Heads: ``h' = k h``. Q/K norms over ``h'`` of a zero-padded head give ``sqrt(k)`` times the
  trained value: weights ``w / sqrt(k)``. V's weightless norm gives ``sqrt(k)`` times V; the
  attention output is linear in V and the post-attention RMSNorm is scale-invariant, so it is
  absorbed there. Rotary pairs (NEOX: dimension ``i`` rotates with ``i + h/2`` at frequency
  ``base^(-2i/h)``) are placed at ``k i`` / ``h'/2 + k i``, whose frequency ``base^(-2ki/h')`` is the
  same; ``rope_freqs[j] = rope_freqs_trained[j // k]`` keeps the proportional-RoPE factors.
  Added query heads have zero output projections.
* Added FFN units and added layers have zero output projections (and ``layer_output_scale`` 1), so
  the residual stream passes them unchanged. The trained layers keep their order; the last sliding
  and the last full trained layer become the last of their kind (the assistant attends into those).
* RMS epsilon: ``eps / r`` makes the FFN post-norms exact (their input is the trained branch
  output, whose mean square over ``H'`` is the trained one over ``r``). Pre-norms, head norms and
  the attention post-norm then see an effective epsilon off by a factor of at most ``max(r, k)``:
  a relative change of ``eps / (2 mean square)``, ~1e-6 for values of order 1, far below the f16
  rounding of activations (the tests measure the total).
* Padding tokens (ids past the trained vocabulary) must never win and get negligible probability.
  Logits are linear in the final normed hidden state, so that needs a feature that is always
  positive. One added layer makes it: FFN units with ``gate = up = +-e_i`` output
  ``gelu(x_i) x_i + gelu(-x_i)(-x_i) = x_i^2 >= 0`` into the free dimension ``p``; that layer's
  post-FFN RMSNorm of a vector with a single non-zero entry is the constant ``sqrt(H') w[p]``, so
  the residual carries a tiny constant ``DELTA`` in ``p`` (changing later RMS values by ~1e-9
  relative), and the output norm's weight at ``p`` scales it up. Padding embedding rows are
  ``-PAD_ROW`` at ``p``: their logits sit at the softcap floor (-30).
* Assistant: its input ``concat(E'[x] sqrt(H'), h')`` is ``(c e, h)``: pre-projection columns of the
  embedding half are divided by ``sqrt(r)`` (kept in F32: the quotient is not an f16 value). Its
  residual is then the trained one, zero-padded: all its norm weights are ``w / sqrt(r_a)``,
  epsilon ``eps / r_a``. The target's feature ``h'[p] > 0`` is carried into an assistant dimension
  ``q`` by one pre-projection weight and back into ``p`` by one post-projection weight, so every
  draft step has ``h_a[q] > 0``: padding rows of its embedding are ``-PAD_ROW`` at ``q``, and the
  centroid head's clusters holding real tokens score ``+CENTROID_GAIN h_a[q] > 0`` while all
  others score 0, so they are always among the top-k and the drafted argmax is the dense one.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from ..exceptions import InvalidParameterError

# Magnitudes of the positive feature. Every entry that lands in a quantized matrix stays >= 1e-2 so
# that q8_0/q4_K block scales (f16) hold it; the values the feature takes stay small where they
# enter RMS norms (relative RMS change ~(value / RMS)^2 / width) and O(0.1) where they enter
# quantized matmuls as activations (blocks of activations are scaled by their largest entry).
#: Residual value of the target's feature (residual entries are O(1) and up).
DELTA = 1e-3
#: Target output-norm weight at p: h'[p] = FEATURE_GAIN * DELTA / rms(final residual).
FEATURE_GAIN = 1e3
#: The one non-zero entry of a padding token's embedding row (f16-representable).
PAD_ROW = 3e4
#: Pre-projection weight h'[p] -> assistant dimension q (q stays ~1e-3 in the assistant residual).
PRE_GAIN = 1e-2
#: Assistant output-norm weight at q (times its norms' 1/sqrt(r_a), like every other norm weight),
#: post-projection weight q -> p, centroid weight at q. The feature goes round a loop, h[p] -> q ->
#: h_a[q] -> h_next[p], once per draft step: these make its gain ~1 at the trained pair's typical
#: RMS values, so it neither dies out nor grows over a round of drafts (the tests measure it).
A_FEATURE_GAIN = 5e2
POST_GAIN = 0.8
CENTROID_GAIN = 1.0


@dataclass(frozen=True)
class Lazy:
    """A tensor to write: shape and dtype known up front, values made on demand (one at a time)."""

    shape: tuple[int, ...]
    dtype: type
    make: Callable[[], np.ndarray]


def lazy(shape: tuple[int, ...], dtype: type, fn: Callable[..., np.ndarray], *args: object, **kw: object) -> Lazy:
    return Lazy(tuple(int(x) for x in shape), dtype, lambda: np.asarray(fn(*args, **kw), dtype=dtype))


@dataclass(frozen=True)
class Side:
    """One model's trained and new widths, and how its norm weights are rescaled."""

    hidden_src: int
    hidden: int
    ffn: int
    n_head_src: int
    n_head: int
    kv_src: int           # K/V heads the query heads are grouped over (the target's, for the assistant)
    kv: int
    hd_src: tuple[int, int]   # (sliding, full) trained head_dim
    hd: tuple[int, int]       # (sliding, full) new head_dim
    pre_scale: float      # multiplier of pre-norm (and output-norm) weights
    post_scale: float     # multiplier of post-norm weights
    feature: int          # the free dimension carrying the positive feature

    def head_dims(self, swa: bool) -> tuple[int, int]:
        return (self.hd_src[0], self.hd[0]) if swa else (self.hd_src[1], self.hd[1])


def place_layers(src: Sequence[bool], dst: Sequence[bool]) -> list[int]:
    """Index in ``dst`` of each ``src`` layer (True = sliding window): order and kind kept, the rest
    in order from the start, but the last layer of each kind at the last of its kind in ``dst``:
    the assistant attends into those (upstream's drafter reads layers n-2 and n-1)."""
    if len(dst) < len(src):
        raise InvalidParameterError(f"{len(dst)} layers cannot hold the {len(src)} trained ones")
    if len(dst) < 2 or not (dst[-2] and not dst[-1]):
        raise InvalidParameterError("the layer pattern must end [sliding, full] (upstream's drafter reads n-2 and n-1)")
    last_src = {kind: max(i for i, k in enumerate(src) if k == kind) for kind in set(src)}
    last_dst = {kind: max(i for i, k in enumerate(dst) if k == kind) for kind in set(dst)}
    out: list[int] = []
    nxt = 0
    for i, kind in enumerate(src):
        if i == last_src[kind]:
            j = last_dst[kind]
        else:
            j = next((j for j in range(nxt, len(dst)) if dst[j] == kind), -1)
        if j < nxt:
            raise InvalidParameterError(f"the layer pattern cannot hold the trained pattern {list(src)} in order")
        out.append(j)
        nxt = j + 1
    return out


def head_dim_map(small: int, big: int) -> np.ndarray:
    """Where each trained head dimension goes so that rotary pairs keep their frequencies."""
    if big % small or small % 2:
        raise InvalidParameterError(f"head_dim {big} is not an integer multiple of the trained {small}")
    k, half = big // small, small // 2
    d = np.arange(small)
    return np.where(d < half, k * d, big // 2 + k * (d - half))


def head_rows(side: Side, swa: bool, kv: bool) -> np.ndarray:
    """Row of the new Q (or K/V) projection for each row of the trained one. Query head ``h`` stays
    in the group of its K/V head and keeps its slot in the group."""
    small, big = side.head_dims(swa)
    dmap = head_dim_map(small, big)
    n_src = side.kv_src if kv else side.n_head_src
    group_s, group_d = side.n_head_src // side.kv_src, side.n_head // side.kv
    heads = [h if kv else (h // group_s) * group_d + h % group_s for h in range(n_src)]
    return np.concatenate([hb * big + dmap for hb in heads])


def pad2(a: np.ndarray, shape: tuple[int, int], rows: np.ndarray | None = None, cols: np.ndarray | None = None,
         dtype: type = np.float16) -> np.ndarray:
    """``a`` placed in a zero matrix of ``shape`` (rows/cols: index maps, default the leading ones)."""
    out: np.ndarray = np.zeros(shape, dtype=dtype)
    r = np.arange(a.shape[0]) if rows is None else rows
    c = np.arange(a.shape[1]) if cols is None else cols
    out[np.ix_(r, c)] = a
    return out


def pad1(a: np.ndarray, n: int, scale: float = 1.0, idx: np.ndarray | None = None) -> np.ndarray:
    """F32 vector of length ``n``: ``a * scale`` at ``idx`` (default the leading entries), zeros elsewhere."""
    out = np.zeros(n, dtype=np.float32)
    out[np.arange(a.size) if idx is None else idx] = a.astype(np.float64) * scale
    return out


def feature_dim(real: int, width: int) -> int:
    """A free dimension for the positive feature, alone in its 256-wide block when the width allows:
    quantized matmuls quantize activations per block, scaled by the block's largest value."""
    if real >= width:
        raise InvalidParameterError(f"width {width} leaves no free dimension past the trained {real}")
    p = -(-real // 256) * 256
    return p if p < width else real


def product_sign(values: Sequence[float]) -> float:
    """Sign of a product (the residual feature is multiplied by later layers' output scales)."""
    return -1.0 if sum(float(v) < 0 for v in values) % 2 else 1.0


def trained_layer(s: dict[str, np.ndarray], side: Side, i: int, j: int, swa: bool, with_kv: bool) -> dict[str, Lazy]:
    """Trained layer ``i`` as layer ``j`` of the new model."""
    small, big = side.head_dims(swa)
    k = big // small
    dmap = head_dim_map(small, big)
    q_rows = head_rows(side, swa, kv=False)
    H, F, nq = side.hidden, side.ffn, side.n_head * big
    f16, f32 = np.float16, np.float32

    def src(name: str) -> np.ndarray:
        return s[f"blk.{i}.{name}.weight"]

    out: dict[str, Lazy] = {
        "attn_norm": lazy((H,), f32, pad1, src("attn_norm"), H, side.pre_scale),
        "attn_q": lazy((nq, H), f16, pad2, src("attn_q"), (nq, H), rows=q_rows),
        "attn_q_norm": lazy((big,), f32, pad1, src("attn_q_norm"), big, 1 / math.sqrt(k), dmap),
        "attn_output": lazy((H, nq), f16, pad2, src("attn_output"), (H, nq), cols=q_rows),
        "post_attention_norm": lazy((H,), f32, pad1, src("post_attention_norm"), H, side.post_scale),
        "ffn_norm": lazy((H,), f32, pad1, src("ffn_norm"), H, side.pre_scale),
        "ffn_gate": lazy((F, H), f16, pad2, src("ffn_gate"), (F, H)),
        "ffn_up": lazy((F, H), f16, pad2, src("ffn_up"), (F, H)),
        "ffn_down": lazy((H, F), f16, pad2, src("ffn_down"), (H, F)),
        "post_ffw_norm": lazy((H,), f32, pad1, src("post_ffw_norm"), H, side.post_scale),
        "layer_output_scale": lazy((1,), f32, np.asarray, src("layer_output_scale")),
    }
    if with_kv:
        kv_rows = head_rows(side, swa, kv=True)
        n_kv = side.kv * big
        out["attn_k"] = lazy((n_kv, H), f16, pad2, src("attn_k"), (n_kv, H), rows=kv_rows)
        out["attn_v"] = lazy((n_kv, H), f16, pad2, src("attn_v"), (n_kv, H), rows=kv_rows)
        out["attn_k_norm"] = lazy((big,), f32, pad1, src("attn_k_norm"), big, 1 / math.sqrt(k), dmap)
    return {f"blk.{j}.{name}.weight": t for name, t in out.items()}


def added_layer(side: Side, j: int, swa: bool, feature: bool) -> dict[str, Lazy]:
    """An added target layer: zero output projections and output scale 1, so the residual passes
    unchanged. With ``feature`` its FFN writes the positive constant ``DELTA`` into ``side.feature``
    (see the module doc)."""
    big = side.head_dims(swa)[1]
    H, F, nq, nkv = side.hidden, side.ffn, side.n_head * big, side.kv * big
    f16, f32 = np.float16, np.float32

    def z(*shape: int) -> Lazy:
        dtype = f32 if len(shape) == 1 else f16
        return lazy(shape, dtype, np.zeros, shape, dtype)

    out: dict[str, Lazy] = {
        "attn_norm": z(H), "attn_q": z(nq, H), "attn_q_norm": z(big), "attn_output": z(H, nq),
        "attn_k": z(nkv, H), "attn_v": z(nkv, H), "attn_k_norm": z(big),
        "post_attention_norm": z(H), "ffn_norm": z(H), "ffn_gate": z(F, H), "ffn_up": z(F, H),
        "ffn_down": z(H, F), "post_ffw_norm": z(H), "layer_output_scale": lazy((1,), f32, np.ones, 1),
    }
    if feature:
        n = min(side.hidden_src, F // 2)
        out["ffn_norm"] = lazy((H,), f32, pad1, np.ones(side.hidden_src), H)
        out["ffn_gate"] = out["ffn_up"] = lazy((F, H), f16, _feature_units, n, F, H)
        out["ffn_down"] = lazy((H, F), f16, _feature_down, n, F, H, side.feature)
        out["post_ffw_norm"] = lazy((H,), f32, pad1, np.array([DELTA / math.sqrt(H)]), H, 1.0,
                                    np.array([side.feature]))
    return {f"blk.{j}.{name}.weight": t for name, t in out.items()}


def _feature_units(n: int, ffn: int, hidden: int) -> np.ndarray:
    """Gate/up rows: unit 2i reads +x_i, unit 2i+1 reads -x_i (their gelu(z) z sum to x_i^2 >= 0)."""
    out = np.zeros((ffn, hidden), dtype=np.float16)
    out[2 * np.arange(n), np.arange(n)] = 1
    out[2 * np.arange(n) + 1, np.arange(n)] = -1
    return out


def _feature_down(n: int, ffn: int, hidden: int, dim: int) -> np.ndarray:
    out = np.zeros((hidden, ffn), dtype=np.float16)
    out[dim, : 2 * n] = 1
    return out


def pad_embedding(src: np.ndarray, vocab: int, width: int, dim: int) -> np.ndarray:
    """Embedding ``[vocab, width]``: the trained rows, and ``-PAD_ROW`` at ``dim`` for every added token."""
    out = np.zeros((vocab, width), dtype=np.float16)
    out[: src.shape[0], : src.shape[1]] = src
    out[src.shape[0]:, dim] = -PAD_ROW
    return out


def rope_freqs(src: np.ndarray, n: int) -> np.ndarray:
    """Proportional-RoPE factors: pair ``j`` of the new head takes trained pair ``j // k``."""
    k = n // src.size
    return src.astype(np.float32)[np.arange(n) // k]


def output_norm(src: np.ndarray, width: int, scale: float, dim: int, gain: float) -> np.ndarray:
    out = pad1(src, width, scale)
    out[dim] = gain
    return out


def pre_projection(src: np.ndarray, a_width: int, backbone_src: int, backbone: int, p: int, q: int) -> np.ndarray:
    """``[A', 2H']`` in F32: embedding half divided by ``sqrt(r)``, hidden half copied, h'[p] -> q."""
    a_src = src.shape[0]
    out = np.zeros((a_width, 2 * backbone), dtype=np.float32)
    w = src.astype(np.float32)
    out[:a_src, :backbone_src] = w[:, :backbone_src] / np.float32(math.sqrt(backbone / backbone_src))
    out[:a_src, backbone:backbone + backbone_src] = w[:, backbone_src:]
    out[q, backbone + p] = PRE_GAIN
    return out


def post_projection(src: np.ndarray, backbone: int, a_width: int, p: int, q: int) -> np.ndarray:
    out = pad2(src, (backbone, a_width))
    out[p, q] = POST_GAIN
    return out


def centroid_head(n_vocab_src: int, vocab: int, n_centroids: int, top_k: int, width: int, q: int,
                  seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(centroids ``[C, A']``, I32 ordering ``[V']``): the trained tokens fill the first slots of a few
    clusters (at random cluster ids) that score ``CENTROID_GAIN h_a[q] > 0``; every other cluster
    scores 0 and holds padding tokens in random order."""
    if vocab % n_centroids:
        raise InvalidParameterError(f"vocab {vocab} is not a multiple of n_centroids {n_centroids}")
    per = vocab // n_centroids
    n_real = -(-n_vocab_src // per)
    if n_real > top_k:
        raise InvalidParameterError(f"the {n_vocab_src} trained tokens need {n_real} clusters, more than top-k {top_k}")
    rng = np.random.default_rng(seed)
    real_ids = rng.permutation(n_centroids)[:n_real]
    slots = np.empty((n_centroids, per), dtype=np.int32)
    others = np.setdiff1d(np.arange(n_centroids), real_ids)
    tokens = np.concatenate([np.arange(n_vocab_src), n_vocab_src + rng.permutation(vocab - n_vocab_src)])
    order = np.concatenate([real_ids, others])
    slots[order] = tokens.reshape(n_centroids, per).astype(np.int32)
    cents = np.zeros((n_centroids, width), dtype=np.float16)
    cents[real_ids, q] = CENTROID_GAIN
    return cents, slots.reshape(-1)
