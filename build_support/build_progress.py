"""Run a build command (``pip install -v ...``) and show its progress in a few lines.

pip -v streams thousands of CMake and compiler lines; without -v it shows nothing for many minutes.
This prints one line per stage (fetching and patching llama.cpp, configuring, compiling with a
percentage every ~5 %, installing) and keeps the whole log in ``build/install.log``; on failure it
prints the log's last lines. Exit status: the command's.

    python build_support/build_progress.py -- python -m pip install -v .
"""

from __future__ import annotations

import collections
import re
import subprocess
import sys
import time
from pathlib import Path

LOG = Path("build") / "install.log"
NINJA = re.compile(r"^\[(\d+)/(\d+)\] ")
STAGES = (
    ("[llama-source]", None),                      # our own fetch/patch lines: shown as they are
    ("-- Configuring done", "configured"),
    ("Building wheel for", "building the wheel (compiling llama.cpp: the first build takes minutes)"),
    ("Successfully installed", None),
)


def main(argv: list[str]) -> int:
    if argv[:1] == ["--"]:
        argv = argv[1:]
    if not argv:
        print(__doc__, file=sys.stderr)
        return 2
    LOG.parent.mkdir(exist_ok=True)
    t0 = time.monotonic()
    tail: collections.deque[str] = collections.deque(maxlen=60)
    last_pct = -5
    shown: set[str] = set()  # stage markers already announced (pip prints some twice)

    def say(msg: str) -> None:
        print(f"[build {time.monotonic() - t0:5.0f}s] {msg}", flush=True)

    say(f"{' '.join(argv)}  (full log: {LOG})")
    with LOG.open("w") as log, subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                                text=True, errors="replace") as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            log.write(line)
            tail.append(line.rstrip("\n"))
            text = line.strip()
            m = NINJA.match(text)
            if m:
                pct = 100 * int(m.group(1)) // max(1, int(m.group(2)))
                if pct >= last_pct + 5 or m.group(1) == m.group(2):
                    last_pct = pct
                    say(f"compiling {m.group(1)}/{m.group(2)} ({pct}%)")
                continue
            for marker, label in STAGES:
                if marker in text and (label is None or marker not in shown):
                    shown.add(marker)
                    say(label or text)
            if text.startswith(("ERROR", "error:", "FAILED")) or "CMake Error" in text:
                say(text)
        rc = proc.wait()
    if rc != 0:
        print("\n".join(tail), file=sys.stderr)
        say(f"failed (exit status {rc}); the whole log is in {LOG}")
    else:
        say("done")
    return rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
