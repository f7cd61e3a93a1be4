"""Hugging Face -> GGUF conversion with the patched llama.cpp converter bundled in the package
(it keeps the Gemma 4 assistant's centroid head), run in a subprocess whose ``PYTHONPATH`` holds the
converter's own gguf-py (``_convert/gguf-py``): the only place that copy is used, never this
process's ``sys.path``. Needs the ``convert`` extra (torch, safetensors) at run time."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from ..exceptions import MTPBindingsError

CONVERTER_DIR = Path(__file__).parent.parent / "_convert"


class ConversionError(MTPBindingsError):
    """The converter refused the checkpoint or failed."""


def converter_command(hf_dir: Path, outfile: Path, outtype: str) -> list[str]:
    script = CONVERTER_DIR / "convert_hf_to_gguf.py"
    if not script.is_file():
        raise ConversionError(f"the bundled converter is missing ({script}): reinstall the package")
    return [sys.executable, str(script), str(hf_dir), "--outfile", str(outfile), "--outtype", outtype]


def convert_hf(hf_dir: str | os.PathLike[str], outfile: str | os.PathLike[str], *, outtype: str = "f16",
               verbose: bool = False) -> Path:
    """Convert the checkpoint in ``hf_dir`` to ``outfile``; returns the output path."""
    src, out = Path(hf_dir), Path(outfile)
    if not (src / "config.json").is_file():
        raise ConversionError(f"{src} is not a Hugging Face checkpoint directory (no config.json)")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(CONVERTER_DIR / "gguf-py"), str(CONVERTER_DIR)] + ([os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else [])))
    proc = subprocess.run(converter_command(src, out, outtype), env=env, text=True,
                          stdout=None if verbose else subprocess.PIPE, stderr=None if verbose else subprocess.STDOUT)
    if proc.returncode != 0 or not out.is_file():
        tail = (proc.stdout or "").strip().splitlines()[-3:] if not verbose else []
        raise ConversionError(f"conversion of {src} failed (exit {proc.returncode})" + (": " + " | ".join(tail) if tail else ""))
    return out
