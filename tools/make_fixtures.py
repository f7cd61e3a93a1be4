#!/usr/bin/env python3
"""Generate the tiny Gemma 4 test fixtures and the bundled default models.

This script builds, from nothing but a seed and the CPython standard library
sources found on the machine, every model the project tests against:

* a SentencePiece BPE tokenizer (vocab 1024, byte fallback, Gemma chat
  template) exported as a Hugging Face Gemma tokenizer;
* four *random* target + assistant pairs (``dense``, ``centroid``, ``keqv``,
  ``ple``) built with transformers' own Gemma 4 classes, saved as Hugging Face
  checkpoints under ``tests/fixtures/hf/`` and converted to F32 GGUF files in
  ``tests/fixtures/`` with the pinned llama.cpp's ``convert_hf_to_gguf.py``;
* a small *trained* pair (``trained``): a target trained on stdlib Python and
  an assistant distilled from it, converted to F16 GGUF files in
  ``mtp_bindings/models/`` (the package's bundled default models);
* Hugging Face reference outputs for each pair
  (``tests/fixtures/<name>-reference.npz`` plus a ``.json`` sidecar).

Everything is seeded and training runs a fixed number of steps; running the
script twice on the same machine (same Python stdlib, same torch/transformers
versions, same thread count) gives the same files.  ``--convert-only`` re-runs just the GGUF conversion from the
stored Hugging Face checkpoints and does not import torch itself (the upstream
converter it runs as a subprocess does).

Usage::

    python tools/make_fixtures.py                   # everything
    python tools/make_fixtures.py --skip-train      # random fixtures only
    python tools/make_fixtures.py --only dense ple  # a subset
    python tools/make_fixtures.py --convert-only    # re-convert stored HF dirs
    python tools/make_fixtures.py --references-only # recompute references from them

This file is the entry point (options and the order of the jobs); the jobs live in
``tools/fixtures/``: ``common`` (paths, constants, the fixture specifications), ``tokenizer``,
``hf_models`` (building the Hugging Face models), ``hf_reference`` and ``references`` (reference
outputs), ``random_pair``, ``train`` (the trained pair) and ``gguf_convert``.
"""


from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from fixtures.common import DEFAULT_LLAMA_SRC, FIXTURES, LOG, REPO_ROOT, FixtureSpec, TrainSettings
from fixtures.gguf_convert import convert_fixture
from fixtures.random_pair import check_generate_matches, load_hf_assistant, load_hf_target, make_random_fixture
from fixtures.references import full_references, references_ok, save_references
from fixtures.tokenizer import make_tokenizer
from fixtures.train import make_trained_fixture, trained_references

if TYPE_CHECKING:
    from transformers import PreTrainedModel

# ----------------------------------------------------------------------------
# Driver
# ----------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    """Command-line options."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", nargs="+", choices=sorted(FIXTURES), metavar="NAME",
                        help=f"fixtures to (re)build, from {', '.join(FIXTURES)}")
    parser.add_argument("--skip-train", action="store_true", help="skip the trained pair")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--convert-only", action="store_true",
                      help="only re-run GGUF conversion from the stored HF checkpoints")
    mode.add_argument("--references-only", action="store_true",
                      help="recompute the HF references from the stored HF checkpoints (no re-seeding, no training)")
    parser.add_argument("--llama-src", type=Path, default=None,
                        help=f"llama.cpp source tree (default: <repo>/{DEFAULT_LLAMA_SRC})")
    parser.add_argument("--train-steps", type=int, nargs=2, default=None, metavar=("TARGET", "ASSISTANT"),
                        help="optimizer steps of the trained pair (default %d %d)"
                        % (TrainSettings.target_steps, TrainSettings.assistant_steps))
    parser.add_argument("--threads", type=int, default=1,
                        help="torch CPU threads (default 1: results can depend on it; oversubscribed cores make 2 slower)")
    parser.add_argument("-v", "--verbose", action="store_true")
    return parser.parse_args(argv)


def selected_fixtures(args: argparse.Namespace) -> list[FixtureSpec]:
    """The fixtures to process, those reusing another's target last."""
    names = args.only or list(FIXTURES)
    specs = [FIXTURES[n] for n in names if not (args.skip_train and FIXTURES[n].trained)]
    return sorted(specs, key=lambda s: s.target_from is not None)


def setup_torch(threads: int) -> None:
    """Deterministic CPU torch."""
    import torch

    torch.set_num_threads(threads)
    torch.use_deterministic_algorithms(True)
    logging.getLogger("transformers").setLevel(logging.ERROR)
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()


def generate(specs: Sequence[FixtureSpec], args: argparse.Namespace) -> None:
    """Build HF checkpoints and references for ``specs`` (needs torch)."""
    setup_torch(args.threads)
    tokenizer_dir = Path(tempfile.mkdtemp(prefix="mtp-fixtures-tokenizer-"))
    tokenizer = make_tokenizer(tokenizer_dir)
    targets: dict[str, PreTrainedModel] = {}
    settings = TrainSettings()
    if args.train_steps:
        settings = dataclasses.replace(settings, target_steps=args.train_steps[0], assistant_steps=args.train_steps[1])
    for spec in specs:
        if spec.trained:
            make_trained_fixture(spec, tokenizer, tokenizer_dir, settings)
        else:
            make_random_fixture(spec, tokenizer, tokenizer_dir, targets)


def recompute_references(specs: Sequence[FixtureSpec], args: argparse.Namespace) -> None:
    """Recompute references from the stored checkpoints, keeping the sidecars' provenance keys."""
    from transformers import AutoTokenizer

    setup_torch(args.threads)
    for spec in specs:
        tokenizer = AutoTokenizer.from_pretrained(spec.hf_target_dir())
        sidecar = spec.reference_npz().with_suffix(".json")
        previous = json.loads(sidecar.read_text()) if sidecar.is_file() else {}
        extra = {k: previous[k] for k in ("kind", "seed", "val_perplexity") if k in previous}
        if spec.trained:
            trained_references(spec, tokenizer, extra)
            continue
        target = load_hf_target(spec.hf_target_dir())
        assistant = load_hf_assistant(spec.hf_assistant_dir())
        refs = full_references(target, assistant, tokenizer)
        ok, why = references_ok(refs)
        if not ok:
            LOG.warning("%s: stored checkpoint no longer gives robust references: %s", spec.name, why)
        check_generate_matches(target, refs)
        save_references(refs, spec, extra)


def main(argv: Sequence[str] | None = None) -> int:
    """Generate (or recompute / re-convert), then convert and check every selected fixture."""
    args = parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                        format="%(asctime)s %(levelname)s %(message)s", datefmt="%H:%M:%S")
    llama_src = (args.llama_src or REPO_ROOT / DEFAULT_LLAMA_SRC).resolve()
    specs = selected_fixtures(args)
    if args.references_only:
        recompute_references(specs, args)
    elif not args.convert_only:
        generate(specs, args)
    converted: set[Path] = set()
    summary = {spec.name: convert_fixture(spec, llama_src, converted) for spec in specs}
    print(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
