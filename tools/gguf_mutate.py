"""Structured mutations of GGUF files, and a crash-isolating runner that feeds them to the loaders.

Used by the bounded test ``tests/test_malformed_files.py`` and by the longer campaign::

    python tools/gguf_mutate.py tests/fixtures/dense-target.gguf --cases 500 [--assistant-of T.gguf]
    python tools/gguf_mutate.py tests/fixtures/dense-target.gguf --cases 200 --vocab --modes model

Each case is loaded in its own subprocess (so a crash is caught, not suffered): the outcome must
be a valid load or a typed :class:`mtp_bindings.MTPBindingsError`; a signal or a hang is a bug.
"""

from __future__ import annotations

import argparse
import json
import random
import struct
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

# GGUF value types and their fixed sizes (strings and arrays are variable)
FIXED = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
STRING, ARRAY = 8, 9
VOCAB_KEY = b"tokenizer.ggml.tokens"  # its strings are the "vocab.elem.*" fields of the layout


@dataclass
class Field:
    """Where one header item sits in the file (offset, size) and what it is."""

    kind: str
    offset: int
    size: int


def parse_layout(data: bytes) -> list[Field]:
    """Offsets of the header, every key/value part and every tensor-info part."""
    out = [Field("magic", 0, 4), Field("version", 4, 4), Field("n_tensors", 8, 8), Field("n_kv", 16, 8)]
    n_tensors, n_kv = struct.unpack_from("<QQ", data, 8)
    off = 24

    def string(kind: str) -> None:
        nonlocal off
        (n,) = struct.unpack_from("<Q", data, off)
        out.append(Field(kind + ".len", off, 8))
        out.append(Field(kind + ".bytes", off + 8, n))
        off += 8 + n

    def value(vtype: int, kind: str) -> None:
        nonlocal off
        if vtype == STRING:
            string(kind)
        elif vtype == ARRAY:
            (etype, n) = struct.unpack_from("<IQ", data, off)
            out.append(Field(kind + ".atype", off, 4))
            out.append(Field(kind + ".alen", off + 4, 8))
            off += 12
            for _ in range(n):
                value(etype, kind + ".elem")
        else:
            out.append(Field(kind + ".value", off, FIXED[vtype]))
            off += FIXED[vtype]

    for _ in range(n_kv):
        string("kv.key")
        key = data[out[-1].offset:out[-1].offset + out[-1].size]
        (vtype,) = struct.unpack_from("<I", data, off)
        out.append(Field("kv.type", off, 4))
        off += 4
        value(vtype, "vocab" if key == VOCAB_KEY else "kv")
    for _ in range(n_tensors):
        string("tensor.name")
        (n_dims,) = struct.unpack_from("<I", data, off)
        out.append(Field("tensor.n_dims", off, 4))
        off += 4
        for _ in range(n_dims):
            out.append(Field("tensor.dim", off, 8))
            off += 8
        out.append(Field("tensor.type", off, 4))
        out.append(Field("tensor.offset", off + 4, 8))
        off += 12
    out.append(Field("data", off, len(data) - off))
    return out


INTERESTING = [0, 1, 2, 3, 7, 8, 0x7F, 0xFF, 0xFFFF, 0x7FFFFFFF, 0xFFFFFFFF, 2**31, 2**32, 2**40, 2**62, 2**63, 2**64 - 1]


