"""The one pydantic config every request body's models are read with.

One job: strict types (``"0.5"`` is not a number, ``true`` is not an int), so that a client bug is a
400 rather than a silently different generation; fields a model does not name are ignored (OpenAI
clients send extras; :mod:`.unsupported` refuses the ones that would change the output); no NaN or
infinity.
"""

from __future__ import annotations

from pydantic import ConfigDict

STRICT = ConfigDict(extra="ignore", strict=True, allow_inf_nan=False)
