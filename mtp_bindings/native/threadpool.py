"""``ThreadPool``: a ggml compute threadpool — its own threads, with a priority, a polling level and a
CPU placement — for a context's asynchronous MTP drafting (:meth:`MTPContext.attach_mtp_threadpool`)::

    with ThreadPool(2, priority="high", cpus=[2, 3]) as pool:
        ctx.attach_mtp_threadpool(pool)   # drafting requests in flight compute on CPUs 2 and 3
        ...

ggml's CPU backend may be a dynamically loaded module (the portable wheel's CPU variants), so its
threadpool functions are looked up through its registry, once. A pool keeps a list of what it is
attached to and detaches itself from each before it is freed, so closing it early is safe.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Sequence
from typing import Any

from . import _native
from ._handle import NativeHandle
from ._native import ffi, lib
from ..exceptions import InvalidParameterError, MTPBindingsError
from ..config.params import THREADS_MAX, valid_thread_count

# ggml_sched_priority by name; "realtime" needs the privilege to raise priorities (ggml warns without it)
PRIORITIES = {"low": lib.GGML_SCHED_PRIO_LOW, "normal": lib.GGML_SCHED_PRIO_NORMAL,
              "medium": lib.GGML_SCHED_PRIO_MEDIUM, "high": lib.GGML_SCHED_PRIO_HIGH,
              "realtime": lib.GGML_SCHED_PRIO_REALTIME}
POLL_MAX = 100  # ggml's polling level: 0 sleeps at once, 100 polls the longest
DEFAULT_POLL = 50  # ggml_threadpool_params_default's

_FUNCTIONS: dict[str, Any] = {}
_SIGNATURES = {"ggml_threadpool_new": "struct ggml_threadpool * (*)(struct ggml_threadpool_params *)",
               "ggml_threadpool_free": "void (*)(struct ggml_threadpool *)",
               "ggml_threadpool_get_n_threads": "int (*)(struct ggml_threadpool *)"}


def _function(name: str) -> Any:
    """A threadpool function of the CPU backend's registry."""
    if name not in _FUNCTIONS:
        fn = _native.registry_function("CPU", name, _SIGNATURES[name])
        if fn is None:
            raise MTPBindingsError(f"the CPU backend does not provide {name}")
        _FUNCTIONS[name] = fn
    return _FUNCTIONS[name]


def _check(n_threads: int, priority: str, poll: int, cpus: Sequence[int] | None, strict_cpu: bool) -> None:
    if not valid_thread_count(n_threads):
        raise InvalidParameterError(f"n_threads must be an int in 1..{THREADS_MAX}, got {n_threads!r}")
    if priority not in PRIORITIES:
        raise InvalidParameterError(f"priority must be one of {', '.join(PRIORITIES)}, got {priority!r}")
    if not isinstance(poll, int) or isinstance(poll, bool) or not 0 <= poll <= POLL_MAX:
        raise InvalidParameterError(f"poll must be an int in 0..{POLL_MAX}, got {poll!r}")
    if not isinstance(strict_cpu, bool):
        raise InvalidParameterError(f"strict_cpu must be a bool, got {strict_cpu!r}")
    if cpus is not None:
        n_cpus = os.cpu_count() or 1
        if isinstance(cpus, (str, bytes)) or not all(isinstance(c, int) and not isinstance(c, bool)
                                                      and 0 <= c < n_cpus for c in cpus):
            raise InvalidParameterError(f"cpus must be CPU numbers in 0..{n_cpus - 1}, got {cpus!r}")


class ThreadPool(NativeHandle):
    """``n_threads`` compute threads; ``priority`` one of :data:`PRIORITIES`, ``poll`` how long an idle
    thread polls for work before it sleeps (0..100), ``cpus`` the CPUs the threads may run on (None:
    the process's), ``strict_cpu`` one CPU of them per thread. Close it (or use ``with``) to free it."""

    closed_error = InvalidParameterError
    kind = "threadpool"

    def __init__(self, n_threads: int, *, priority: str = "normal", poll: int = DEFAULT_POLL,
                 cpus: Sequence[int] | None = None, strict_cpu: bool = False) -> None:
        self._lock = threading.RLock()
        self._users: dict[int, Callable[[], None]] = {}
        _check(n_threads, priority, poll, cpus, strict_cpu)
        params = ffi.new("struct ggml_threadpool_params *", lib.ggml_threadpool_params_default(n_threads))
        params.prio = PRIORITIES[priority]
        params.poll = poll
        params.strict_cpu = strict_cpu
        for cpu in cpus or ():
            params.cpumask[cpu] = True
        _native.clear_errors()
        ptr = _function("ggml_threadpool_new")(params)
        if ptr == ffi.NULL:
            _native.raise_native(MTPBindingsError, f"cannot create a threadpool of {n_threads} threads")
        self._ptr = ptr
        self.n_threads = int(_function("ggml_threadpool_get_n_threads")(ptr))
        self.priority, self.poll, self.cpus, self.strict_cpu = priority, poll, list(cpus or ()), strict_cpu

    def add_user(self, key: int, detach: Callable[[], None]) -> None:
        """Remember that something computes on this pool; ``detach()`` takes the pool from it."""
        with self._lock:
            self.ptr  # noqa: B018 (raises once closed)
            self._users[key] = detach

    def remove_user(self, key: int) -> None:
        with self._lock:
            self._users.pop(key, None)

    def close(self) -> None:
        """Detach the pool from everything it is attached to, then free it. Idempotent."""
        with self._lock:
            users = list(self._users.values())
        for detach in users:  # outside the pool's lock: a detach takes its context's lock
            detach()
        super().close()

    def _free(self) -> None:
        _function("ggml_threadpool_free")(self._ptr)

    def __repr__(self) -> str:
        state = "closed" if self.closed else f"{self.n_threads} threads, priority {self.priority}"
        return f"ThreadPool({state})"
