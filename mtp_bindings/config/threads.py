"""The package's threading defaults: how many compute threads a context gets, and how they wait.

Pure Python (no native import), so the native layer can apply :func:`openmp_defaults` *before* it
loads libllama (and with it libgomp, which reads its settings once, when it is loaded).

Why (measured on a 2-core machine, ``bench/shared_cpu.py``, results in ``bench/results/``): ggml
runs each graph on a team of threads that meet at a barrier after nearly every operation, hundreds
of times per decode. A waiting thread that *spins* holds its CPU; when there are more runnable
threads than CPUs (a second generating process, a busy browser tab, a server's second slot), the
thread it waits for is often queued behind it, and every barrier costs a scheduler time slice:
generation ran 30-700x slower beside one other busy process. So:

* ggml's barriers spin 300 pauses, then yield their CPU for up to 100 us, then sleep (our patch ``0107``:
  a wake-up costs ~1 ms on some VMs, so a waiter stays awake yet never holds a CPU another
  thread wants);
* libgomp (graph start and end) spins ``OPENMP_SPIN_COUNT`` pauses instead of its default 300000
  (~8 ms on CPUs with a slow ``pause``) — unless the user chose ``OMP_WAIT_POLICY`` or
  ``GOMP_SPINCOUNT`` themselves;
* the default thread count is the CPUs this process may use (affinity mask and cgroup quota), not
  the machine's, capped at ``MAX_DEFAULT_THREADS``; a server's slots share that budget;
* a context left at the default (no ``n_threads`` given) computes with the part of that budget other
  work leaves free *now* (:func:`threads_for_load`, checked by the generation loop every
  ``ADAPT_INTERVAL_S``): threads that wait for each other at hundreds of barriers per token do best
  when none of them has to queue for a CPU. An explicit ``n_threads`` is always used as given;
* such a context also times its short decodes (a token, a verify batch) on one thread, and keeps one
  thread where that was faster (:class:`FewRowThreads`: a small model's decode is mostly its team's
  synchronisation); drafting follows it.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import statistics
from pathlib import Path
from typing import Iterator, MutableMapping

logger = logging.getLogger("mtp_bindings")

MAX_DEFAULT_THREADS = 8
# libgomp's spin count (pauses) before a waiting thread sleeps. 300 measured best of 100..300000 on
# the 2-core machine: alone as fast as libgomp's default (lower counts pay a wake-up at every graph
# start: 100 was 2x slower alone), and 2-3x, not 30-700x, when sharing the CPU (higher counts
# collapse again: 1000 gave 4-6x, 10000 25-50x). See bench/results/shared_cpu.md.
OPENMP_SPIN_COUNT = 300
# variables by which a user chooses libgomp's waiting: if any is set, we leave libgomp alone
OPENMP_CHOICE_VARS = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")
# how often a default-threaded context re-reads the machine's load (a /proc read, ~20 us), and over how
# many readings it takes the least: a reading is an instant, and a process woken for a moment (the reader
# of a streamed output) is not load; a busy process shows in every reading. Measured: with single readings
# the benchmark's own harness, woken by each streamed line, halved an E2B-sized decode's threads alone.
ADAPT_INTERVAL_S = 0.1
ADAPT_SAMPLES = 3

_warned: set[str] = set()


def _warn_once(key: str, msg: str, *args: object) -> None:
    if key not in _warned:
        _warned.add(key)
        logger.warning(msg, *args)


def _cgroup_v2_dirs(root: Path) -> list[Path]:
    """This process's cgroup v2 directory and its ancestors (a quota may be set on any of them)."""
    try:
        rel = next(line.split("::", 1)[1].strip() for line in Path("/proc/self/cgroup").read_text().splitlines()
                   if line.startswith("0::"))
    except (OSError, StopIteration):
        rel = "/"
    leaf = root / rel.lstrip("/")
    return [leaf, *(p for p in leaf.parents if p == root or root in p.parents)]


