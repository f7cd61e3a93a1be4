"""The OpenAI-compatible server, tested as a real process on loopback.

One ``mtp-bindings serve`` process (2 slots, an API key) serves the whole module. The official
``openai`` client checks chat and text completions, streamed and not, against ``Model.generate``
run in-process at temperature 0; raw ``httpx`` checks every error case, the auxiliary routes, and
that a client disconnecting mid-stream cancels its generation without disturbing anyone else.

The model is the bundled trained pair when present, else the tiny dense fixtures; the assistant is
attached whenever this build of libllama can attach one (then the tests also expect drafting).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from fixture_paths import BUNDLED, FIXTURES

KEY = "test-key-123"
N_CTX = 1024
N_SLOTS = 2
STARTUP_S = 60.0
TIMEOUT_S = 30.0
CHAT = [{"role": "user", "content": "Write a function that parses command line arguments."}]
PROMPTS = ["def parse_args(argv):\n", "The quick brown fox", "import numpy as np\n"]


# ------------------------------------------------------------------------------------------------
# the server process and the in-process reference
# ------------------------------------------------------------------------------------------------

def _model_files() -> tuple[Path, Path | None]:
    """The bundled trained pair if there, else the dense fixtures (assistant None if absent)."""
    for target, assistant in ((BUNDLED / "trained-target.gguf", BUNDLED / "trained-assistant.gguf"),
                              (FIXTURES / "dense-target.gguf", FIXTURES / "dense-assistant.gguf")):
        if target.is_file():
            return target, assistant if assistant.is_file() else None
    pytest.fail("no target model: neither the bundled trained pair nor tests/fixtures/dense-target.gguf exists")


def _mtp_available(assistant: Path | None) -> bool:
    """Whether this build can attach an MTP assistant (the C patches are in)."""
    from mtp_bindings.low_level import lib

    return assistant is not None and hasattr(lib, "llama_model_load_mtp_from_file")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _serve_command() -> list[str]:
    exe = shutil.which("mtp-bindings")
    return [exe] if exe else [sys.executable, "-m", "mtp_bindings.cli"]


@dataclass
class Server:
    url: str
    proc: subprocess.Popen[bytes]
    log: Path
    has_mtp: bool

    def client(self, key: str | None = KEY) -> httpx.Client:
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        return httpx.Client(base_url=self.url, headers=headers, timeout=TIMEOUT_S)

    def openai(self) -> Any:
        import openai

        return openai.OpenAI(base_url=f"{self.url}/v1", api_key=KEY, max_retries=0, timeout=TIMEOUT_S)

    def metrics(self) -> dict[str, float]:
        with self.client() as c:
            r = c.get("/metrics")
        assert r.status_code == 200, r.text
        return parse_metrics(r.text)


def parse_metrics(text: str) -> dict[str, float]:
    """Prometheus text -> {'name{labels}': value} (labels kept verbatim)."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            out[name] = float(value)
    return out


def _wait_healthy(url: str, proc: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + STARTUP_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"the server exited with {proc.returncode}:\n{log.read_text()}")
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    pytest.fail(f"the server did not become healthy in {STARTUP_S}s:\n{log.read_text()}")


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


@contextmanager
def running_server(args: list[str], folder: Path) -> Iterator[Server]:
    """``mtp-bindings serve`` on a free loopback port with one thread, the API key, the assistant
    (when this build can attach it, drafting 2) and ``args``; healthy on entry, stopped on exit.
    Its log is ``folder/server.log``."""
    target, assistant = _model_files()
    has_mtp = _mtp_available(assistant)
    port = _free_port()
    log = folder / "server.log"
    cmd = _serve_command() + ["serve", "-m", str(target), "--port", str(port), "-t", "1", "--api-key", KEY, *args]
    cmd += ["-md", str(assistant), "--spec-draft-n-max", "2"] if has_mtp else ["--no-mtp"]
    with log.open("wb") as sink:
        proc = subprocess.Popen(cmd, stdout=sink, stderr=subprocess.STDOUT, cwd=folder,
                                env={**os.environ, "PYTHONUNBUFFERED": "1"})
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_healthy(url, proc, log)
        yield Server(url, proc, log, has_mtp)
    finally:
        _stop(proc)
    assert proc.returncode is not None


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    # --metrics and --slots as a llama-server command line has them: accepted, /metrics and /slots are always on
    with running_server(["-c", str(N_CTX), "-np", str(N_SLOTS), "--metrics", "--slots"],
                        tmp_path_factory.mktemp("server")) as s:
        yield s


