"""GGUF inspection without native code: ``info`` (summarise a file) and ``verify-assistant``
(check an MTP assistant's shapes, dtypes and metadata, in either layout, and say precisely what
is wrong), and rewriting one (another layout, renamed or retyped tensors). Reads and writes with
the ``gguf`` package (PyPI's gguf-py); :mod:`.header` checks a file's extent first."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import gguf
import numpy as np

from ..exceptions import ModelLoadError
from .header import Truncated, check_extent

UPSTREAM_ARCH = "gemma4-assistant"   # upstream converter: nextn.* tensors
DESIGN_ARCH = "gemma4_assistant"     # design doc layout: mtp.* tensors, I32 mtp.token_ordering
TARGET_ARCH = "gemma4"

# tensor names per layout: (pre_projection, post_projection, centroids, ordering)
LAYOUT_TENSORS = {
    UPSTREAM_ARCH: ("nextn.pre_projection.weight", "nextn.post_projection.weight",
                    "masked_embd_centroids.weight", "masked_embd_ordering"),
    DESIGN_ARCH: ("mtp.pre_projection.weight", "mtp.post_projection.weight",
                  "mtp.centroids.weight", "mtp.token_ordering.weight"),
}


@dataclass
class GGUFSummary:
    """What a GGUF holds, read from its header."""

    path: Path
    arch: str
    metadata: dict[str, Any]
    tensors: dict[str, tuple[str, tuple[int, ...]]]  # name -> (type name, shape in ggml order)
    file_size: int
    n_params: int = 0
    type_counts: dict[str, int] = field(default_factory=dict)

    def key(self, suffix: str, default: Any = None) -> Any:
        return self.metadata.get(f"{self.arch}.{suffix}", default)


def read_summary(path: str | os.PathLike[str]) -> GGUFSummary:
    """Parse ``path``'s header; raises :class:`ModelLoadError` for anything that is not a readable
    GGUF (missing, not a GGUF, truncated, corrupt), saying which."""
    p = Path(path)
    if not p.is_file():
        raise ModelLoadError(f"no such file: {p}")
    with open(p, "rb") as f:
        magic = f.read(4)
    if magic != b"GGUF":
        raise ModelLoadError(f"{p} is not a GGUF file (starts with {magic!r}, expected b'GGUF')")
    try:
        check_extent(p)
        reader = gguf.GGUFReader(str(p), "r")
    except Truncated as e:
        raise ModelLoadError(f"{p} is truncated: {e}") from None
    except ValueError as e:
        raise ModelLoadError(f"{p} is corrupt, not a readable GGUF: {e}") from None
    except Exception as e:  # the reader raises IndexError, KeyError, ...
        raise ModelLoadError(f"{p} is corrupt, not a readable GGUF: {type(e).__name__}: {e}") from None
    meta: dict[str, Any] = {}
    for name, field in reader.fields.items():
        if name.startswith("tokenizer.ggml.") and name.split(".")[-1] in ("tokens", "scores", "token_type", "merges"):
            meta[name] = f"<{len(field.data)} entries>"
            continue
        try:
            meta[name] = field.contents()
        except Exception:
            meta[name] = "<unreadable>"
    tensors = {}
    n_params = 0
    counts: dict[str, int] = {}
    for t in reader.tensors:
        shape = tuple(int(x) for x in t.shape)
        tname = t.tensor_type.name
        tensors[t.name] = (tname, shape)
        n_params += int(np.prod(shape)) if shape else 1
        counts[tname] = counts.get(tname, 0) + 1
    return GGUFSummary(p, str(meta.get("general.architecture", "")), meta, tensors, p.stat().st_size,
                       n_params, counts)


def verify_assistant(path: str | os.PathLike[str], target: str | os.PathLike[str] | None = None) -> list[str]:
    """Every problem found with the assistant GGUF at ``path`` (empty list: it is valid).

    Checks the design doc's section 3 invariants: architecture, the pre/post backbone projections,
    per-layer tensors, the centroid head (centroids + I32 ordering of ``n_vocab`` ids, never
    quantized, ``n_vocab`` divisible by ``n_centroids``, top-k in range) and, with ``target``, that
    the backbone width and vocabulary fit the target.
    """
    try:
        s = read_summary(path)
    except ModelLoadError as e:
        return [str(e)]
    problems: list[str] = []
    if s.arch not in LAYOUT_TENSORS:
        return [f"architecture is {s.arch!r}, expected {UPSTREAM_ARCH!r} or {DESIGN_ARCH!r}"]
    pre_name, post_name, cent_name, ord_name = LAYOUT_TENSORS[s.arch]

    n_embd = s.key("embedding_length")
    n_bb = s.key("embedding_length_out") or s.key("n_embd_backbone")
    n_layer = s.key("block_count")
    for what, v in (("embedding_length", n_embd), ("embedding_length_out (backbone width)", n_bb),
                    ("block_count", n_layer)):
        if not isinstance(v, int) or v <= 0:
            problems.append(f"metadata {s.arch}.{what} is missing or not a positive integer ({v!r})")
    if problems:
        return problems

    def need(name: str, shape: tuple[int, ...] | None) -> tuple[str, tuple[int, ...]] | None:
        t = s.tensors.get(name)
        if t is None:
            problems.append(f"tensor {name} is missing")
            return None
        if shape is not None and t[1] != shape:
            problems.append(f"tensor {name} has shape {list(t[1])}, expected {list(shape)}")
        return t

    emb = need("token_embd.weight", None)
    n_vocab = emb[1][1] if emb and len(emb[1]) == 2 else None
    if emb and (len(emb[1]) != 2 or emb[1][0] != n_embd):
        problems.append(f"tensor token_embd.weight has shape {list(emb[1])}, expected [{n_embd}, n_vocab]")
    need("output_norm.weight", (n_embd,))
    need(pre_name, (2 * n_bb, n_embd))
    need(post_name, (n_embd, n_bb))
    for il in range(n_layer):
        for part in ("attn_norm", "attn_q", "attn_q_norm", "attn_output", "post_attention_norm", "ffn_norm",
                     "ffn_gate", "ffn_up", "ffn_down", "post_ffw_norm"):
            need(f"blk.{il}.{part}.weight", None)

    cent = s.tensors.get(cent_name)
    order = s.tensors.get(ord_name)
    if (cent is None) != (order is None):
        present, missing = (cent_name, ord_name) if cent is not None else (ord_name, cent_name)
        problems.append(f"centroid head is incomplete: {present} is present but {missing} is missing")
    elif cent is not None and order is not None:
        n_cent = cent[1][1] if len(cent[1]) == 2 else None
        if len(cent[1]) != 2 or cent[1][0] != n_embd:
            problems.append(f"tensor {cent_name} has shape {list(cent[1])}, expected [{n_embd}, n_centroids]")
        if order[0] != "I32":
            problems.append(f"tensor {ord_name} has type {order[0]}, expected I32 (the ordering must never be quantized)")
        if n_vocab is not None and order[1] != (n_vocab,):
            problems.append(f"tensor {ord_name} has shape {list(order[1])}, expected [{n_vocab}] (n_vocab)")
        if n_cent and n_vocab and n_vocab % n_cent:
            problems.append(f"n_vocab {n_vocab} is not divisible by n_centroids {n_cent}")
        meta_c = s.key("num_centroids", s.key("n_centroids"))
        if meta_c is not None and meta_c != n_cent:
            problems.append(f"metadata {s.arch}.num_centroids = {meta_c} but {cent_name} has {n_cent} centroids")
        top_k = s.key("centroid_intermediate_top_k", s.key("centroid_top_k"))
        if top_k is not None and n_cent and not 1 <= top_k <= n_cent:
            problems.append(f"metadata {s.arch}.centroid_intermediate_top_k = {top_k} is outside 1..{n_cent}")

    if target is not None:
        try:
            t = read_summary(target)
        except ModelLoadError as e:
            return problems + [f"target: {e}"]
        if t.arch != TARGET_ARCH:
            problems.append(f"target architecture is {t.arch!r}, expected {TARGET_ARCH!r}")
        t_embd = t.key("embedding_length")
        if t_embd != n_bb:
            problems.append(f"backbone width {n_bb} does not match the target's hidden size {t_embd}")
        t_emb = t.tensors.get("token_embd.weight")
        if t_emb and n_vocab is not None and len(t_emb[1]) == 2 and abs(t_emb[1][1] - n_vocab) > 128:
            problems.append(f"vocabulary sizes differ too much: assistant {n_vocab}, target {t_emb[1][1]}")
    return problems


def rewrite_gguf(src: str | os.PathLike[str], dst: str | os.PathLike[str], *, arch: str | None = None,
                 rename_tensors: dict[str, str] | None = None, drop_tensors: set[str] | frozenset[str] = frozenset(),
                 retype: dict[str, Any] | None = None, rename_keys: dict[str, str] | None = None,
                 drop_keys: set[str] | frozenset[str] = frozenset(), add_keys: dict[str, Any] | None = None) -> Path:
    """Copy a GGUF with tensors/keys renamed, dropped or retyped (same tensor data otherwise).

    Keys are renamed after the architecture prefix is switched (``<old arch>.`` -> ``<arch>.``)."""
    reader = gguf.GGUFReader(str(src))
    old_arch = str(reader.fields["general.architecture"].contents())
    new_arch = arch or old_arch
    writer = gguf.GGUFWriter(str(dst), new_arch)
    for name, f in reader.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture" or name in drop_keys:
            continue
        key = new_arch + name[len(old_arch):] if name.startswith(old_arch + ".") else name
        key = (rename_keys or {}).get(key, key)
        sub = f.types[-1] if f.types[0] == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(key, f.contents(), f.types[0], sub)
    for key, (value, vtype) in (add_keys or {}).items():
        writer.add_key_value(key, value, vtype)
    for t in reader.tensors:
        if t.name in drop_tensors:
            continue
        data = np.array(t.data)
        if retype and t.name in retype:
            data = data.astype(retype[t.name])
        raw_shape = [int(x) for x in reversed(t.shape)] if data.dtype == np.uint8 else None
        writer.add_tensor((rename_tensors or {}).get(t.name, t.name), data, raw_shape=raw_shape,
                          raw_dtype=t.tensor_type if raw_shape else None)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return Path(dst)


def to_design_layout(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> Path:
    """Rewrite an upstream-layout assistant (``gemma4-assistant``, ``nextn.*``) in the design doc's
    layout (``gemma4_assistant``, ``mtp.*``, I32 ``mtp.token_ordering.weight``); same weights."""
    s = read_summary(src)
    if s.arch != UPSTREAM_ARCH:
        raise ModelLoadError(f"{src} is not an upstream-layout assistant (architecture {s.arch!r})")
    up, design = LAYOUT_TENSORS[UPSTREAM_ARCH], LAYOUT_TENSORS[DESIGN_ARCH]
    centroid = up[2] in s.tensors
    add = {f"{DESIGN_ARCH}.n_embd_backbone": (int(s.key("embedding_length_out")), gguf.GGUFValueType.UINT32),
           f"{DESIGN_ARCH}.use_ordered_embeddings": (centroid, gguf.GGUFValueType.BOOL)}
    rename_keys = {f"{DESIGN_ARCH}.num_centroids": f"{DESIGN_ARCH}.n_centroids",
                   f"{DESIGN_ARCH}.centroid_intermediate_top_k": f"{DESIGN_ARCH}.centroid_top_k"}
    return rewrite_gguf(src, dst, arch=DESIGN_ARCH, rename_tensors=dict(zip(up, design)), rename_keys=rename_keys,
                        drop_keys={f"{UPSTREAM_ARCH}.embedding_length_out", f"{UPSTREAM_ARCH}.nextn_predict_layers"},
                        add_keys=add)


def _head(s: GGUFSummary) -> str:
    """An assistant's LM head: ``centroid`` (centroids + token ordering) or ``dense``."""
    return "centroid" if LAYOUT_TENSORS[s.arch][2] in s.tensors else "dense"


