"""The queue and the port, on the real server (issue 26, item 11): a client that leaves while
its request is queued stops being counted at once, and ``serve`` on a port already in use fails
in seconds with a clear message, before it loads the model.

The server is :mod:`test_server`'s fixture (2 slots): two endless streams hold both slots while a
third request waits in the queue.
"""

from __future__ import annotations

import socket
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from test_server import LONG, PROMPTS, TIMEOUT_S, Server, _model_files, _no_eog, _serve_command, _wait_idle, \
    check_error, reference, server

__all__ = ["reference", "server"]  # fixtures used by name


def health(server: Server) -> dict[str, Any]:
    return httpx.get(f"{server.url}/health", timeout=TIMEOUT_S).json()


def wait_for(server: Server, ok: Any, timeout: float = 10.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while not ok(h := health(server)):
        if time.monotonic() > deadline:
            pytest.fail(f"/health never got there: {h}")
        time.sleep(0.05)
    return h


def test_health_stops_counting_a_queued_request_whose_client_left(server: Server, reference: Any) -> None:
    _wait_idle(server)
    body = {"prompt": PROMPTS[0], "max_tokens": LONG, "temperature": 0, "stream": True,
            "logit_bias": _no_eog(reference)}
    with server.client() as a, server.client() as b, a.stream("POST", "/v1/completions", json=body) as ra, \
            b.stream("POST", "/v1/completions", json=body) as rb:
        assert ra.status_code == rb.status_code == 200
        wait_for(server, lambda h: h["slots_processing"] == 2)
        with server.client() as c, pytest.raises(httpx.ReadTimeout):  # queued behind them, then gone
            c.post("/v1/completions", json={**body, "stream": False}, timeout=httpx.Timeout(TIMEOUT_S, read=0.2))
        # gone from the queue while both streams still run (a slot freeing up would have dropped it too)
        wait_for(server, lambda h: h["requests_queued"] == 0 and h["slots_processing"] == 2, timeout=1.5)
    _wait_idle(server)


def test_slots_fail_on_no_slot_answers_503_while_every_slot_is_busy(server: Server, reference: Any) -> None:
    _wait_idle(server)
    body = {"prompt": PROMPTS[0], "max_tokens": LONG, "temperature": 0, "stream": True,
            "logit_bias": _no_eog(reference)}
    with server.client() as a, server.client() as b, a.stream("POST", "/v1/completions", json=body), \
            b.stream("POST", "/v1/completions", json=body):
        wait_for(server, lambda h: h["slots_processing"] == 2)
        with server.client() as c:
            slots = c.get("/slots").json()
            busy = c.get("/slots", params={"fail_on_no_slot": 1})
    assert all(s["is_processing"] for s in slots)
    check_error(busy, 503, "unavailable")
    _wait_idle(server)
    with server.client() as c:
        assert c.get("/slots", params={"fail_on_no_slot": 1}).status_code == 200


def test_serve_on_a_port_in_use_fails_fast_before_loading_the_model(tmp_path: Path) -> None:
    target, _ = _model_files()
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        t0 = time.monotonic()
        # a model file that does not exist: were the model loaded first, that would be the error
        proc = subprocess.run(_serve_command() + ["serve", "-m", str(tmp_path / "missing.gguf"), "--port", str(port)],
                              capture_output=True, text=True, timeout=60, cwd=tmp_path)
        elapsed = time.monotonic() - t0
    assert proc.returncode != 0
    assert f"port {port} on 127.0.0.1 is already in use" in proc.stderr, proc.stderr
    assert "missing.gguf" not in proc.stderr and "Traceback" not in proc.stderr
    assert elapsed < 30 and target.is_file()