@pytest.fixture(scope="module")
def reference(server: Server) -> Iterator[Any]:
    """The same model in-process, generating the same way the server's slots do."""
    from mtp_bindings import Model

    target, assistant = _model_files()
    with Model(target, assistant=assistant if server.has_mtp else None) as model:
        with model.create_context(n_ctx=N_CTX, n_threads=1, embeddings=model.has_assistant) as ctx:
            model._test_ctx = ctx
            yield model


def ref_generate(model: Any, prompt: str, **kwargs: Any) -> Any:
    return model.generate(prompt, temperature=0.0, context=model._test_ctx, **kwargs)


def ref_chat(model: Any, messages: list[dict[str, str]], **kwargs: Any) -> Any:
    return model.chat(messages, temperature=0.0, context=model._test_ctx, **kwargs)


def check_timings(timings: dict[str, Any], result: Any, has_mtp: bool) -> None:
    assert timings["prompt_n"] + timings["cache_n"] == result.stats.n_prompt  # decoded + kept by the prompt cache
    assert timings["predicted_n"] == result.stats.n_generated
    for k in ("prompt_ms", "predicted_ms", "predicted_per_second", "draft_n", "draft_n_accepted"):
        assert timings[k] >= 0, k
    assert timings["draft_n_accepted"] <= timings["draft_n"]
    if has_mtp and result.stats.n_generated > 2:
        assert timings["draft_n"] > 0, "the assistant is attached but nothing was drafted"
    if not has_mtp:
        assert timings["draft_n"] == 0


# ------------------------------------------------------------------------------------------------
# the happy paths, with the openai client
# ------------------------------------------------------------------------------------------------

def test_health_needs_no_key(server: Server) -> None:
    r = httpx.get(f"{server.url}/health", timeout=TIMEOUT_S)
    assert r.status_code == 200
    body = r.json()
    assert body["status"] == "ok" and body["slots_idle"] + body["slots_processing"] == N_SLOTS


def test_models_lists_the_served_model(server: Server) -> None:
    models = server.openai().models.list()
    assert len(models.data) == 1
    m = models.data[0]
    assert m.id == _model_files()[0].stem and m.object == "model"
    assert m.model_extra["meta"]["mtp_assistant"] is server.has_mtp
    assert m.model_extra["meta"]["n_ctx"] == N_CTX


def test_chat_completion_equals_model_chat(server: Server, reference: Any) -> None:
    resp = server.openai().chat.completions.create(model="any", messages=CHAT, max_tokens=24, temperature=0)
    ref = ref_chat(reference, CHAT, max_tokens=24)
    choice = resp.choices[0]
    assert choice.message.role == "assistant"
    assert choice.message.content == ref.text
    assert choice.finish_reason == ("length" if ref.finish_reason == "length" else "stop")
    assert resp.object == "chat.completion" and resp.id.startswith("chatcmpl-")
    assert resp.usage.prompt_tokens == ref.stats.n_prompt
    assert resp.usage.completion_tokens == ref.stats.n_generated
    assert resp.usage.total_tokens == ref.stats.n_prompt + ref.stats.n_generated
    check_timings(resp.model_extra["timings"], ref, server.has_mtp)


def test_chat_completion_stream_equals_model_chat(server: Server, reference: Any) -> None:
    chunks = list(server.openai().chat.completions.create(
        model="any", messages=CHAT, max_completion_tokens=24, temperature=0, stream=True))
    ref = ref_chat(reference, CHAT, max_tokens=24)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == ref.text
    assert all(c.choices[0].finish_reason is None for c in chunks[:-1])
    last = chunks[-1]
    assert last.choices[0].finish_reason in ("stop", "length")
    assert last.usage is not None and last.usage.completion_tokens == ref.stats.n_generated
    check_timings(last.model_extra["timings"], ref, server.has_mtp)
    assert len({c.id for c in chunks}) == 1


