"""Default lengths, in one place (pure Python: the command line reads them before loading anything).

* ``DEFAULT_N_CTX``: the context a generation gets when none is given (``Model.generate``, the
  command line's ``-c``), capped at the model's training context. Why 4096, between
  llama-cpp-python's 512 and llama-server's whole training context (128K tokens for Gemma 4): a
  context's KV cache is allocated in full when it is made, and ``generate`` may hold a few (one per
  overlapping generation, two idle), so the default fits ordinary prompts and replies without
  taking gigabytes; more is one setting away: ``Model(path, n_ctx=8192)`` (``n_ctx=0``: the
  training context), ``-c`` on the command line. The overflow error says so.
* ``CLI_N_PREDICT``: tokens ``mtp-bindings generate`` / ``chat`` write unless ``-n`` says otherwise.
* ``SERVER_N_PREDICT``: tokens a server request generates when it sets no ``max_tokens``
  (llama-server's ``-n``): one forgotten limit must not hold a slot for many minutes.
* ``UNTIL_FULL``: the ``-n`` value (llama.cpp's) for "until end of text or a full context".
"""

DEFAULT_N_CTX = 4096
CLI_N_PREDICT = 128
SERVER_N_PREDICT = 1024
UNTIL_FULL = -1


def default_n_ctx(n_ctx_train: int) -> int:
    """The default context for a model trained on ``n_ctx_train`` tokens (0: unknown)."""
    return min(DEFAULT_N_CTX, n_ctx_train) if n_ctx_train > 0 else DEFAULT_N_CTX