def cgroup_cpu_limit(root: Path = Path("/sys/fs/cgroup")) -> float | None:
    """The CPU quota of this process's cgroup in CPUs (e.g. 1.5), or None without a quota.

    cgroup v2 (``cpu.max``: ``"150000 100000"`` or ``"max 100000"``, on the process's cgroup or an
    ancestor) and v1 (``cpu/cpu.cfs_quota_us`` / ``cpu.cfs_period_us``, quota -1 = none)."""
    limits = []
    for d in _cgroup_v2_dirs(root):
        try:
            v2_quota, v2_period = (d / "cpu.max").read_text().split()[:2]
            if v2_quota != "max":
                limits.append(int(v2_quota) / int(v2_period))
        except (OSError, ValueError):
            continue
    if limits:
        return min(limits)
    try:
        quota = int((root / "cpu" / "cpu.cfs_quota_us").read_text())
        period = int((root / "cpu" / "cpu.cfs_period_us").read_text())
        return None if quota <= 0 or period <= 0 else quota / period
    except (OSError, ValueError):
        return None


def usable_cpus() -> int:
    """CPUs this process may run on: its affinity mask, bounded by its cgroup's CPU quota."""
    try:
        n = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        n = os.cpu_count() or 1
    limit = cgroup_cpu_limit()
    if limit is not None:
        n = min(n, math.ceil(limit))
    return max(1, n)


def default_threads() -> int:
    """Compute threads of a context when none are given: the usable CPUs, at most 8."""
    return min(usable_cpus(), MAX_DEFAULT_THREADS)