def test_chat_stream_include_usage_adds_a_usage_chunk(server: Server, reference: Any) -> None:
    chunks = list(server.openai().chat.completions.create(
        model="any", messages=CHAT, max_tokens=8, temperature=0, stream=True,
        stream_options={"include_usage": True}))
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert chunks[-2].choices[0].finish_reason is not None
    assert "timings" in chunks[-1].model_extra


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_completion_equals_model_generate(server: Server, reference: Any, stream: bool) -> None:
    prompt = PROMPTS[0]
    ref = ref_generate(reference, prompt, max_tokens=32)
    resp = server.openai().completions.create(model="any", prompt=prompt, max_tokens=32, temperature=0,
                                              stream=stream)
    if stream:
        chunks = list(resp)
        text = "".join(c.choices[0].text for c in chunks if c.choices)
        last = chunks[-1]
        assert last.object == "text_completion"
    else:
        text, last = resp.choices[0].text, resp
    assert text == ref.text
    assert last.choices[0].finish_reason == ("length" if ref.finish_reason == "length" else "stop")
    assert last.usage.completion_tokens == ref.stats.n_generated
    check_timings(last.model_extra["timings"], ref, server.has_mtp)


def test_completion_stop_strings_and_echo(server: Server, reference: Any) -> None:
    prompt = PROMPTS[0]
    full = ref_generate(reference, prompt, max_tokens=32).text
    stop = full[5:7] if len(full) >= 7 else "\n"
    ref = ref_generate(reference, prompt, max_tokens=32, stop=[stop])
    resp = server.openai().completions.create(model="any", prompt=prompt, max_tokens=32, temperature=0,
                                              stop=[stop], echo=True)
    assert resp.choices[0].text == prompt + ref.text


def test_token_id_prompt(server: Server, reference: Any) -> None:
    tokens = reference.tokenize(PROMPTS[1])
    ref = reference.generate(tokens, temperature=0.0, max_tokens=12, context=reference._test_ctx)
    resp = server.openai().completions.create(model="any", prompt=tokens, max_tokens=12, temperature=0)
    assert resp.choices[0].text == ref.text


def test_unknown_fields_are_ignored(server: Server, reference: Any) -> None:
    body = {"prompt": PROMPTS[1], "max_tokens": 8, "temperature": 0, "user": "me", "service_tier": "auto",
            "some_future_field": {"nested": [1, 2]}, "top_k": 40, "min_p": 0.0, "repeat_penalty": 1.0,
            "speculative.n_max": 2, "speculative": {"n_max": 1, "n_min": 0}, "seed": 7}
    with server.client() as c:
        r = c.post("/v1/completions", json=body)
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["text"] == ref_generate(reference, PROMPTS[1], max_tokens=8).text


@pytest.mark.parametrize("field,value", [
    ("tool_choice", "required"), ("tool_choice", {"type": "function", "function": {"name": "f"}}),
    ("n_probs", 2), ("mirostat", 2),
])
def test_a_field_that_would_change_the_output_is_refused_by_name(server: Server, field: str, value: Any) -> None:
    with server.client() as c:
        err = check_error(c.post("/v1/chat/completions", json={**CHAT_OK, field: value}), 400,
                          "unsupported_parameter", field)
    assert "not supported" in err["message"]


def test_the_neutral_value_of_an_unsupported_field_passes(server: Server) -> None:
    body = {**CHAT_OK, "response_format": {"type": "text"}, "tools": [], "tool_choice": "none", "mirostat": 0,
            "typical_p": 1.0, "n_probs": 0, "ignore_eos": False}
    with server.client() as c:
        r = c.post("/v1/chat/completions", json=body)
    assert r.status_code == 200, r.text


def test_logit_bias_equals_model_generate(server: Server, reference: Any) -> None:
    first = ref_generate(reference, PROMPTS[0], max_tokens=8).tokens[0]
    bias = {first: -100.0}
    ref = reference.generate(PROMPTS[0], temperature=0.0, max_tokens=8, logit_bias=bias,
                             context=reference._test_ctx)
    assert ref.tokens[0] != first
    resp = server.openai().completions.create(model="any", prompt=PROMPTS[0], max_tokens=8, temperature=0,
                                              logit_bias={str(first): -100})
    assert resp.choices[0].text == ref.text


def test_sampled_generation_with_seed_runs(server: Server) -> None:
    resp = server.openai().completions.create(model="any", prompt=PROMPTS[2], max_tokens=8, temperature=0.8,
                                              top_p=0.9, seed=3, presence_penalty=0.5, frequency_penalty=0.5)
    assert resp.choices[0].finish_reason in ("stop", "length")
    assert resp.usage.completion_tokens <= 8


