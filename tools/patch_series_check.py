"""Check that two patch series give the same llama.cpp tree: byte for byte, both applied to the pristine source.

    python tools/patch_series_check.py [OLD] [NEW]

OLD and NEW are each a directory of ``*.patch`` files or a git revision whose ``patches/`` is taken
(default: OLD = the merge-base of HEAD and main, NEW = the working tree's ``patches/``). Each series is applied
as ``build_support/llama_source.py`` applies it (name order, ``git apply -p1``) to a fresh copy of the pinned
source (the sha256-checked sdist: ``$MTP_BINDINGS_LLAMA_SOURCE``, ``vendor/.cache`` of this checkout or of
``../main``, else pip), then ``diff -r`` compares the two trees. Exit 0 when they are identical.
Used when a series is reorganised (squashed, split, renumbered) without changing what it applies.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "build_support"))
import llama_source as L  # noqa: E402


def pristine(cache: Path) -> Path:
    src = cache / "pristine"
    if (src / "include" / "llama.h").is_file():
        return src
    override = os.environ.get(L.ENV_SOURCE)
    candidates = [Path(override)] if override else []
    candidates += [ROOT / "vendor/.cache" / L.PINNED_SDIST, ROOT.parent / "main/vendor/.cache" / L.PINNED_SDIST]
    sdist = next((c for c in candidates if c.is_file()), None) or L.download_sdist(cache / "dl")
    L.verify_sdist(sdist)
    L.unpack_sdist(sdist, src)
    return src


def series_dir(spec: str, tmp: Path) -> Path:
    if Path(spec).is_dir():
        return Path(spec)
    out = tmp / ("rev-" + spec.replace("/", "_"))
    out.mkdir()
    names = subprocess.run(["git", "-C", str(ROOT), "ls-tree", "--name-only", f"{spec}:patches"],
                           check=True, capture_output=True, text=True).stdout.split()
    for n in names:
        if n.endswith(".patch"):
            (out / n).write_bytes(subprocess.run(["git", "-C", str(ROOT), "show", f"{spec}:patches/{n}"],
                                                 check=True, capture_output=True).stdout)
    return out


def applied(src: Path, patches: Path, dest: Path) -> Path:
    subprocess.run(["cp", "-a", str(src), str(dest)], check=True)
    for p in sorted(patches.glob("*.patch")):
        proc = L.git_apply(dest, p.resolve(), check=False)
        if proc.returncode != 0:
            sys.exit(f"{p}: does not apply on {dest}:\n{proc.stderr}")
    return dest


def main(argv: list[str]) -> int:
    old = argv[0] if argv else subprocess.run(["git", "-C", str(ROOT), "merge-base", "HEAD", "main"],
                                              check=True, capture_output=True, text=True).stdout.strip()
    new = argv[1] if len(argv) > 1 else str(ROOT / "patches")
    cache = Path(os.environ.get("PATCH_CHECK_CACHE", Path(tempfile.gettempdir()) / "patch-series-check"))
    cache.mkdir(parents=True, exist_ok=True)
    src = pristine(cache)
    with tempfile.TemporaryDirectory(dir=cache) as t:
        tmp = Path(t)
        a, b = series_dir(old, tmp), series_dir(new, tmp)
        na, nb = len(list(a.glob("*.patch"))), len(list(b.glob("*.patch")))
        ta, tb = applied(src, a, tmp / "old"), applied(src, b, tmp / "new")
        rc = subprocess.run(["diff", "-r", "--no-dereference", str(ta), str(tb)]).returncode
    print(f"old {old} ({na} patches) vs new {new} ({nb} patches): "
          + ("byte-identical trees" if rc == 0 else "TREES DIFFER"))
    return rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
