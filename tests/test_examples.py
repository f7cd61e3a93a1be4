"""The examples run as written on the bundled models (the OpenAI one against a real server)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from test_server import _free_port, _serve_command, _stop, _wait_healthy

EXAMPLES = Path(__file__).parent.parent / "examples"


@pytest.mark.parametrize("script", ["quickstart.py", "streaming_chat.py", "low_level_async.py"])
def test_example_runs(script):
    out = subprocess.run([sys.executable, str(EXAMPLES / script)], capture_output=True, text=True, timeout=300,
                         cwd="/")
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip()


def test_openai_client_example_against_serve(tmp_path):
    port = _free_port()
    log = tmp_path / "serve.log"
    with log.open("wb") as sink:
        proc = subprocess.Popen(_serve_command() + ["serve", "--port", str(port), "-t", "1"], stdout=sink,
                                stderr=subprocess.STDOUT, cwd="/")
    try:
        _wait_healthy(f"http://127.0.0.1:{port}", proc, log)
        out = subprocess.run([sys.executable, str(EXAMPLES / "openai_client.py"), "--base-url",
                              f"http://127.0.0.1:{port}/v1"], capture_output=True, text=True, timeout=300, cwd="/")
        assert out.returncode == 0, out.stderr[-3000:]
        assert "tokens/s" in out.stdout
    finally:
        _stop(proc)
