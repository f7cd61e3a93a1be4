"""``mtp-bindings serve`` stopped while it works (issue 15, item 3), and its default length cap
(item 2): a real server process on loopback, real HTTP clients.

On Ctrl-C (SIGINT) the server must exit promptly, answer a non-streaming client with an
OpenAI-style JSON error, end a streaming client's stream with an error event, answer a queued
request too, and log no traceback."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from test_server import _free_port, _serve_command, _stop, _wait_healthy

N_CTX = 4096
LONG = 4000  # tokens asked for: seconds of work for the tiny model, so the signal lands mid-way
EXIT_S = 3.0  # how soon after SIGINT the process must be gone


def _start(tmp_path: Path, *flags: str) -> tuple[subprocess.Popen[bytes], str, Path]:
    port = _free_port()
    log = tmp_path / "serve.log"
    with log.open("wb") as sink:
        proc = subprocess.Popen(_serve_command() + ["serve", "--port", str(port), "-c", str(N_CTX), "-t", "1", *flags],
                                stdout=sink, stderr=subprocess.STDOUT, cwd=tmp_path,
                                env={**os.environ, "PYTHONUNBUFFERED": "1"})
    url = f"http://127.0.0.1:{port}"
    _wait_healthy(url, proc, log)
    return proc, url, log


# bans the end-of-text tokens of the bundled tiny model (<eos> 1, <end_of_turn> 5, see tools/README.md),
# so that a generation runs to its length
NO_EOG = {"1": -100.0, "5": -100.0}


def _processing(url: str) -> int:
    for line in httpx.get(f"{url}/metrics", timeout=5).text.splitlines():
        if line.startswith("mtp_requests_processing "):
            return int(float(line.split()[1]))
    return 0


def test_sigint_mid_request_answers_every_client_and_exits_promptly(tmp_path: Path) -> None:
    proc, url, log = _start(tmp_path, "-np", "2", "-n", "-1")
    body = {"prompt": "def main(argv):\n", "max_tokens": LONG, "temperature": 0, "logit_bias": NO_EOG}
    results: dict[str, Any] = {}
    streamed: list[str] = []
    first_chunk = threading.Event()

    def whole() -> None:
        results["whole"] = httpx.post(f"{url}/v1/completions", json=body, timeout=60)

    def queued() -> None:
        time.sleep(0.3)  # after the other two: both slots are busy, so this one waits in the queue
        results["queued"] = httpx.post(f"{url}/v1/completions", json=body, timeout=60)

    def stream() -> None:
        with httpx.stream("POST", f"{url}/v1/completions", json={**body, "stream": True}, timeout=60) as r:
            results["stream_status"] = r.status_code
            for line in r.iter_lines():
                if line.startswith("data: "):
                    streamed.append(line[6:])
                    first_chunk.set()

    threads = [threading.Thread(target=f) for f in (whole, stream, queued)]
    try:
        for t in threads:
            t.start()
        assert first_chunk.wait(30), "the stream produced nothing"
        deadline = time.monotonic() + 30
        while _processing(url) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.5)  # all three in flight: two generating, one queued
        t0 = time.monotonic()
        proc.send_signal(signal.SIGINT)
        proc.wait(30)
        exit_s = time.monotonic() - t0
        for t in threads:
            t.join(30)
    finally:
        _stop(proc)

    text = log.read_text()
    assert exit_s < EXIT_S, f"took {exit_s:.1f} s to exit:\n{text[-3000:]}"
    assert proc.returncode == 0, text[-3000:]
    assert "Traceback" not in text and "CancelledError" not in text, text[-3000:]
    for name in ("whole", "queued"):
        r = results[name]
        assert r.status_code == 503, (name, r.status_code, r.text)
        assert r.headers["content-type"].startswith("application/json")
        err = r.json()["error"]
        assert err["code"] == "server_shutting_down" and err["type"] == "server_error" and err["message"]
    assert results["stream_status"] == 200
    assert len(streamed) >= 2
    last = json.loads(streamed[-1])
    assert last["error"]["code"] == "server_shutting_down", streamed[-3:]
    assert any(json.loads(s).get("choices", [{}])[0].get("text") for s in streamed[:-1]), "no text before the end"


def test_a_request_without_max_tokens_gets_the_servers_n_predict(tmp_path: Path) -> None:
    proc, url, _ = _start(tmp_path, "-n", "7")
    try:
        body = {"prompt": "def main(argv):\n", "temperature": 0, "logit_bias": NO_EOG}
        r = httpx.post(f"{url}/v1/completions", json=body, timeout=60)
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["completion_tokens"] == 7 and r.json()["choices"][0]["finish_reason"] == "length"
        r = httpx.post(f"{url}/v1/completions", json={**body, "max_tokens": 9}, timeout=60)
        assert r.json()["usage"]["completion_tokens"] == 9  # a request's own limit wins
    finally:
        _stop(proc)


@pytest.mark.parametrize("n_predict, asked, room, expected", [
    (1024, None, 4000, 1024), (1024, 20, 4000, 20), (-1, None, 4000, 4000), (1024, None, 100, 100),
])
def test_generation_length_defaults(n_predict: int, asked: int | None, room: int, expected: int) -> None:
    from mtp_bindings.server import CompletionRequest, DraftDefaults, generation_kwargs

    req = CompletionRequest.model_validate({"prompt": "x", "max_tokens": asked})
    kwargs = generation_kwargs(req, DraftDefaults(), n_prompt=10, n_ctx=10 + room, n_vocab=1024, n_predict=n_predict)
    assert kwargs["max_tokens"] == expected
