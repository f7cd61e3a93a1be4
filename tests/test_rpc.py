"""Multi-machine over ggml RPC (issue 17): the trained pair with its layers split across two
``rpc-server`` workers on loopback gives the local run's greedy tokens, plain and with MTP, and the
same MTP acceptance; a bad or unreachable endpoint is a typed error within its time limit; ``--rpc``
reaches the model from the command line.

The workers are started as users start them, ``mtp-bindings rpc-server -H 127.0.0.1 -p PORT -t 1``.
ggml keeps a connection to a server open for the rest of the process once a model used it, and an
rpc-server serves one client at a time: so the command-line check gets a worker of its own.
"""

from __future__ import annotations

import contextlib
import json
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from native_log import native_log
from test_server import _free_port, _mtp_available, _serve_command, running_server

PROMPT = "import os\nimport sys\n\n\ndef parse_args(argv):\n"
N_TOKENS = 32
DRAFT_N_MAX = 2
START_TIMEOUT_S = 20.0


def _wait_listening(port: int, proc: subprocess.Popen[bytes], log: Path) -> None:
    """Until ``port`` accepts a connection (bounded); the probe connection is closed at once, which the
    server takes as a client that left."""
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"rpc-server exited with {proc.returncode}: {log.read_text(errors='replace')}")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return
        time.sleep(0.05)
    pytest.fail(f"rpc-server did not listen on {port} within {START_TIMEOUT_S:g} s: {log.read_text(errors='replace')}")


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)


@contextlib.contextmanager
def rpc_workers(n: int, folder: Path) -> Iterator[list[str]]:
    """``n`` rpc-servers on free loopback ports, one thread each; their endpoints; stopped on exit."""
    procs: list[subprocess.Popen[bytes]] = []
    try:
        endpoints = []
        for _ in range(n):
            port = _free_port()
            log = folder / f"rpc-server-{port}.log"
            with log.open("wb") as sink:
                # `mtp-bindings rpc-server` execs the binary: proc is the server itself
                procs.append(subprocess.Popen(_serve_command() + ["rpc-server", "-H", "127.0.0.1", "-p", str(port),
                                                                  "-t", "1"], stdout=sink, stderr=subprocess.STDOUT))
            _wait_listening(port, procs[-1], log)
            endpoints.append(f"127.0.0.1:{port}")
        yield endpoints
    finally:
        for proc in procs:
            _stop(proc)


@pytest.fixture(scope="module")
def workers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[str]]:
    with rpc_workers(2, tmp_path_factory.mktemp("rpc")) as endpoints:
        yield endpoints


def _generate(model: Any, draft_n_max: int) -> Any:
    """Greedy, on a fresh context of one thread (no prompt cache carried from another run)."""
    with model.create_context(n_ctx=256, n_threads=1, embeddings=model.has_assistant) as ctx:
        return model.generate(PROMPT, max_tokens=N_TOKENS, temperature=0.0, draft_n_max=draft_n_max, context=ctx)


@pytest.fixture(scope="module")
def local_runs(trained_paths: tuple[Path, Path]) -> dict[bool, dict[str, Any]]:
    """The local CPU runs, plain and MTP, with repacked weights (llama.cpp's default) and without."""
    from mtp_bindings import Model

    target, assistant = trained_paths
    if not _mtp_available(assistant):
        pytest.skip("this build cannot attach an assistant")
    runs = {}
    for repack in (True, False):
        with Model(target, assistant=assistant, repack=repack) as model:
            runs[repack] = {"plain": _generate(model, 0), "mtp": _generate(model, DRAFT_N_MAX)}
    return runs


@pytest.fixture(scope="module")
def rpc_runs(workers: list[str], trained_paths: tuple[Path, Path],
             local_runs: dict[bool, dict[str, Any]]) -> dict[str, Any]:
    """The same runs with every layer (-ngl 99) split across the two workers, and the load log."""
    from mtp_bindings import Model

    target, assistant = trained_paths
    with native_log() as lines, Model(target, assistant=assistant, rpc_servers=",".join(workers), n_gpu_layers=99,
                                      verbose=True) as model:
        return {"plain": _generate(model, 0), "mtp": _generate(model, DRAFT_N_MAX),
                "devices": model.rpc_devices, "log": lines, "endpoints": workers}


def test_the_layers_are_split_across_both_workers(rpc_runs: dict[str, Any]) -> None:
    devices = rpc_runs["devices"]
    assert len(set(devices)) == 2 and all(d.startswith("RPC") for d in devices), devices
    # llama.cpp's load log names a model buffer on each worker that holds weights, as
    # "RPC<device on the server>[<endpoint>] model buffer size = ..."
    for endpoint in rpc_runs["endpoints"]:
        assert any(f"[{endpoint}] model buffer size" in line for line in rpc_runs["log"]), \
            f"no weights on {endpoint}: " + "\n".join(line for line in rpc_runs["log"] if "buffer size" in line)