def test_llama_servers_other_samplers_sample_as_model_generate_does(server: Server, reference: Any) -> None:
    samplers = {"typical_p": 0.9, "top_n_sigma": 2.0, "xtc_probability": 0.5, "xtc_threshold": 0.05,
                "dry_multiplier": 0.8, "dry_base": 1.5, "dry_allowed_length": 1, "dry_penalty_last_n": 32,
                "dry_sequence_breakers": ["\n", ":"]}
    body = {"prompt": PROMPTS[2], "max_tokens": 16, "temperature": 1.0, "seed": 11, "draft_n_max": 0, **samplers}
    with server.client() as c:
        r = c.post("/v1/completions", json=body)
    assert r.status_code == 200, r.text
    ref = reference.generate(PROMPTS[2], max_tokens=16, temperature=1.0, seed=11, draft_n_max=0,
                             context=reference._test_ctx, **samplers)
    assert r.json()["choices"][0]["text"] == ref.text


def test_concurrent_requests_beyond_the_slots(server: Server, reference: Any) -> None:
    """Three clients at once on two slots: one queues, all get their own correct answer."""
    refs = {p: ref_generate(reference, p, max_tokens=24).text for p in PROMPTS}
    client = server.openai()

    def ask(prompt: str) -> str:
        return client.completions.create(model="any", prompt=prompt, max_tokens=24, temperature=0).choices[0].text

    with ThreadPoolExecutor(len(PROMPTS)) as pool:
        got = dict(zip(PROMPTS, pool.map(ask, PROMPTS)))
    assert got == refs


# ------------------------------------------------------------------------------------------------
# errors, with raw HTTP
# ------------------------------------------------------------------------------------------------

CHAT_OK = {"messages": CHAT, "max_tokens": 4}
DONE_OK = {"prompt": "hi", "max_tokens": 4}

BAD_BODIES = [
    # (id, path, body, param, code)
    ("chat-temperature-str", "/v1/chat/completions", {**CHAT_OK, "temperature": "hot"}, "temperature", "invalid_type"),
    ("chat-temperature-numeric-str", "/v1/chat/completions", {**CHAT_OK, "temperature": "0.5"}, "temperature",
     "invalid_type"),
    ("chat-max-tokens-float", "/v1/chat/completions", {**CHAT_OK, "max_tokens": 1.5}, "max_tokens", "invalid_type"),
    ("chat-stream-str", "/v1/chat/completions", {**CHAT_OK, "stream": "yes"}, "stream", "invalid_type"),
    ("chat-messages-str", "/v1/chat/completions", {"messages": "hello"}, "messages", "invalid_type"),
    ("chat-content-int", "/v1/chat/completions", {"messages": [{"role": "user", "content": 5}]},
     "messages.0.content", "invalid_type"),
    ("chat-messages-missing", "/v1/chat/completions", {"max_tokens": 4}, "messages", "missing_required_parameter"),
    ("chat-messages-empty", "/v1/chat/completions", {"messages": []}, "messages", "invalid_value"),
    ("chat-seed-bool", "/v1/chat/completions", {**CHAT_OK, "seed": True}, "seed", "invalid_type"),
    ("chat-stop-int", "/v1/chat/completions", {**CHAT_OK, "stop": 5}, "stop", "invalid_type"),
    ("chat-temperature-high", "/v1/chat/completions", {**CHAT_OK, "temperature": 2.5}, "temperature",
     "invalid_value"),
    ("chat-top-p-zero", "/v1/chat/completions", {**CHAT_OK, "top_p": 0}, "top_p", "invalid_value"),
    ("chat-max-tokens-below", "/v1/chat/completions", {**CHAT_OK, "max_tokens": -2}, "max_tokens", "invalid_value"),
    ("chat-presence-high", "/v1/chat/completions", {**CHAT_OK, "presence_penalty": 5}, "presence_penalty",
     "invalid_value"),
    ("chat-n-2", "/v1/chat/completions", {**CHAT_OK, "n": 2}, "n", "invalid_value"),
    ("chat-logprobs-type", "/v1/chat/completions", {**CHAT_OK, "logprobs": 1}, "logprobs", "invalid_type"),
    ("done-prompt-obj", "/v1/completions", {"prompt": {"a": 1}}, "prompt", "invalid_type"),
    ("done-prompt-missing", "/v1/completions", {"max_tokens": 4}, "prompt", "missing_required_parameter"),
    ("done-prompt-many", "/v1/completions", {"prompt": ["a", "b"]}, "prompt", "invalid_value"),
    ("done-top-k-negative", "/v1/completions", {**DONE_OK, "top_k": -2}, "top_k", "invalid_value"),
    ("done-min-p-high", "/v1/completions", {**DONE_OK, "min_p": 2}, "min_p", "invalid_value"),
    ("done-draft-n-max-high", "/v1/completions", {**DONE_OK, "draft_n_max": 17}, "draft_n_max", "invalid_value"),
    ("done-speculative-flat-high", "/v1/completions", {**DONE_OK, "speculative.n_max": 99}, "speculative.n_max",
     "invalid_value"),
    ("done-speculative-nested-negative", "/v1/completions", {**DONE_OK, "speculative": {"n_max": -1}},
     "speculative.n_max", "invalid_value"),
    ("done-n-2", "/v1/completions", {**DONE_OK, "n": 2}, "n", "invalid_value"),
    ("done-logit-bias-key", "/v1/completions", {**DONE_OK, "logit_bias": {"abc": 1}}, "logit_bias",
     "invalid_value"),
    ("done-logit-bias-value", "/v1/completions", {**DONE_OK, "logit_bias": {"1": 200}}, "logit_bias",
     "invalid_value"),
    ("done-logit-bias-type", "/v1/completions", {**DONE_OK, "logit_bias": {"1": "x"}}, "logit_bias",
     "invalid_type"),
    ("chat-logit-bias-out-of-vocab", "/v1/chat/completions", {**CHAT_OK, "logit_bias": {str(10**9): 1}},
     "logit_bias", "invalid_value"),
    ("done-token-out-of-vocab", "/v1/completions", {"prompt": [10**9], "max_tokens": 4}, "prompt", "invalid_value"),
]


