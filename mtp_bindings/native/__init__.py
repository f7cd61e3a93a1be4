"""The native layer: everything that touches the compiled cffi module.

:mod:`._native` loads it once (symbol check, native logs, :func:`~._native.raise_native`),
:mod:`._backends` picks where ggml's backend modules load from, :mod:`.devices` and
:mod:`.threadpool` wrap ggml's devices and compute threadpools, :mod:`._handle` owns a native
pointer's lifetime, :mod:`._model_file` checks a file before a load, :mod:`.mtp_status` names the
MTP status codes. Importing this package loads nothing: each module does, on import.
"""
