"""The text of the C API's MTP status codes (``enum llama_mtp_status`` of the patched ``llama.h``).

The one Python copy of that table, until the C API says it itself (``llama_mtp_status_str``);
:mod:`._native` checks at import that it names every code the compiled header declares. Pure
Python, so error texts can be tested without the compiled extension.
"""

from __future__ import annotations

MTP_OK = 0
MTP_ERR_NO_ASSISTANT = -6
MTP_ERR_BUSY = -7

MTP_STATUS: dict[int, str] = {
    -1: "invalid argument (a NULL pointer)",
    -2: "the assistant file could not be loaded (unreadable or malformed)",
    -3: "not a Gemma 4 assistant for this target (architecture or attention layout)",
    -4: "the assistant's backbone width does not match the target's hidden size",
    -5: "the assistant's vocabulary is not compatible with the target's",
    -6: "no MTP assistant is attached to the model",
    -7: "an MTP request is already in flight (or nothing is pending to wait for)",
    -8: "invalid seq_id",
    -9: "n_steps out of range",
    -10: "attn_pos must be the sequence's last KV position (llama_memory_seq_pos_max)",
    -11: "last_token is outside the vocabulary",
    -12: "the MTP graph computation failed",
    -13: "an assistant is already attached to this model",
}


def status_text(rc: int) -> str:
    """What MTP status ``rc`` means (``error N`` for a code this table does not know)."""
    return MTP_STATUS.get(rc, f"error {rc}")