def test_greedy_tokens_equal_the_local_run(rpc_runs: dict[str, Any], local_runs: dict[bool, dict[str, Any]]) -> None:
    # Over RPC the weights are held as stored (no repacked CPU layouts on a remote buffer): the local run
    # to match is the one with repack=False (llama-server's --no-repack)
    local = local_runs[False]
    # exact: the remote runs the same CPU kernels on the same (unrepacked) weights, and MTP's verify rows
    # are one-token decodes' rows (tests/numerics.py)
    assert rpc_runs["plain"].tokens == local["plain"].tokens
    assert rpc_runs["mtp"].tokens == local["mtp"].tokens
    assert local["plain"].tokens == local["mtp"].tokens  # MTP is lossless locally too
    assert len(rpc_runs["plain"].tokens) == N_TOKENS


def test_mtp_acceptance_is_unchanged_over_rpc(rpc_runs: dict[str, Any], local_runs: dict[bool, dict[str, Any]]) -> None:
    local, remote = local_runs[False]["mtp"].stats, rpc_runs["mtp"].stats
    assert remote.n_drafted > 0
    assert (remote.n_drafted, remote.n_accepted) == (local.n_drafted, local.n_accepted)


def test_a_model_without_rpc_servers_does_not_use_them(workers: list[str], rpc_runs: dict[str, Any],
                                                       trained_paths: tuple[Path, Path],
                                                       local_runs: dict[bool, dict[str, Any]]) -> None:
    """Once this process added servers, a model loaded without ``rpc_servers`` (-ngl 99 on this
    CPU-only build) stays local: only the servers a model is given are its devices."""
    from mtp_bindings import Model

    target, _ = trained_paths
    with Model(target, n_gpu_layers=99, repack=False) as model:
        assert model.rpc_devices == ()
        assert _generate(model, 0).tokens == local_runs[False]["plain"].tokens


def test_a_malformed_endpoint_is_an_invalid_parameter() -> None:
    from mtp_bindings.native.devices import add_rpc_servers
    from mtp_bindings.exceptions import InvalidParameterError

    for bad in ("localhost", "localhost:", ":50052", "h:0", "h:65536", "h:50052x", "[::1]:50052", "h:1,h:1", ""):
        with pytest.raises(InvalidParameterError, match="rpc_servers"):
            add_rpc_servers(bad)


def test_an_unreachable_endpoint_is_a_typed_error_at_once(trained_paths: tuple[Path, Path]) -> None:
    from mtp_bindings import Model, RPCServerError

    target, _ = trained_paths
    port = _free_port()  # nothing listens there
    start = time.monotonic()
    with pytest.raises(RPCServerError, match=f"127.0.0.1:{port}.*refused"):
        Model(target, rpc_servers=f"127.0.0.1:{port}", n_gpu_layers=99)
    assert time.monotonic() - start < 2.0


def test_a_server_that_does_not_answer_is_an_error_within_the_timeout() -> None:
    """A port that accepts connections but never answers the hello (as an rpc-server busy with
    another client does): an error after ``timeout``, where ggml would wait forever."""
    from mtp_bindings.native.devices import add_rpc_servers
    from mtp_bindings.exceptions import RPCServerError

    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(1)  # the kernel completes the connection; nobody reads
        start = time.monotonic()
        with pytest.raises(RPCServerError, match="no answer within 0.5 s"):
            add_rpc_servers(f"127.0.0.1:{silent.getsockname()[1]}", timeout=0.5)
        assert time.monotonic() - start < 2.0


def test_a_server_that_is_not_an_rpc_server_is_an_error() -> None:
    """Something that answers with other bytes, or hangs up at the hello."""
    import threading

    from mtp_bindings.native.devices import add_rpc_servers
    from mtp_bindings.exceptions import RPCServerError

    with socket.socket() as other:
        other.bind(("127.0.0.1", 0))
        other.listen(1)

        def answer() -> None:
            conn, _ = other.accept()
            with conn:
                conn.sendall(b"HTTP/1.1 400 Bad Request\r\n\r\n")

        t = threading.Thread(target=answer, daemon=True)
        t.start()
        with pytest.raises(RPCServerError, match="not an rpc-server"):
            add_rpc_servers(f"127.0.0.1:{other.getsockname()[1]}", timeout=2.0)
        t.join(5)


