"""The bundled models, and the naming rule that pairs a target GGUF with its MTP assistant.

``TARGET`` and ``ASSISTANT`` are a tiny trained Gemma 4 pair (a 1.2M-parameter target and its
0.4M-parameter assistant, F16, 3 MB together; vocabulary 1024, trained for a few hundred steps on
CPython's standard library). They exist so that the package can show MTP drafting, and its demo,
tests and benchmarks run, with nothing to download. What they write is Python-flavoured gibberish:
for real text, bring a real Gemma 4 target and its assistant.

>>> from mtp_bindings import Model
>>> from mtp_bindings.models import TARGET, ASSISTANT
>>> with Model(TARGET, assistant=ASSISTANT) as model:
...     print(model.generate("def main(", max_tokens=16).text)
"""

from __future__ import annotations

import os
from pathlib import Path

DIRECTORY = Path(__file__).resolve().parent
TARGET = DIRECTORY / "trained-target.gguf"
ASSISTANT = DIRECTORY / "trained-assistant.gguf"

# How an assistant's file name relates to its target's: Gemma 4 checkpoints call the drafter
# "<name>-assistant" (gemma-4-E2B-it -> gemma-4-E2B-it-assistant), quantized files keep the suffix
# after it, and the project's own pairs say "target" / "assistant".
_WORD = "assistant"


def assistant_candidates(target: str | os.PathLike[str]) -> list[Path]:
    """Files beside ``target`` whose name marks them as its assistant (existing or not), most
    specific first: ``X-target.gguf`` -> ``X-assistant.gguf``; ``X-Q4_K_M.gguf`` ->
    ``X-assistant-Q4_K_M.gguf`` (and ``_``/``.`` instead of ``-``); ``X.gguf`` -> ``X-assistant.gguf``."""
    p = Path(target)
    stem, suffix = p.stem, p.suffix or ".gguf"
    names: list[str] = []
    if "target" in stem:
        names.append(stem.replace("target", _WORD) + suffix)
    parts = stem.split("-")
    for cut in range(len(parts) - 1, 0, -1):  # insert "-assistant" before each trailing "-" part
        names.append("-".join(parts[:cut] + [_WORD] + parts[cut:]) + suffix)
    for sep in ("-", "_", "."):
        names.append(f"{stem}{sep}{_WORD}{suffix}")
    return [p.with_name(n) for n in dict.fromkeys(names) if n != p.name]  # first occurrences, in order


def find_assistant(target: str | os.PathLike[str]) -> Path | None:
    """The assistant GGUF found beside ``target`` by :func:`assistant_candidates`, or None."""
    return next((c for c in assistant_candidates(target) if c.is_file()), None)


__all__ = ["DIRECTORY", "TARGET", "ASSISTANT", "assistant_candidates", "find_assistant"]
