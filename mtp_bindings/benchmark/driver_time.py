"""The Python driver's own time per round: native calls timed through the context's ``observer``
hook, a cProfile and a py-spy profile of the generation loop."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .config import log
from .util import median


# --- the Python driver's own time -----------------------------------------------------------------

class NativeTime:
    """A context's :attr:`~mtp_bindings.llama_context.LlamaContext.observer`: adds up the seconds of the native
    calls the context reports (every ``llama_decode`` and MTP submit / wait / synchronous draft).

    Not counted, so they land in the driver's share: the cheap native calls outside that hook
    (``llama_get_logits_ith`` / ``llama_get_embeddings_ith`` pointer look-ups, the KV rollback's
    ``llama_memory_seq_rm``, vocabulary queries); each takes well under a microsecond to a few
    microseconds, less than timing it would add."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.calls = 0

    def __call__(self, name: str, seconds: float) -> None:
        self.seconds += seconds
        self.calls += 1

    def reset(self) -> None:
        self.seconds, self.calls = 0.0, 0


def driver_overhead(model: Any, prompt_ids: list[int], *, threads: int, n_out: int, draft_ns: Sequence[int],
                    temps: Sequence[float], runs: int, bias: dict[int, float] | None = None,
                    n_ctx: int = 2048) -> list[dict[str, Any]]:
    """Round wall time minus time inside native calls, per round, for plain and MTP generation."""
    rows = []
    native = NativeTime()
    ctx = model.create_context(n_ctx=n_ctx, n_threads=threads, flash_attn="off", embeddings=model.has_assistant)
    ctx.observer = native
    try:
        model.generate(prompt_ids, context=ctx, max_tokens=8, draft_n_max=draft_ns[0] if draft_ns else 0)
        configs = [("plain", 0, True)] + [(f"mtp depth2 {'on' if d2 else 'off'}", n, d2)
                                          for n in draft_ns for d2 in (False, True)]
        for temp in temps:
            for name, n, d2 in configs:
                per_round, native_share, rounds_all = [], [], []
                for run in range(runs):
                    native.reset()
                    r = model.generate(prompt_ids, context=ctx, max_tokens=n_out, temperature=temp, seed=7 + run,
                                       draft_n_max=n, depth2=d2, logit_bias=bias or None, skip_streak=0)
                    st = r.stats
                    native_s = native.seconds
                    # prompt decode is native too: wall of the generation = t_total
                    driver = max(st.t_total - native_s, 0.0)
                    rounds = max(st.n_rounds, 1)
                    per_round.append(driver / rounds)
                    native_share.append(native_s / st.t_total if st.t_total else 0.0)
                    rounds_all.append(rounds)
                rows.append({"config": name, "draft_n": n, "temp": temp, "n_out": n_out,
                             "driver_us_per_round": median(per_round) * 1e6,
                             "driver_us_per_round_all": [x * 1e6 for x in per_round],
                             "native_share": median(native_share), "rounds": median(rounds_all),
                             "native_calls_per_round": native.calls / max(rounds_all[-1], 1)})
    finally:
        ctx.close()
    return rows


def profile_driver(model: Any, prompt_ids: list[int], *, threads: int, n_out: int, draft_n: int, temp: float,
                   out_path: Path, top: int = 25) -> list[dict[str, Any]]:
    """Where the driver's own time goes: cProfile of MTP generation, top functions by self time
    (native calls show up as the cffi functions they are)."""
    import cProfile
    import pstats

    ctx = model.create_context(n_ctx=2048, n_threads=threads, flash_attn="off", embeddings=True)
    try:
        model.generate(prompt_ids, context=ctx, max_tokens=8, draft_n_max=draft_n)
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(3):
            model.generate(prompt_ids, context=ctx, max_tokens=n_out, temperature=temp, seed=3, draft_n_max=draft_n,
                           depth2=True)
        prof.disable()
    finally:
        ctx.close()
    st = pstats.Stats(prof)
    st.dump_stats(str(out_path))
    rows = []
    for (file, line, fn), (cc, nc, tt, ct, _) in sorted(st.stats.items(), key=lambda kv: -kv[1][2])[:top]:  # type: ignore[attr-defined]
        rows.append({"function": f"{Path(file).name}:{line}({fn})", "calls": nc, "self_ms": tt * 1e3,
                     "cumulative_ms": ct * 1e3})
    return rows


