"""Obtain the pinned llama.cpp source and apply our patch series to it.

Run by CMake at configure time (and usable by hand)::

    python build_support/llama_source.py --dest vendor/llama.cpp --patches patches

Steps, each skipped when a stamp says it is already done:

1. Obtain the sdist of ``PINNED_PACKAGE`` (which carries ggml-org/llama.cpp at ``PINNED_COMMIT``
   under ``vendor/llama.cpp``), verify its sha256, and unpack only that directory
   into ``--dest``. ``MTP_BINDINGS_LLAMA_SOURCE`` may name a local copy of the sdist or an already
   unpacked llama.cpp source tree (offline builds).
2. Apply ``patches/*.patch`` in name order with ``git apply``. The original of every file a patch
   touches is kept under ``<dest>/.mtp-pristine`` so that a changed patch series is re-applied on
   pristine files (only those files change, so the incremental rebuild stays small) and a patch is
   never applied twice.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

# the pin, once: the registry package's version (its sdist's name and prefix follow from it), its sdist's
# sha256 and the llama.cpp commit that sdist vendors
PINNED_VERSION = "0.3.36"
PINNED_SHA256 = "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"
PINNED_COMMIT = "0c1e57098"
PINNED_PACKAGE = f"llama-cpp-python=={PINNED_VERSION}"
PINNED_SDIST = f"llama_cpp_python-{PINNED_VERSION}.tar.gz"
SDIST_PREFIX = f"llama_cpp_python-{PINNED_VERSION}/vendor/llama.cpp/"

SOURCE_STAMP = ".mtp-source.json"
PATCH_STAMP = ".mtp-patches.json"
PRISTINE_DIR = ".mtp-pristine"
ENV_SOURCE = "MTP_BINDINGS_LLAMA_SOURCE"


class SourceError(RuntimeError):
    """The pinned source could not be obtained, verified or patched."""


def log(msg: str) -> None:
    print(f"[llama-source] {msg}", file=sys.stderr, flush=True)


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


# ---------------------------------------------------------------------------------------------
# step 1: the source
# ---------------------------------------------------------------------------------------------

def download_sdist(cache_dir: Path) -> Path:
    """Let pip find the pinned sdist by name (no registry host is written into the project)."""
    cached = cache_dir / PINNED_SDIST
    if cached.is_file() and sha256_of(cached) == PINNED_SHA256:
        return cached
    cache_dir.mkdir(parents=True, exist_ok=True)
    log(f"downloading {PINNED_PACKAGE} sdist with pip")
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-build-isolation",
           "--no-binary", "llama-cpp-python", PINNED_PACKAGE, "-d", str(cache_dir)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0 or not cached.is_file():
        raise SourceError(
            f"could not download {PINNED_PACKAGE}: {proc.stderr.strip()[-2000:]}\n"
            f"Set {ENV_SOURCE}=/path/to/{PINNED_SDIST} (or to a llama.cpp source tree) to build offline.")
    return cached


def verify_sdist(path: Path) -> None:
    digest = sha256_of(path)
    if digest != PINNED_SHA256:
        raise SourceError(f"{path}: sha256 {digest} does not match the pinned {PINNED_SHA256}")


def unpack_sdist(sdist: Path, dest: Path) -> None:
    """Extract only ``vendor/llama.cpp`` of the sdist into ``dest``."""
    tmp = Path(tempfile.mkdtemp(prefix=".unpack-", dir=dest.parent))
    try:
        with tarfile.open(sdist, "r:gz") as tar:
            members = []
            for m in tar.getmembers():
                if not m.name.startswith(SDIST_PREFIX):
                    continue
                m.name = m.name[len(SDIST_PREFIX):]
                # the sdist carries llama.cpp as a git submodule: its `.git` file points at a
                # repository that does not exist here and would confuse `git apply`
                if m.name and m.name != ".git" and not m.name.startswith(".git/"):
                    members.append(m)
            tar.extractall(tmp, members=members, filter="data")
        if not (tmp / "include" / "llama.h").is_file():
            raise SourceError(f"{sdist} does not contain {SDIST_PREFIX}include/llama.h")
        if dest.exists():
            shutil.rmtree(dest)
        tmp.rename(dest)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)


def copy_tree(src: Path, dest: Path) -> None:
    if not (src / "include" / "llama.h").is_file():
        raise SourceError(f"{ENV_SOURCE}={src} is neither the pinned sdist nor a llama.cpp source tree")
    if dest.exists():
        shutil.rmtree(dest)
    shutil.copytree(src, dest, symlinks=True, ignore=shutil.ignore_patterns(".git", "build*"))


def ensure_source(dest: Path, cache_dir: Path) -> None:
    stray_git = dest / ".git"
    if stray_git.is_file():  # left by an older unpack of the sdist
        stray_git.unlink()
    stamp = dest / SOURCE_STAMP
    override = os.environ.get(ENV_SOURCE)
    want = {"commit": PINNED_COMMIT, "sha256": PINNED_SHA256}
    if stamp.is_file():
        try:
            have = json.loads(stamp.read_text())
        except ValueError:
            have = None
        if have == want:
            return
    dest.parent.mkdir(parents=True, exist_ok=True)
    if override and Path(override).is_dir():
        log(f"copying llama.cpp source tree from {override}")
        copy_tree(Path(override), dest)
    else:
        sdist = Path(override) if override else download_sdist(cache_dir)
        if not sdist.is_file():
            raise SourceError(f"{ENV_SOURCE}={override}: no such file or directory")
        verify_sdist(sdist)
        log(f"unpacking llama.cpp@{PINNED_COMMIT} from {sdist.name}")
        unpack_sdist(sdist, dest)
    stamp.write_text(json.dumps(want, indent=1) + "\n")


# ---------------------------------------------------------------------------------------------
# step 2: the patches
# ---------------------------------------------------------------------------------------------

def patch_paths(patch: Path) -> tuple[list[str], list[str]]:
    """Files a unified diff modifies (or deletes), and files it creates."""
    touched: list[str] = []
    created: list[str] = []
    old = None
    for line in patch.read_text(errors="replace").splitlines():
        if line.startswith("--- "):
            old = line[4:].split("\t")[0].strip()
        elif line.startswith("+++ ") and old is not None:
            new = line[4:].split("\t")[0].strip()
            if old == "/dev/null":
                created.append(new[2:] if new.startswith("b/") else new)
            else:
                touched.append(old[2:] if old.startswith("a/") else old)
            old = None
    return touched, created


def git_apply(src: Path, patch: Path, check: bool) -> subprocess.CompletedProcess:
    # A ceiling stops git from mistaking an enclosing repository for the source's own.
    env = dict(os.environ, GIT_CEILING_DIRECTORIES=str(src.parent.resolve()))
    cmd = ["git", "apply", "-p1", "--whitespace=nowarn"] + (["--check"] if check else []) + [str(patch)]
    return subprocess.run(cmd, cwd=src, env=env, capture_output=True, text=True)


def restore_pristine(src: Path, applied: dict) -> None:
    pristine = src / PRISTINE_DIR
    for rel in applied.get("created", []):
        (src / rel).unlink(missing_ok=True)
    if pristine.is_dir():
        for f in pristine.rglob("*"):
            if f.is_file():
                target = src / f.relative_to(pristine)
                target.parent.mkdir(parents=True, exist_ok=True)
                # a fresh mtime, so the build system recompiles what the old series had changed
                shutil.copyfile(f, target)


def snapshot_patched(src: Path, applied: dict) -> dict[str, tuple[bytes, int]]:
    """Content and mtime of every file the applied series changed or created."""
    pristine = src / PRISTINE_DIR
    rels = list(applied.get("created", []))
    if pristine.is_dir():
        rels += [str(f.relative_to(pristine)) for f in pristine.rglob("*") if f.is_file()]
    snap = {}
    for rel in rels:
        f = src / rel
        if f.is_file():
            snap[rel] = (f.read_bytes(), f.stat().st_mtime_ns)
    return snap


def keep_unchanged_mtimes(src: Path, snap: dict[str, tuple[bytes, int]]) -> int:
    """Give a re-patched file its old mtime when its content did not change, so that a new patch
    recompiles only the files it changes (not everything the series touches: llama.h among them)."""
    kept = 0
    for rel, (data, mtime) in snap.items():
        f = src / rel
        if f.is_file() and f.read_bytes() == data:
            os.utime(f, ns=(mtime, mtime))
            kept += 1
    return kept


def apply_patches(src: Path, patch_dir: Path) -> list[str]:
    patches = sorted(patch_dir.glob("*.patch")) if patch_dir.is_dir() else []
    series = [{"name": p.name, "sha256": sha256_of(p)} for p in patches]
    stamp = src / PATCH_STAMP
    applied = json.loads(stamp.read_text()) if stamp.is_file() else {"series": [], "created": []}
    if applied.get("series") == series:
        return [p["name"] for p in series]

    snap = snapshot_patched(src, applied)
    restore_pristine(src, applied)
    stamp.unlink(missing_ok=True)
    pristine = src / PRISTINE_DIR
    created_all: list[str] = []
    for patch in patches:
        touched, created = patch_paths(patch)
        for rel in touched:
            keep = pristine / rel
            # keep the file as the *pristine tree* has it: only the first patch touching it saves it
            if not keep.exists() and (src / rel).is_file() and rel not in created_all:
                keep.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(src / rel, keep)
        proc = git_apply(src, patch, check=True)
        if proc.returncode != 0:
            restore_pristine(src, {"created": created_all})
            raise SourceError(f"patch {patch.name} does not apply:\n{proc.stderr.strip()}")
        proc = git_apply(src, patch, check=False)
        if proc.returncode != 0:
            raise SourceError(f"patch {patch.name} failed:\n{proc.stderr.strip()}")
        created_all.extend(created)
        log(f"applied {patch.name}")
    kept = keep_unchanged_mtimes(src, snap)
    if kept:
        log(f"{kept} re-patched file(s) unchanged: their timestamps kept (no rebuild for them)")
    stamp.write_text(json.dumps({"series": series, "created": created_all}, indent=1) + "\n")
    return [p["name"] for p in series]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dest", type=Path, required=True, help="where llama.cpp is unpacked (vendor/llama.cpp)")
    ap.add_argument("--patches", type=Path, required=True, help="directory of NNNN-topic.patch files")
    ap.add_argument("--cache", type=Path, default=None, help="download cache (default: <dest>/../.cache)")
    args = ap.parse_args(argv)
    dest = args.dest.resolve()
    try:
        ensure_source(dest, (args.cache or dest.parent / ".cache").resolve())
        names = apply_patches(dest, args.patches.resolve())
    except SourceError as e:
        log(f"error: {e}")
        return 1
    log(f"llama.cpp@{PINNED_COMMIT} ready with {len(names)} patch(es)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
