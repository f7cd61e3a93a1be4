"""Ctrl-C in the ``mtp-bindings`` command line, as in llama-cli.

* While a model loads, Ctrl-C stops the load (through the load's progress callback) and the
  command exits with status 130, quietly: a ``KeyboardInterrupt`` raised inside llama.cpp's
  callbacks would only print a traceback (cffi cannot pass it through C).
* While text is generated, the first Ctrl-C stops the generation at its next round, so that what
  was generated is still printed, with its stats (``generate``), or the chat goes on to the next
  prompt (``chat``); a second Ctrl-C interrupts at once.
* Anywhere else (e.g. ``chat`` waiting at its prompt) Ctrl-C is Python's ``KeyboardInterrupt``.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from types import FrameType

INTERRUPTED = 130  # exit status after Ctrl-C (128 + SIGINT), as llama-cli and shells use


class Interrupt:
    """Remembers Ctrl-C while a phase that must not be interrupted mid-way runs."""

    def __init__(self) -> None:
        self._flag = threading.Event()

    @property
    def requested(self) -> bool:
        return self._flag.is_set()

    def __call__(self) -> bool:
        """The generation's ``cancel`` callback: True once Ctrl-C was pressed."""
        return self._flag.is_set()

    def keep_loading(self, progress: float) -> bool:
        """The load's progress callback: False (stop loading) once Ctrl-C was pressed."""
        return not self._flag.is_set()

    @contextlib.contextmanager
    def deferred(self, second_raises: bool = True) -> Iterator[Interrupt]:
        """Within the block, Ctrl-C sets :attr:`requested` instead of raising; a second one raises
        ``KeyboardInterrupt`` (unless ``second_raises`` is False). Outside the main thread (where
        Python delivers no signals) it does nothing."""
        self._flag.clear()
        if threading.current_thread() is not threading.main_thread():
            yield self
            return

        def on_sigint(signum: int, frame: FrameType | None) -> None:
            if self._flag.is_set() and second_raises:
                raise KeyboardInterrupt
            self._flag.set()

        previous = signal.signal(signal.SIGINT, on_sigint)
        try:
            yield self
        finally:
            signal.signal(signal.SIGINT, previous)