def _layout(s: GGUFSummary) -> str:
    return "upstream (nextn.*)" if s.arch == UPSTREAM_ARCH else "design (mtp.*)"


def describe_assistant_head(path: str | os.PathLike[str]) -> str:
    """One line about an assistant GGUF: its head type, layout and size (``-v`` of the CLI)."""
    s = read_summary(path)
    if s.arch not in LAYOUT_TENSORS:
        return f"architecture {s.arch!r}"
    return f"{_head(s)} head, {_layout(s)} layout, {s.n_params / 1e6:.2f}M params"


def describe(path: str | os.PathLike[str], target: str | os.PathLike[str] | None = None) -> str:
    """A human summary of a GGUF (the ``info`` command)."""
    s = read_summary(path)
    lines = [
        f"file          {s.path} ({s.file_size / 1e6:.2f} MB)",
        f"architecture  {s.arch}",
        f"name          {s.metadata.get('general.name', '')}",
        f"parameters    {s.n_params:,}",
        f"tensor types  " + ", ".join(f"{k} x{v}" for k, v in sorted(s.type_counts.items())),
    ]
    for key in ("embedding_length", "block_count", "embedding_length_out", "attention.sliding_window",
                "attention.head_count", "attention.head_count_kv", "context_length"):
        v = s.key(key)
        if v is not None:
            lines.append(f"{key:<28}{v}")
    emb = s.tensors.get("token_embd.weight")
    if emb:
        lines.append(f"{'n_vocab':<28}{emb[1][-1]}")
    if s.arch in LAYOUT_TENSORS:
        lines.append(f"{'mtp layout':<28}{_layout(s)}")
        lines.append(f"{'lm head':<28}{_head(s)}")
        problems = verify_assistant(path, target)
        verdict = "compatible" if not problems else "NOT compatible: " + "; ".join(problems)
        lines.append(f"{'mtp check':<28}{verdict}" + (f" (with target {target})" if target else ""))
    return "\n".join(lines)