def check_error(r: httpx.Response, status: int, code: str | None = None, param: str | None = None) -> dict[str, Any]:
    assert r.status_code == status, r.text
    assert r.headers["content-type"].startswith("application/json")
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert isinstance(err["message"], str) and err["message"]
    if status < 500:
        assert err["type"] == "invalid_request_error"
    if code is not None:
        assert err["code"] == code, err
    if param is not None:
        assert err["param"] == param, err
    return err


@pytest.mark.parametrize("path,body,param,code", [b[1:] for b in BAD_BODIES], ids=[b[0] for b in BAD_BODIES])
def test_bad_fields_are_400(server: Server, path: str, body: dict[str, Any], param: str, code: str) -> None:
    with server.client() as c:
        check_error(c.post(path, json=body), 400, code, param)


@pytest.mark.parametrize("raw", [b'{"messages": [', b"not json", b"", b'{"prompt": "x", "temperature": NaN}'],
                         ids=["truncated", "text", "empty", "nan"])
@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
def test_bad_json_is_400(server: Server, path: str, raw: bytes) -> None:
    with server.client() as c:
        check_error(c.post(path, content=raw, headers={"content-type": "application/json"}), 400, "invalid_json")


def test_non_object_body_is_400(server: Server) -> None:
    with server.client() as c:
        check_error(c.post("/v1/completions", json=[1, 2]), 400, "invalid_type")


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("path,field", [("/v1/completions", "prompt"), ("/v1/chat/completions", "messages")])
def test_prompt_over_the_context_is_400(server: Server, path: str, field: str, stream: bool) -> None:
    long = "hello " * (N_CTX + 50)
    body = {"prompt": long} if field == "prompt" else {"messages": [{"role": "user", "content": long}]}
    with server.client() as c:
        err = check_error(c.post(path, json={**body, "stream": stream}), 400, "context_length_exceeded", field)
    assert str(N_CTX) in err["message"]


@pytest.mark.parametrize("key", [None, "wrong-key"], ids=["missing", "wrong"])
@pytest.mark.parametrize("method,path", [("POST", "/v1/chat/completions"), ("POST", "/v1/completions"),
                                         ("GET", "/v1/models"), ("GET", "/metrics")])
def test_api_key_is_required(server: Server, key: str | None, method: str, path: str) -> None:
    with server.client(key) as c:
        r = c.request(method, path, json=CHAT_OK if method == "POST" else None)
    check_error(r, 401, "invalid_api_key")


def test_openai_client_with_a_wrong_key_gets_authentication_error(server: Server) -> None:
    import openai

    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="nope", max_retries=0, timeout=TIMEOUT_S)
    with pytest.raises(openai.AuthenticationError):
        client.models.list()


