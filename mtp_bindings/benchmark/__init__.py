"""Benchmarks against upstream llama.cpp (``mtp-bindings bench``; project issue 6).

Three parts, each optional (``--parts``):

``inproc``
    The matrix: systems x ``draft_n_max`` x KV type x output length x temperature, ``runs`` runs a
    cell. *Ours* is timed in this process through :meth:`Model.generate` (its own
    ``GenerationStats``); *upstream* is the bundled ``llama-server`` built from the same pinned
    tree (plain, and ``--spec-type draft-mtp``), timed by the generation ``timings`` it reports.
    Systems are interleaved in random order inside every (run, cell), so a ratio between two
    systems compares measurements taken seconds apart.
``http``
    End to end over HTTP: our ``mtp-bindings serve`` against upstream's server, same client
    (``http.client``), same ``/v1/completions`` request bodies, client-side wall time.
``cost``
    Cost structure at real Gemma 4 E2B shapes with random weights (written here with the gguf package):
    draft step time (ours dense / ours centroid head / upstream dense), verify time of 1..5
    tokens, bytes moved to the host per draft step, prompt processing with and without an
    assistant, the Python driver's own time per round, memory of attaching an assistant, and the
    expected speedup per ``draft_n_max`` from these costs and the measured acceptance.

Results: ``<out>/bench.json``, ``<out>/bench.md`` and PNG plots (matplotlib, the ``[bench]``
extra). Run ``mtp-bindings bench --help``.
"""

from __future__ import annotations

from .command import add_arguments, main, main_args
from .config import BenchConfig, config_for, llama_server_path
from .runner import run

__all__ = ["BenchConfig", "add_arguments", "config_for", "llama_server_path", "main", "main_args", "run"]