_PYSPY_SCRIPT = """
import sys, time
from mtp_bindings import Model
target, assistant, threads, n_out, draft_n, seconds, prompt, stats_path = sys.argv[1:9]
m = Model(target, assistant=assistant)
ctx = m.create_context(n_ctx=2048, n_threads=int(threads), flash_attn="off", embeddings=True)
ids = m.tokenize(prompt)
bias = {t: -100.0 for t in range(m.n_vocab) if m.is_eog(t)}
m.generate(ids, context=ctx, max_tokens=16, draft_n_max=int(draft_n), temperature=0)
t_end = time.perf_counter() + float(seconds)
rounds = 0
gen_s = 0.0
while time.perf_counter() < t_end:
    r = m.generate(ids, context=ctx, max_tokens=int(n_out), draft_n_max=int(draft_n), depth2=True, logit_bias=bias,
                   temperature=0)
    rounds += r.stats.n_rounds
    gen_s += r.stats.t_total
import json
open(stats_path, "w").write(json.dumps({"rounds": rounds, "gen_s": gen_s}))
"""

# a source line that calls into libllama: ``lib.llama_...(`` in the bindings, and the MTP session's
# one call site (``MTPSession._call``: ``fn(*args)``)
_NATIVE_LINE = re.compile(r"\blib\.\w+\(|\bfn\(\*args\)")


def py_spy_driver_profile(target: Path, assistant: Path, *, threads: int, n_out: int, draft_n: int, seconds: float,
                          prompt: str, out_dir: Path) -> dict[str, Any] | None:
    """Sample the generation loop with py-spy (when installed): the share of the Python thread's
    time inside native libllama calls, and where the rest -- the driver's own time -- goes (leaf
    source lines, the cffi call lines counted as native)."""
    import linecache

    exe = shutil.which("py-spy")
    if exe is None:
        return None
    script = out_dir / "_pyspy_driver.py"
    script.write_text(_PYSPY_SCRIPT)
    raw = out_dir / "driver_pyspy.txt"
    stats_path = out_dir / "_pyspy_stats.json"
    rate = 1000
    try:
        subprocess.run([exe, "record", "-r", str(rate), "-f", "raw", "-o", str(raw), "--", sys.executable, str(script),
                        str(target), str(assistant), str(threads), str(n_out), str(draft_n), str(seconds), prompt,
                        str(stats_path)],
                       check=True, timeout=seconds * 10 + 120, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                       cwd=tempfile.gettempdir())
    except (subprocess.SubprocessError, OSError) as e:
        log(f"py-spy failed: {e}")
        return None
    finally:
        script.unlink(missing_ok=True)
    frame_re = re.compile(r"^(.*) \((.*):(\d+)\)$")
    total = native = 0
    leaves: dict[str, int] = {}
    by_fn: dict[str, int] = {}
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        frames = stack.split(";")
        if not any(f.startswith("token_rounds ") or f.startswith("_pieces ") for f in frames):
            continue  # setup, imports, the warm-up outside the loop is still inside _pieces: fine
        n = int(count)
        total += n
        m = frame_re.match(frames[-1])
        src = ""
        if m:
            fname, lineno = m.group(2), int(m.group(3))
            path = next((str(Path(p) / fname) for p in sys.path if (Path(p) / fname).is_file()), fname)
            src = linecache.getline(path, lineno).strip()
        if _NATIVE_LINE.search(src):
            native += n
            continue
        key = f"{frames[-1]}: {src[:80]}"
        leaves[key] = leaves.get(key, 0) + n
        # the binding/driver function this Python time belongs to: the deepest mtp_bindings frame
        owner = next((f.split(" (")[0] for f in reversed(frames) if "mtp_bindings/" in f), "?")
        by_fn[owner] = by_fn.get(owner, 0) + n
    raw.unlink(missing_ok=True)
    try:
        st = json.loads(stats_path.read_text())
        stats_path.unlink()
    except (OSError, ValueError):
        st = {}
    if not total:
        return None
    rounds = st.get("rounds") or 0
    us_per_round = (lambda n: n / rate / rounds * 1e6) if rounds else (lambda n: None)
    top = sorted(leaves.items(), key=lambda kv: -kv[1])[:20]
    fns = sorted(by_fn.items(), key=lambda kv: -kv[1])[:15]
    return {"samples": total, "native_share": native / total, "python_share": 1 - native / total,
            "rounds": rounds, "python_us_per_round": us_per_round(total - native),
            "by_function": [{"function": k, "share_of_loop": v / total, "us_per_round": us_per_round(v)} for k, v in fns],
            "top_python_lines": [{"line": k, "share_of_loop": v / total} for k, v in top],
            "note": "py-spy samples of the Python thread inside the generation loop; native = a line calling "
                    "libllama through cffi (decode, MTP submit/wait, logits/embeddings reads, seq_rm, ...)"}