def mutate(data: bytes, rng: random.Random, layout: list[Field]) -> tuple[bytes, str]:
    """One random structured mutation; returns the new bytes and a description."""
    buf = bytearray(data)
    op = rng.choice(["field", "field", "field", "truncate", "flip", "zero_tail"])
    if op == "truncate":
        cut = rng.randrange(0, len(buf))
        return bytes(buf[:cut]), f"truncate at {cut}/{len(buf)}"
    if op == "flip":
        header_end = next(f.offset for f in layout if f.kind == "data")
        pos = rng.randrange(0, max(1, header_end))
        buf[pos] ^= 1 << rng.randrange(8)
        return bytes(buf), f"flip a bit at {pos}"
    if op == "zero_tail":
        start = rng.randrange(len(buf) // 2, len(buf))
        buf[start:] = bytes(len(buf) - start)
        return bytes(buf), f"zero from {start}"
    candidates = [f for f in layout if f.kind != "data" and f.size in (1, 2, 4, 8)]
    f = rng.choice(candidates)
    v = rng.choice(INTERESTING) % (1 << (8 * f.size))
    buf[f.offset:f.offset + f.size] = v.to_bytes(f.size, "little")
    return bytes(buf), f"set {f.kind}@{f.offset} = {v}"


def mutate_vocab(data: bytes, rng: random.Random, layout: list[Field]) -> tuple[bytes, str]:
    """One mutation of a token's text (the sizes stay, so the file stays well-formed): another token's
    text of the same length (two tokens with one text), a NUL byte, a byte that is not UTF-8, or two
    tokens swapped."""
    buf = bytearray(data)
    texts = [f for f in layout if f.kind == "vocab.elem.bytes" and f.size > 0]
    f = rng.choice(texts)
    op = rng.choice(["duplicate", "nul", "not_utf8", "swap"])
    if op in ("duplicate", "swap"):
        text = data[f.offset:f.offset + f.size]
        same = [g for g in texts if g.size == f.size and data[g.offset:g.offset + g.size] != text]
        if same:
            g = rng.choice(same)
            a, b = text, data[g.offset:g.offset + g.size]
            buf[f.offset:f.offset + f.size] = b
            if op == "swap":
                buf[g.offset:g.offset + g.size] = a
            return bytes(buf), f"vocab {op} {a!r} <- {b!r}"
        op = "nul"  # no other token of this length
    i = f.offset + rng.randrange(f.size)
    buf[i] = 0 if op == "nul" else rng.choice([0x80, 0xC0, 0xFF])
    return bytes(buf), f"vocab {op} at {i} in {data[f.offset:f.offset + f.size]!r}"


RUNNER = r"""
import sys
from mtp_bindings import Model, MTPBindingsError
path, mode, other = sys.argv[1], sys.argv[2], sys.argv[3]
try:
    if mode == "model":
        with Model(path) as m:
            m.tokenize("x = 1")
    elif mode == "assistant":
        with Model(other) as m:
            m.attach_assistant(path)
    elif mode == "info":
        from mtp_bindings.gguffile.tools import describe
        describe(path)
    elif mode == "verify":
        from mtp_bindings.gguffile.tools import verify_assistant
        verify_assistant(path, other if other != "-" else None)
    print("OK")
except MTPBindingsError as e:
    print("TYPED", type(e).__name__)
"""


def run_case(path: Path, mode: str, other: str = "-", timeout: float = 60.0) -> str:
    """``ok``, ``typed:<Error>``, ``crash:<rc>``, ``untyped:<traceback tail>`` or ``hang``."""
    try:
        p = subprocess.run([sys.executable, "-c", RUNNER, str(path), mode, other], capture_output=True,
                           text=True, timeout=timeout, cwd=tempfile.gettempdir())
    except subprocess.TimeoutExpired:
        return "hang"
    if p.returncode < 0 or p.returncode > 1:
        return f"crash:{p.returncode}"
    out = p.stdout.strip().splitlines()
    if p.returncode == 0 and out and out[-1] == "OK":
        return "ok"
    if p.returncode == 0 and out and out[-1].startswith("TYPED"):
        return "typed:" + out[-1].split()[1]
    return "untyped:" + (p.stderr.strip().splitlines() or ["?"])[-1]


def campaign(src: Path, modes: list[str], cases: int, seed: int, other: str = "-",
             workdir: Path | None = None, vocab: bool = False) -> dict:
    """``cases`` mutations of ``src`` (of its token texts only with ``vocab``), each fed to every mode."""
    data = src.read_bytes()
    layout = parse_layout(data)
    if vocab and not any(f.kind == "vocab.elem.bytes" for f in layout):
        raise ValueError(f"{src} has no {VOCAB_KEY.decode()} strings to mutate")
    mutate_one = mutate_vocab if vocab else mutate
    rng = random.Random(seed)
    work = Path(workdir or tempfile.mkdtemp(prefix="gguf-mutate-"))
    results: dict[str, int] = {}
    failures = []
    for i in range(cases):
        mutated, what = mutate_one(data, rng, layout)
        p = work / f"case{i}.gguf"
        p.write_bytes(mutated)
        for mode in modes:
            outcome = run_case(p, mode, other)
            key = outcome.split(":")[0]
            results[key] = results.get(key, 0) + 1
            if key in ("crash", "hang", "untyped"):
                failures.append({"case": i, "mode": mode, "mutation": what, "outcome": outcome, "file": str(p)})
            elif key != "crash":
                pass
        if not any(f["case"] == i for f in failures):
            p.unlink()
    return {"source": str(src), "cases": cases, "modes": modes, "outcomes": results, "failures": failures}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("gguf", type=Path)
    ap.add_argument("--cases", type=int, default=200)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--modes", default="model,info", help="comma list of model, assistant, info, verify")
    ap.add_argument("--target", default="-", help="target GGUF for the assistant/verify modes")
    ap.add_argument("--vocab", action="store_true",
                    help="mutate only the token texts (duplicates, NUL bytes, bytes that are not UTF-8, swaps)")
    args = ap.parse_args(argv)
    report = campaign(args.gguf, args.modes.split(","), args.cases, args.seed, args.target, vocab=args.vocab)
    print(json.dumps(report, indent=1))
    return 1 if report["failures"] else 0


if __name__ == "__main__":
    sys.exit(main())