@pytest.mark.parametrize("method,path,status", [("GET", "/v1/nope", 404), ("POST", "/v2/chat/completions", 404),
                                                ("GET", "/", 404), ("GET", "/v1/chat/completions", 405)])
def test_unknown_routes_get_the_error_shape(server: Server, method: str, path: str, status: int) -> None:
    with server.client() as c:
        check_error(c.request(method, path), status)


# ------------------------------------------------------------------------------------------------
# disconnects and metrics
# ------------------------------------------------------------------------------------------------

def _wait_idle(server: Server, timeout: float = 10.0) -> dict[str, float]:
    deadline = time.monotonic() + timeout
    while True:
        m = server.metrics()
        if m["mtp_requests_processing"] == 0 and m["mtp_requests_queued"] == 0:
            return m
        if time.monotonic() > deadline:
            pytest.fail(f"requests still processing/queued after {timeout}s: {m}")
        time.sleep(0.05)


def _no_eog(reference: Any) -> dict[str, float]:
    """A ``logit_bias`` banning every end-of-generation token, so a generation runs to max_tokens
    (a disconnect must land mid-way, whatever the model likes to say)."""
    return {str(t): -100.0 for t in range(reference.n_vocab) if reference.is_eog(t)}


LONG = N_CTX - 64


def test_disconnect_mid_stream_cancels_the_generation(server: Server, reference: Any) -> None:
    before = _wait_idle(server)
    body = {"prompt": PROMPTS[0], "max_tokens": LONG, "temperature": 0, "stream": True,
            "logit_bias": _no_eog(reference)}
    with server.client() as c, c.stream("POST", "/v1/completions", json=body) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        for line in r.iter_lines():
            if line.startswith("data: ") and json.loads(line[6:])["choices"][0]["text"]:
                break  # one piece of text, then hang up
    after = _wait_idle(server)
    assert after["mtp_generations_cancelled_total"] == before["mtp_generations_cancelled_total"] + 1
    assert after["mtp_generated_tokens_total"] - before["mtp_generated_tokens_total"] < LONG

    # and the server carries on: a new request is answered, correctly
    ref = ref_generate(reference, PROMPTS[1], max_tokens=16)
    resp = server.openai().completions.create(model="any", prompt=PROMPTS[1], max_tokens=16, temperature=0)
    assert resp.choices[0].text == ref.text
    assert server.proc.poll() is None


def test_client_leaving_a_whole_response_cancels_too(server: Server, reference: Any) -> None:
    """Not streamed: the server notices the hang-up while it waits on the generation."""
    before = _wait_idle(server)
    body = {"prompt": PROMPTS[0], "max_tokens": LONG, "temperature": 0, "logit_bias": _no_eog(reference)}
    with server.client() as c, pytest.raises(httpx.ReadTimeout):
        c.post("/v1/completions", json=body, timeout=httpx.Timeout(TIMEOUT_S, read=0.02))
    after = _wait_idle(server)
    assert after["mtp_generations_cancelled_total"] == before["mtp_generations_cancelled_total"] + 1
    assert after["mtp_generated_tokens_total"] - before["mtp_generated_tokens_total"] < LONG
    assert after['mtp_http_requests_total{endpoint="/v1/completions",status="499"}'] >= 1