def test_generate_with_rpc_flag_reaches_the_model(tmp_path: Path, trained_paths: tuple[Path, Path],
                                                  local_runs: dict[bool, dict[str, Any]]) -> None:
    """``mtp-bindings generate --rpc HOST:PORT -ngl 99``: the layers go to the worker (it logs its
    client) and the greedy tokens are the local run's."""
    target, assistant = trained_paths
    with rpc_workers(1, tmp_path) as (endpoint,):
        out = subprocess.run(_serve_command() + ["generate", "-m", str(target), "-md", str(assistant), "-p", PROMPT,
                                                 "-n", str(N_TOKENS), "--spec-draft-n-max", str(DRAFT_N_MAX),
                                                 "-t", "1", "--temp", "0", "--rpc", endpoint, "-ngl", "99", "--json"],
                             capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        log = next(tmp_path.glob("rpc-server-*.log")).read_text(errors="replace")
    assert "Accepted client connection" in log
    result = json.loads(out.stdout)
    assert result["tokens"] == local_runs[False]["mtp"].tokens
    assert result["stats"]["n_drafted"] > 0


def test_serve_with_rpc_flag_answers(tmp_path: Path, trained_paths: tuple[Path, Path],
                                    local_runs: dict[bool, dict[str, Any]]) -> None:
    """``mtp-bindings serve --rpc HOST:PORT -ngl 99`` answers an OpenAI client, its model on the worker."""
    with rpc_workers(1, tmp_path) as (endpoint,):
        with running_server(["-c", "512", "--rpc", endpoint, "-ngl", "99"], tmp_path) as server:
            reply = server.openai().completions.create(model="any", prompt=PROMPT, max_tokens=8, temperature=0)
        log = next(tmp_path.glob("rpc-server-*.log")).read_text(errors="replace")
    assert reply.usage.completion_tokens == 8 and reply.choices[0].text
    assert "Accepted client connection" in log


# issue 17 item 6, found here: before the fix now in patch 0007 the drafting graph's input restore list missed inputs the
# scheduler copies to the worker, and the second drafting step crashed the worker (get_rows index assert)
def test_a_centroid_head_drafts_over_rpc(tmp_path: Path) -> None:
    """The random centroid-head fixture drafting 3 tokens a round with every layer on a worker, in a
    1024-token context: the local no-repack run's tokens (a command-line subprocess, so that a crash
    fails this test only)."""
    from mtp_bindings import Model

    from fixture_paths import fixture_path

    target, assistant = fixture_path("dense-target.gguf"), fixture_path("centroid-assistant.gguf")
    with Model(target, assistant=assistant, repack=False) as model:
        local = _generate(model, 3)
    with rpc_workers(1, tmp_path) as (endpoint,):
        out = subprocess.run(_serve_command() + ["generate", "-m", str(target), "-md", str(assistant), "-p", PROMPT,
                                                 "-n", str(N_TOKENS), "--spec-draft-n-max", "3", "--temp", "0",
                                                 "-t", "1", "-c", "1024",
                                                 "--rpc", endpoint, "-ngl", "99", "--json"],
                             capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert json.loads(out.stdout)["tokens"] == local.tokens


def test_generate_names_the_flag_of_a_malformed_endpoint() -> None:
    out = subprocess.run(_serve_command() + ["generate", "--no-mtp", "-p", "x", "-n", "1", "--rpc", "nohostport"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2
    line = out.stderr.strip().splitlines()[-1]
    assert "--rpc" in line and "nohostport" in line and "Traceback" not in out.stderr, out.stderr


def test_rpc_server_help_is_the_bundled_binary_s() -> None:
    out = subprocess.run(_serve_command() + ["rpc-server", "--help"], capture_output=True, text=True, timeout=60)
    assert "--host" in out.stderr and "--port" in out.stderr, out.stderr


def _draft(model: Any) -> tuple[list[int], dict[str, int]]:
    """Three synchronous draft steps after a short prompt, and the context's drafting counters."""
    import numpy as np

    from mtp_bindings.mtp import graph_stats

    with model.create_context(n_ctx=256, n_threads=1, embeddings=True) as ctx:
        ctx.decode([2, 100, 200, 300], pos=0)
        drafts, _ = ctx.decode_mtp(attn_pos=3, last_token=int(np.argmax(ctx.get_logits(-1))),
                                   h_prev=ctx.get_embeddings(-1), n_steps=3)
        return drafts.tolist(), graph_stats(ctx)


# issue 17 item 7 (patches 0003 and 0017): the embedding rows (the target's, for the drafted token; the centroid head's
# candidates) were gathered in host memory, so with every layer on a device each gather was a CPU split of its
# own in every draft step (device -> host -> device)
@pytest.mark.parametrize("pair", ["dense", "centroid"])
def test_a_draft_step_runs_whole_on_the_worker_holding_every_layer(tmp_path: Path, pair: str) -> None:
    from mtp_bindings import Model

    from fixture_paths import PAIRS, fixture_path

    target, assistant = (fixture_path(name) for name in PAIRS[pair])
    with Model(target, assistant=assistant, repack=False) as model:
        local, local_stats = _draft(model)
    with rpc_workers(1, tmp_path) as (endpoint,), \
            Model(target, assistant=assistant, rpc_servers=endpoint, n_gpu_layers=99) as model:
        drafts, stats = _draft(model)
    assert local_stats["n_graph_splits"] == 1
    assert stats["n_graph_splits"] == 1
    assert drafts == local
