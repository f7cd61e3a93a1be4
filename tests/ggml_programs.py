"""Build small C programs against the installed package's ggml (headers and shared libraries), or against a ggml
built for another architecture (``tools/cross_arm.sh``): with ``MTP_BINDINGS_CROSS_GGML`` naming that build, a
program is cross-compiled and what this returns is a script that runs it under qemu-user, so the tests marked
``ggml_program`` check that architecture's kernels (``MTP_BINDINGS_CROSS_GGML=build/cross-arm/i8mm pytest -m
ggml_program``)."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

CROSS_ENV = "MTP_BINDINGS_CROSS_GGML"


def compile_ggml_program(source: Path, out_dir: Path) -> Path:
    """Compile ``source`` with the package's ggml; skips the calling test where there is no C compiler."""
    cross = os.environ.get(CROSS_ENV)
    if cross:
        return _compile_cross(source, out_dir, Path(cross))
    cc = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler")
    from mtp_bindings.native import _backends
    from mtp_bindings.low_level import include_dir, library_dir

    # a native build links one libggml-cpu.so; a portable one has a module per x86-64 level: link
    # the best this CPU runs (the one ggml itself would load)
    runnable = _backends.runnable_variants(library_dir())
    cpu = f"-l:libggml-cpu-{next(iter(runnable))}.so" if runnable else "-lggml-cpu"
    exe = out_dir / source.stem
    subprocess.run([cc, "-O2", "-std=c11", str(source), f"-I{include_dir()}", f"-L{library_dir()}",
                    f"-Wl,-rpath,{library_dir()}", "-lggml", "-lggml-base", cpu, "-lm", "-o", str(exe)],
                   check=True)
    return exe


def run_ggml_program(exe: Path, *args: str, env: dict[str, str] | None = None, timeout: float = 120) -> dict:
    """Run a compiled check program and return the JSON object it prints (it must exit 0)."""
    res = subprocess.run([str(exe), *args], capture_output=True, text=True, timeout=timeout,
                         env={**os.environ, **(env or {})})
    assert res.returncode == 0, res.stderr[-2000:]
    return json.loads(res.stdout)


def _compile_cross(source: Path, out_dir: Path, build: Path) -> Path:
    """``source`` built against the ggml of ``build`` (its ``cross.env``: the compiler, headers, libraries and
    the emulator), and a script in its place that runs it there (the arguments and the environment passed on)."""
    env_file = build / "cross.env"
    if not env_file.is_file():
        pytest.fail(f"{CROSS_ENV}={build}: no {env_file} (tools/cross_arm.sh writes it)")
    conf = dict(line.split("=", 1) for line in env_file.read_text().splitlines() if "=" in line)
    binary = out_dir / f"{source.stem}.bin"
    subprocess.run([conf["CC"], "-O2", "-std=c11", str(source), f"-I{conf['INCLUDE']}", f"-L{conf['LIB']}",
                    f"-Wl,-rpath,{conf['LIB']}", "-lggml", "-lggml-base", "-lggml-cpu", "-lm", "-o", str(binary)],
                   check=True)
    runner = out_dir / source.stem
    runner.write_text(f'#!/bin/sh\nexec {conf["RUN"]} {shlex.quote(str(binary))} "$@"\n')
    runner.chmod(0o755)
    return runner
