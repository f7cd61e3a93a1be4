"""``GenerationTurn``: which generation owns a context, so that two never interleave on one KV cache.

A generation owns its context from its first token to its end, a stream suspended between two
pieces included. Another one asked of it meanwhile:

* waits its turn when the owner is another thread's whole (non-stream) generation: that one is
  running to its end;
* raises :class:`~mtp_bindings.exceptions.ContextBusyError` at once when the owner is a stream (its
  reader may keep it suspended in a variable for any time) or a generation on the same thread
  (which cannot go on while this one waits): either wait could last forever.

Between two rounds of the owner (a stream suspended between pieces, say) a decode or a KV edit of
the context from outside the generation would corrupt it silently, so :meth:`GenerationTurn.check`
refuses it with :class:`~mtp_bindings.exceptions.ContextBusyError`; the owner's own calls run
inside :meth:`GenerationTurn.round`.

Pure Python (threading only).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

from .exceptions import ContextBusyError


class GenerationTurn:
    """The owner of one context's generations (see the module's docstring)."""

    def __init__(self) -> None:
        # (the owner's thread, whether it streams); None when free
        self._owner: tuple[int, bool] | None = None
        self._cond = threading.Condition(threading.Lock())
        self._in_round = False  # the owner is inside one of its rounds (the context's lock held)

    @property
    def busy(self) -> bool:
        return self._owner is not None

    @contextmanager
    def claim(self, stream: bool = True) -> Iterator[None]:
        """Own the context for the ``with`` block (``stream``: the generation is a stream)."""
        me = threading.get_ident()
        with self._cond:
            while self._owner is not None:
                owner, owner_streams = self._owner
                if owner_streams or owner == me:
                    what = "a stream not yet read to its end or closed" if owner_streams else \
                        "a generation on this same thread"
                    raise ContextBusyError(
                        f"another generation is using this context ({what}): give this one its own context "
                        "(model.create_context()), or leave context= out and the model lends a free one")
                self._cond.wait()
            self._owner = (me, bool(stream))
        try:
            yield
        finally:
            with self._cond:
                self._owner = None
                self._cond.notify_all()

    def round(self, lock: threading.RLock) -> RoundScope:
        """One round of the owner, ``lock`` (the context's) held: its decodes and KV edits."""
        return RoundScope(lock, self)

    def check(self) -> None:
        """Refuse a decode or KV edit from outside the owning generation (call under the context's lock)."""
        if self._owner is not None and not self._in_round:
            raise ContextBusyError("a generation owns this context (a stream not yet read to its end or closed?): "
                                   "decoding or editing its KV now would corrupt it; close or finish the stream "
                                   "first, or use another context")


class RoundScope:
    """A context manager for the rounds of a generation: the context's lock held and the turn's round flag
    set. One object serves every round of a context (a generator-based manager and a lock's own ``with``
    per round cost ~4 us of a round's host work, ~3x that after a decode that evicted the caches)."""

    __slots__ = ("_lock", "_turn")

    def __init__(self, lock: threading.RLock, turn: GenerationTurn) -> None:
        self._lock = lock
        self._turn = turn

    def __enter__(self) -> None:
        self._lock.acquire()
        self._turn._in_round = True

    def __exit__(self, *exc: object) -> None:
        self._turn._in_round = False
        self._lock.release()