def threads_per_slot(n_slots: int, n_threads: int | None = None) -> int:
    """Threads of each of ``n_slots`` contexts that share ``n_threads`` (default: the default
    budget), so that the slots together never run more compute threads than the budget."""
    budget = n_threads or default_threads()
    if n_slots > budget:
        _warn_once(f"slots:{n_slots}:{budget}", "%d slots share %d CPU thread(s): each slot gets 1 thread, "
                   "so busy slots run more threads than CPUs and slow each other down", n_slots, budget)
    return max(1, budget // n_slots)


def check_threads(n_threads: int) -> None:
    """Warn (once per count) when ``n_threads`` exceeds the CPUs this process may use."""
    cpus = usable_cpus()
    if n_threads > cpus:
        _warn_once(f"threads:{n_threads}", "%d threads requested but this process may use only %d CPU(s): "
                   "threads that wait for each other on shared CPUs make generation much slower", n_threads, cpus)


_LOADAVG_FD: dict[Path, int] = {}  # /proc/loadavg kept open: a read is then one pread (opening it each time cost ~100 us a round)


def runnable_threads(loadavg: Path = Path("/proc/loadavg")) -> int | None:
    """Threads runnable on the machine right now, the caller included (``/proc/loadavg``'s
    ``running/total`` field), or None where the kernel does not say."""
    try:
        fd = _LOADAVG_FD.get(loadavg)
        if fd is None:
            fd = _LOADAVG_FD.setdefault(loadavg, os.open(loadavg, os.O_RDONLY | os.O_CLOEXEC))
        return int(os.pread(fd, 128, 0).split()[3].split(b"/")[0])
    except (OSError, IndexError, ValueError):
        return None


def threads_for_load(budget: int, others_running: int, usable: int, machine: int) -> int:
    """Threads to compute with when ``others_running`` threads of other work are runnable on a
    machine of ``machine`` CPUs, of which this process may use ``usable``: the budget, less the
    CPUs that work occupies (spread evenly over the machine's CPUs: a container sees the host's
    count), at least 1. With 2 CPUs: nothing else running -> 2; a busy loop -> 1; another
    2-thread generation -> 1 (each process then computes on a CPU of its own)."""
    busy = others_running * usable / max(machine, 1)
    return max(1, min(budget, int(usable - busy + 0.5)))


def libgomp_loaded() -> bool:
    """Whether libgomp is already mapped into this process (then its settings are fixed)."""
    try:
        return "libgomp" in Path("/proc/self/maps").read_text()
    except OSError:
        return False


@contextlib.contextmanager
def openmp_defaults(environ: MutableMapping[str, str] = os.environ) -> Iterator[dict[str, str]]:
    """Around the first load of the native library: give libgomp the package's spin count unless
    the user chose one, and restore the environment afterwards (libgomp has read it by then, and
    child processes should see the user's environment, not ours)."""
    chosen = {k: environ[k] for k in OPENMP_CHOICE_VARS if k in environ}
    applied: dict[str, str] = {}
    if not chosen:
        if libgomp_loaded():
            _warn_once("libgomp", "libgomp was loaded before mtp_bindings (by another package), with its default "
                       "spin-waiting: generation may be much slower while other processes use the CPU. "
                       "Set GOMP_SPINCOUNT=%d before starting Python to avoid it", OPENMP_SPIN_COUNT)
        else:
            applied = {"GOMP_SPINCOUNT": str(OPENMP_SPIN_COUNT)}
    environ.update(applied)
    try:
        yield applied
    finally:
        for k in applied:
            environ.pop(k, None)


# Threads for decodes of a few rows (a token, a verify batch). A decode that takes a fraction of a millisecond is
# mostly its team's synchronisation: a barrier after nearly every op, and a team woken from sleep at each graph
# start (libgomp sleeps after OPENMP_SPIN_COUNT pauses, and the loop's host work between decodes is longer). On
# the bundled pair (128 wide) a token took 235 us on one thread and 375 us on two (2-core Ice Lake-SP). So such
# a decode is also timed on one thread and the faster kept; a longer one (a real model: E2B-sized 15-60 ms)
# never pays a probe.
FEW_ROWS_MAX = 16         # decodes of up to this many rows are timed
OVERHEAD_BOUND_S = 2e-3   # a median decode shorter than this may run faster on one thread
THREAD_SAMPLES = 5        # decodes timed per (rows, threads) before a choice
THREAD_RECHECK = 2000     # decodes of one size after which its choice is measured again (the machine may change)


class FewRowThreads:
    """Whether a context's decodes of at most ``FEW_ROWS_MAX`` rows run on one thread or on the budget the load
    leaves: one batch size timed both ways (the median of ``THREAD_SAMPLES`` decodes each; one thread only
    when the budget's median is under ``OVERHEAD_BOUND_S``), the faster kept for every such decode, and
    measured again every ``THREAD_RECHECK`` decodes. One choice per context, not per batch size: a context
    that switched between one and two threads from one round to the next ran its fixed 3-draft rounds 20 %
    slower than on either alone. Results do not depend on the thread count, so only the speed changes."""

    __slots__ = ("_times", "one", "_since")

    def __init__(self) -> None:
        self._times: dict[tuple[int, bool], list[float]] = {}  # (rows, on one thread) -> seconds
        self.one: bool | None = None  # decided: one thread is faster (None: still measuring)
        self._since = 0  # decodes since that decision

    def threads(self, rows: int, budget: int) -> int:
        """Threads for the next decode of ``rows`` rows, given the load's ``budget``."""
        if budget <= 1 or rows > FEW_ROWS_MAX:
            return budget
        one = self.one
        if one is None:  # measuring this size: first on the budget, then on one thread
            one = len(self._times.get((rows, False), ())) >= THREAD_SAMPLES
        return 1 if one else budget

    def record(self, rows: int, threads: int, budget: int, seconds: float) -> None:
        """A decode of ``rows`` rows on ``threads`` threads (the budget ``budget``) took ``seconds``."""
        if budget <= 1 or rows > FEW_ROWS_MAX:
            return
        if self.one is not None:
            self._since += 1
            if self._since >= THREAD_RECHECK:
                self.one = None
                self._times.clear()
            return
        one = threads == 1
        times = self._times.setdefault((rows, one), [])
        times.append(seconds)
        if len(times) != THREAD_SAMPLES:
            return
        if not one and statistics.median(times) >= OVERHEAD_BOUND_S:
            self._decide(False)
        elif one:
            self._decide(statistics.median(times) < statistics.median(self._times[(rows, False)]))

    def _decide(self, one: bool) -> None:
        self.one = one
        self._since = 0


__all__ = ["MAX_DEFAULT_THREADS", "OPENMP_SPIN_COUNT", "OPENMP_CHOICE_VARS", "ADAPT_INTERVAL_S", "ADAPT_SAMPLES",
           "cgroup_cpu_limit",
           "usable_cpus", "default_threads", "threads_per_slot", "check_threads", "runnable_threads",
           "threads_for_load", "libgomp_loaded", "openmp_defaults", "FEW_ROWS_MAX", "OVERHEAD_BOUND_S",
           "THREAD_SAMPLES", "THREAD_RECHECK", "FewRowThreads"]
