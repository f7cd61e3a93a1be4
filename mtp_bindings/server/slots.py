"""The slot pool: ``n_slots`` llama.cpp contexts on the one shared model, each driven by its own
worker thread, and the FIFO queue of jobs they take from.

One job: run generations off the event loop and hand their pieces back to it. A request becomes
a :class:`Job` (prompt tokens and :func:`generate` arguments in, pieces out through an asyncio
queue on the server's loop, a cancel flag the worker polls each round); the first free slot
takes it. Each slot's context keeps its last request's KV: the next request on it decodes only what
follows the longest common token prefix (the prompt cache, :mod:`~mtp_bindings.generation.prompt_cache`;
``cache_prompt``). Jobs go to the first free slot, not to the one holding their prefix.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Mapping
from typing import Any

from ..exceptions import MTPBindingsError
from ..generation.driver import generate
from ..generation.prompt_cache import cached_prefix
from ..generation.stats import GenerationStats
from .errors import APIError
from .metrics import ServerMetrics

logger = logging.getLogger(__name__)

END = object()  # put on a job's queue after its last piece (or its error)
_JOB_IDS = itertools.count()


class Job:
    """One generation request: prompt tokens and ``generate`` arguments in, pieces out (through
    an asyncio queue on the server's event loop), and a cancel flag the worker polls each round."""

    def __init__(self, tokens: list[int], kwargs: dict[str, Any], loop: asyncio.AbstractEventLoop) -> None:
        self.tokens = tokens
        self.kwargs = kwargs
        self.loop = loop
        self.items: asyncio.Queue[Any] = asyncio.Queue()
        self._cancel = threading.Event()
        self.checked_at = time.monotonic()  # when the handler last checked the client was there
        self.error: APIError | None = None  # why the server (not the client) stopped it
        self.slot = -1  # the slot that took it (-1: none yet)
        self.id = next(_JOB_IDS)  # llama-server's id_task

    def cancel(self) -> None:
        """Stop the generation at its next round (idempotent; a no-op once it has finished)."""
        self._cancel.set()

    def abort(self, error: APIError) -> None:
        """Stop the generation and answer its client with ``error`` instead of its text."""
        self.error = error
        self._cancel.set()

    @property
    def cancelled(self) -> bool:
        return self._cancel.is_set()

    def put(self, item: Any) -> None:
        """Hand ``item`` to the event loop (from a worker thread)."""
        try:
            self.loop.call_soon_threadsafe(self.items.put_nowait, item)
        except RuntimeError:  # the loop is closed: the server is shutting down
            pass


class SlotPool:
    """``n_slots`` contexts on one model, each driven by its own worker thread, and the FIFO queue
    of jobs waiting for a free one. A job goes to the free slot whose context holds the longest
    prefix of its prompt (the least recently used one when none does), as llama-server picks a
    slot by prompt similarity: a chat's next turn lands where its previous turns' KV is."""

    def __init__(self, model: Any, n_slots: int, context_kwargs: Mapping[str, Any], metrics: ServerMetrics) -> None:
        self.model = model
        self.n_slots = n_slots
        self.context_kwargs = dict(context_kwargs)
        self.metrics = metrics
        self.pending: deque[Job] = deque()  # FIFO of jobs no slot has taken yet
        self.inboxes: list[queue.Queue[Job | None]] = []  # one per slot: its next job, or None to stop
        self.idle: list[int] = []  # free slots, least recently used first
        self._lock = threading.Lock()  # guards pending and idle (the event loop and the workers use them)
        self.contexts: list[Any] = []
        self.threads: list[threading.Thread] = []
        self.active: dict[int, Job] = {}
        self.last: dict[int, Job] = {}  # each slot's latest job (running or done), for /slots
        self.closing: APIError | None = None  # set when the server stops: new jobs are refused with it

    def start(self) -> None:
        """Create the contexts (so a bad n_ctx fails at startup, not on the first request) and
        start their workers."""
        for i in range(self.n_slots):
            ctx = self.model.create_context(**self.context_kwargs)
            self.contexts.append(ctx)
            self.inboxes.append(queue.Queue())
            t = threading.Thread(target=self._worker, args=(i, ctx), name=f"mtp-slot-{i}", daemon=True)
            self.threads.append(t)
            t.start()
            with self._lock:
                self.idle.append(i)

    def submit(self, job: Job) -> None:
        if self.closing is not None:
            raise self.closing
        self.metrics.job_queued()
        with self._lock:
            self.pending.append(job)
            self._dispatch()

    def cancel(self, job: Job) -> None:
        """Stop ``job``: one still queued leaves the queue now, so that ``/health`` and the metrics
        stop counting it (a client gone while queued); one running stops at its next round."""
        job.cancel()
        with self._lock:
            try:
                self.pending.remove(job)
            except ValueError:  # a slot has it (or had it)
                return
        self.metrics.job_skipped()

    def _dispatch(self) -> None:
        """Hand waiting jobs to free slots, in order (under ``_lock``)."""
        while self.pending and self.idle:
            job = self.pending.popleft()
            slot = max(self.idle, key=lambda i: cached_prefix(self.contexts[i], job.tokens))  # ties: the first
            self.idle.remove(slot)
            self.inboxes[slot].put(job)

    def try_reserve(self, slot: int) -> Any | None:
        """Slot ``slot``'s context, taken off the free list so that no job starts on it until
        :meth:`release` (its state is being saved or restored); None while a job runs there."""
        with self._lock:
            if slot not in self.idle:
                return None
            self.idle.remove(slot)
            return self.contexts[slot]

    def release(self, slot: int) -> None:
        """Give a slot :meth:`try_reserve` took back to the jobs."""
        with self._lock:
            self.idle.append(slot)
            self._dispatch()

    def abort_all(self, error: APIError) -> None:
        """The server is stopping: refuse new jobs, answer the queued ones with ``error`` now and
        stop the running ones at their next round (their handlers answer with ``error`` too)."""
        self.closing = error
        for job in self._drain_queue():
            job.abort(error)
        for job in list(self.active.values()):
            job.abort(error)

    def _drain_queue(self) -> list[Job]:
        """Take every waiting job off the queue, counted as skipped and told it has ended."""
        with self._lock:
            drained = list(self.pending)
            self.pending.clear()
        for job in drained:
            job.cancel()
            self.metrics.job_skipped()
            job.put(END)
        return drained

    def stop(self, timeout: float = 10.0) -> None:
        """Drop what is queued, cancel what runs, stop the workers, and free the contexts whose
        worker has exited."""
        self._drain_queue()
        for job in list(self.active.values()):
            job.cancel()
        for inbox in self.inboxes:
            inbox.put(None)
        deadline = time.monotonic() + timeout
        for t, ctx in zip(self.threads, self.contexts):
            t.join(max(0.0, deadline - time.monotonic()))
            if t.is_alive():
                logger.warning("slot worker %s did not stop; leaving its context open", t.name)
            else:
                ctx.close()
        self.threads.clear()
        self.contexts.clear()

    def _worker(self, slot: int, ctx: Any) -> None:
        while True:
            job = self.inboxes[slot].get()
            if job is None:
                return
            try:
                if job.cancelled:  # the client left while the job was queued
                    self.metrics.job_skipped()
                    job.put(END)
                    continue
                self.metrics.job_started()
                job.slot = slot
                self.active[slot] = self.last[slot] = job
                try:
                    self._execute(ctx, job)
                finally:
                    self.active.pop(slot, None)
                    self.metrics.job_finished()
                    job.put(END)
            finally:
                with self._lock:
                    self.idle.append(slot)
                    self._dispatch()

    def _execute(self, ctx: Any, job: Job) -> None:
        try:
            for piece in generate(self.model, job.tokens, context=ctx, stream=True,
                                  cancel=lambda: job.cancelled, **job.kwargs):
                if piece.stats is not None:
                    self.metrics.record_generation(piece.stats, piece.finish_reason or "stop")
                    _log_generation(piece.stats, piece.finish_reason)
                job.put(piece)
        except Exception as e:  # handed to the request handler, which answers with it
            if not isinstance(e, MTPBindingsError):
                logger.exception("generation failed")
            job.put(e)


def _log_generation(stats: GenerationStats, finish_reason: str | None) -> None:
    acc = f", acceptance {stats.acceptance_rate:.1%} of {stats.n_drafted} drafted" if stats.n_drafted else ""
    logger.info("generated %d tokens (prompt %d) at %.1f tokens/s, finish %s%s", stats.n_generated,
                stats.n_prompt, stats.tokens_per_second, finish_reason, acc)

