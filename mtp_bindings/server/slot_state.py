"""llama-server's slot actions: ``POST /slots/{id_slot}?action=save|restore|erase`` with body
``{"filename": NAME}`` (``serve --slot-save-path DIR``), in llama-server's response shapes.

One job: these routes. A save writes the slot's sequence (KV cells and the tokens of its last
request) to ``DIR/NAME`` and a restore reads it back, both through
:mod:`mtp_bindings.generation.state` (drafting drained first; the restored tokens go to the slot's
prompt cache, so the next request whose prompt starts with them goes to that slot and decodes only
what follows). ``erase`` empties the slot. A slot busy with a request is waited for, as llama-server
defers the action. ``NAME`` is checked as llama-server's ``fs_validate_filename`` checks it (no
``/``, ``\\``, ``..``, control or look-alike characters): a file outside ``DIR`` is never touched.
Without ``--slot-save-path`` every action is a 501 ``not_supported_error``.
"""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from typing import Any

import anyio
from fastapi import Depends, FastAPI, Request

from ..exceptions import ContextError
from ..generation.prompt_cache import prompt_cache
from ..generation.state import StateIO, load_state, save_state
from .auth import BearerKey
from .errors import APIError
from .handlers import MAX_BODY_BYTES, Server

NOT_ENABLED = "This server does not support slots action. Start it with `--slot-save-path`"  # llama-server's words
BUSY_POLL_S = 0.05  # how often a slot busy with a request is looked at again
NAME_MAX_BYTES = 255
# characters llama-server's fs_validate_filename refuses, beyond controls and path separators
_REFUSED = set(':*?"<>|') | {"\uff0e", "\u2215", "\u2216", "\ufffd", "\ufeff"}


def valid_filename(name: Any) -> bool:
    """Whether ``name`` is a plain file name llama-server would accept (no directory part)."""
    if not isinstance(name, str) or not name or len(name.encode("utf-8", "surrogatepass")) > NAME_MAX_BYTES:
        return False
    for c in name:
        o = ord(c)
        if o <= 0x1F or o == 0x7F or 0x80 <= o <= 0x9F or 0xD800 <= o <= 0xDFFF or c in _REFUSED or c in "/\\":
            return False
    return not (name[0] == " " or name[-1] in " ." or ".." in name or name == ".")


def add_slot_state_routes(app: FastAPI, server: Server, key: BearerKey, *,
                          save_path: str | os.PathLike[str] | None) -> None:
    """Wire ``POST /slots/{id_slot}`` into ``app``; with ``save_path`` the folder is created now."""
    folder = Path(save_path) if save_path is not None else None
    if folder is not None:
        folder.mkdir(parents=True, exist_ok=True)

    @app.post("/slots/{id_slot}", dependencies=[Depends(key)])
    async def slot_action(id_slot: str, request: Request, action: str = "") -> dict[str, Any]:
        if folder is None:
            raise APIError(501, NOT_ENABLED, type="not_supported_error", code="not_supported")
        slot = _slot_id(id_slot, server.pool.n_slots)
        if action not in ("save", "restore", "erase"):
            raise APIError(400, "Invalid action", param="action", code="invalid_value")
        name = None if action == "erase" else await _filename(request)
        ctx = await _reserve(server, slot)
        try:
            return await anyio.to_thread.run_sync(_act, action, ctx, slot, folder, name)
        finally:
            server.pool.release(slot)


def _slot_id(text: str, n_slots: int) -> int:
    try:
        slot = int(text)
    except ValueError:
        slot = -1
    if not 0 <= slot < n_slots:
        raise APIError(400, "Invalid slot ID", param="id_slot", code="invalid_value")
    return slot


async def _filename(request: Request) -> str:
    raw = await request.body()
    if len(raw) > MAX_BODY_BYTES:
        raise APIError(413, f"the request body exceeds {MAX_BODY_BYTES} bytes", code="request_too_large")
    try:
        body = json.loads(raw)
    except ValueError as e:
        raise APIError(400, f"could not parse the request body as JSON: {e}", code="invalid_json") from None
    if not isinstance(body, dict) or "filename" not in body:
        raise APIError(400, "filename: required", param="filename", code="missing_required_parameter")
    if not valid_filename(body["filename"]):
        raise APIError(400, "Invalid filename", param="filename", code="invalid_value")
    return str(body["filename"])


async def _reserve(server: Server, slot: int) -> Any:
    """The slot's context once no request runs on it (as llama-server defers the action)."""
    while True:
        if server.pool.closing is not None:
            raise server.pool.closing
        ctx = server.pool.try_reserve(slot)
        if ctx is not None:
            return ctx
        await asyncio.sleep(BUSY_POLL_S)


def _act(action: str, ctx: Any, slot: int, folder: Path, name: str | None) -> dict[str, Any]:
    if action == "erase":
        n = len(prompt_cache(ctx).held.get(0, []))
        ctx.clear()
        return {"id_slot": slot, "n_erased": n}
    assert name is not None
    path = folder / name
    if action == "save":
        try:
            done: StateIO = save_state(ctx, path)
        except ContextError as e:
            raise APIError(500, f"Unable to save slot: {e}", type="server_error") from None
        return {"id_slot": slot, "filename": name, "n_saved": len(done.tokens), "n_written": done.n_bytes,
                "timings": {"save_ms": done.ms}}
    if not path.is_file():
        raise APIError(400, f"no saved slot named {name!r}", param="filename", code="invalid_value")
    try:
        done = load_state(ctx, path)
    except ContextError as e:
        raise APIError(400, f"No available space in KV cache or invalid slot save file: {e}", param="filename",
                       code="invalid_value") from None
    return {"id_slot": slot, "filename": name, "n_restored": len(done.tokens), "n_read": done.n_bytes,
            "timings": {"restore_ms": done.ms}}