def test_metrics_count_requests_tokens_and_drafts(server: Server) -> None:
    before = _wait_idle(server)
    resp = server.openai().completions.create(model="any", prompt=PROMPTS[0], max_tokens=16, temperature=0)
    with server.client() as c:
        c.post("/v1/completions", json={"prompt": "x", "temperature": 9})
        c.get("/no/such/route")
        r = c.get("/metrics")
    assert r.headers["content-type"].startswith("text/plain")
    text = r.text
    for family, kind in (("mtp_http_requests_total", "counter"), ("mtp_request_acceptance_rate", "histogram"),
                         ("mtp_draft_position_drafted_total", "counter"),
                         ("mtp_draft_position_accepted_total", "counter"), ("mtp_requests_processing", "gauge")):
        assert f"# TYPE {family} {kind}" in text
    m = parse_metrics(text)
    ok = 'mtp_http_requests_total{endpoint="/v1/completions",status="200"}'
    bad = 'mtp_http_requests_total{endpoint="/v1/completions",status="400"}'
    assert m[ok] == before.get(ok, 0) + 1
    assert m[bad] == before.get(bad, 0) + 1
    assert m["mtp_prompt_tokens_total"] - before["mtp_prompt_tokens_total"] == resp.usage.prompt_tokens
    assert m["mtp_generated_tokens_total"] - before["mtp_generated_tokens_total"] == resp.usage.completion_tokens
    timings = resp.model_extra["timings"]
    assert m["mtp_draft_tokens_total"] - before["mtp_draft_tokens_total"] == timings["draft_n"]
    assert m["mtp_draft_accepted_tokens_total"] - before["mtp_draft_accepted_tokens_total"] == \
        timings["draft_n_accepted"]
    assert m['mtp_request_acceptance_rate_bucket{le="+Inf"}'] == m["mtp_request_acceptance_rate_count"]
    buckets = [v for k, v in m.items() if k.startswith("mtp_request_acceptance_rate_bucket")]
    assert buckets == sorted(buckets), "histogram buckets must be cumulative"
    if server.has_mtp:
        assert m["mtp_draft_tokens_total"] > 0
        assert m['mtp_draft_position_drafted_total{position="1"}'] > 0
        assert m["mtp_request_acceptance_rate_count"] > 0
    else:
        assert m["mtp_draft_tokens_total"] == 0
    # prometheus_client writes every value as a float ("1.0")
    assert re.search(r'^mtp_http_requests_total\{endpoint="other",status="404"\} \d+\.0$', text, re.M)
    assert m["mtp_requests_processing"] == 0 and m["mtp_requests_queued"] == 0


def test_metrics_have_llama_server_and_vllm_aliases(server: Server) -> None:
    """Dashboards built for llama-server or vLLM read the same counts under their names."""
    server.openai().completions.create(model="any", prompt=PROMPTS[1], max_tokens=8, temperature=0)
    m = _wait_idle(server)
    name = f'model_name="{_model_files()[0].stem}"'
    for ours, llamacpp, vllm in (
        ("mtp_prompt_tokens_total", "llamacpp:prompt_tokens_total", f"vllm:prompt_tokens_total{{{name}}}"),
        ("mtp_generated_tokens_total", "llamacpp:tokens_predicted_total", f"vllm:generation_tokens_total{{{name}}}"),
        ("mtp_draft_tokens_total", "llamacpp:spec_decode_num_draft_tokens_total",
         f"vllm:spec_decode_num_draft_tokens_total{{{name}}}"),
        ("mtp_draft_accepted_tokens_total", "llamacpp:spec_decode_num_accepted_tokens_total",
         f"vllm:spec_decode_num_accepted_tokens_total{{{name}}}"),
        ("mtp_requests_processing", "llamacpp:requests_processing", f"vllm:num_requests_running{{{name}}}"),
        ("mtp_requests_queued", "llamacpp:requests_deferred", f"vllm:num_requests_waiting{{{name}}}"),
    ):
        assert m[ours] == m[llamacpp] == m[vllm], ours
    assert m["llamacpp:prompt_seconds_total"] > 0 and m["llamacpp:tokens_predicted_seconds_total"] > 0
    if server.has_mtp:  # positions: 1-based in ours, 0-based in theirs
        assert m['mtp_draft_position_accepted_total{position="1"}'] == \
            m['llamacpp:spec_decode_num_accepted_tokens_per_pos_total{position="0"}'] == \
            m[f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{{name},position="0"}}']
        assert m["llamacpp:spec_decode_num_drafts_total"] == m['mtp_draft_position_drafted_total{position="1"}'] > 0


def test_metrics_count_verify_rounds_by_the_drafts_they_verified(server: Server) -> None:
    """What the auto draft count chose shows in /metrics: rounds by k (0: a plain decode)."""
    before = _wait_idle(server)
    server.openai().completions.create(model="any", prompt=PROMPTS[0], max_tokens=24, temperature=0)
    m = _wait_idle(server)

    def rounds(metrics: dict[str, float], drafted: bool) -> float:
        return sum(v for key, v in metrics.items() if key.startswith("mtp_draft_rounds_total{")
                   and (key != 'mtp_draft_rounds_total{k="0"}') == drafted)

    assert rounds(m, True) + rounds(m, False) > rounds(before, True) + rounds(before, False)
    # rounds that drafted are llama-server's verification steps
    assert rounds(m, True) == m["llamacpp:spec_decode_num_drafts_total"]
    if not server.has_mtp:
        assert rounds(m, True) == 0
