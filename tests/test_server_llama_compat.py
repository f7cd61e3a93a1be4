"""What llama-server users type, on the real server (issue 26, item 5): its paths and aliases
(``/completion``, ``/completions``, ``/chat/completions``, ``/models``, ``/v1/health``, ``/slots``),
its native ``/completion`` shapes (whole and streamed), OpenAI's ``models.retrieve``, CORS and
``X-Api-Key``.

The server is :mod:`test_server`'s fixture (a process on loopback with an API key, 2 slots); the
in-process ``reference`` model says what the text must be.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from test_server import CHAT, KEY, N_CTX, N_SLOTS, PROMPTS, TIMEOUT_S, Server, check_error, ref_chat, \
    ref_generate, reference, running_server, server

__all__ = ["reference", "server"]  # fixtures used by name
N = 12
NATIVE_FINAL = {"index", "content", "tokens", "id_slot", "stop", "model", "tokens_predicted", "tokens_evaluated",
                "generation_settings", "prompt", "has_new_line", "truncated", "stop_type", "stopping_word",
                "tokens_cached", "timings"}


def model_id(server: Server) -> str:
    with server.client() as c:
        return c.get("/v1/models").json()["data"][0]["id"]


# --- routes without /v1 ---------------------------------------------------------------------------

def test_chat_completions_without_v1_equals_the_v1_route(server: Server, reference: Any) -> None:
    body = {"messages": CHAT, "max_tokens": N, "temperature": 0}
    with server.client() as c:
        r = c.post("/chat/completions", json=body)
    assert r.status_code == 200, r.text
    assert r.json()["object"] == "chat.completion"
    assert r.json()["choices"][0]["message"]["content"] == ref_chat(reference, CHAT, max_tokens=N).text


def test_models_without_v1_lists_the_served_model(server: Server) -> None:
    with server.client() as c:
        plain, v1 = c.get("/models").json(), c.get("/v1/models").json()
    assert [m["id"] for m in plain["data"]] == [m["id"] for m in v1["data"]] == [model_id(server)]
    assert plain["models"][0]["name"] == model_id(server)  # llama-server's list beside OpenAI's


def test_v1_health_needs_no_key(server: Server) -> None:
    r = httpx.get(f"{server.url}/v1/health", timeout=TIMEOUT_S)
    assert r.status_code == 200 and r.json()["status"] == "ok"


# --- OpenAI's models.retrieve -----------------------------------------------------------------------

def test_openai_client_retrieves_the_served_model(server: Server) -> None:
    model = server.openai().models.retrieve(model_id(server))
    assert model.id == model_id(server) and model.object == "model"


def test_retrieving_an_unknown_model_is_a_404_in_openais_shape(server: Server) -> None:
    import openai

    with pytest.raises(openai.NotFoundError):
        server.openai().models.retrieve("no-such-model")
    with server.client() as c:
        check_error(c.get("/v1/models/no-such-model"), 404, "model_not_found", "model")


# --- llama-server's /completion ---------------------------------------------------------------------

@pytest.mark.parametrize("path", ["/completion", "/completions"])
def test_native_completion_has_llama_servers_shape_and_the_models_text(server: Server, reference: Any,
                                                                       path: str) -> None:
    ref = ref_generate(reference, PROMPTS[0], max_tokens=N)
    with server.client() as c:
        r = c.post(path, json={"prompt": PROMPTS[0], "n_predict": N, "temperature": 0})
    assert r.status_code == 200, r.text
    body = r.json()
    assert NATIVE_FINAL <= set(body) and "choices" not in body
    assert body["content"] == ref.text and body["stop"] is True and body["tokens"] == []  # no return_tokens
    assert body["tokens_predicted"] == len(ref.tokens) and body["tokens_evaluated"] == ref.stats.n_prompt
    assert body["stop_type"] == ("limit" if ref.finish_reason == "length" else "eos")
    assert body["model"] == model_id(server) and body["id_slot"] in range(N_SLOTS)
    assert body["generation_settings"]["n_predict"] == N and body["timings"]["predicted_n"] == ref.stats.n_generated


def test_native_completion_names_the_stop_word_it_stopped_on(server: Server, reference: Any) -> None:
    ref = ref_generate(reference, PROMPTS[0], max_tokens=N)
    stop = ref.text[len(ref.text) // 2:][:2]
    with server.client() as c:
        body = c.post("/completion", json={"prompt": PROMPTS[0], "n_predict": N, "temperature": 0,
                                           "stop": [stop]}).json()
    assert body["content"] == ref.text[:ref.text.index(stop)]
    assert body["stop_type"] == "word" and body["stopping_word"] == stop


def native_stream(server: Server, body: dict[str, Any]) -> tuple[list[str], list[dict[str, Any]]]:
    """The raw non-empty lines of a ``/completion`` stream and their JSON."""
    with server.client() as c, c.stream("POST", "/completion", json={**body, "stream": True}) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        lines = [line for line in r.iter_lines() if line]
    return lines, [json.loads(line.removeprefix("data: ")) for line in lines]


def test_native_stream_sends_data_lines_then_the_final_result_and_no_done(server: Server, reference: Any) -> None:
    ref = ref_generate(reference, PROMPTS[1], max_tokens=N)
    lines, events = native_stream(server, {"prompt": PROMPTS[1], "n_predict": N, "temperature": 0,
                                           "return_tokens": True})
    assert all(line.startswith("data: {") for line in lines)  # llama-server ends without [DONE]
    *partials, final = events
    assert partials and all(e["stop"] is False for e in partials) and final["stop"] is True
    assert "".join(e["content"] for e in partials) == ref.text and final["content"] == ""
    assert [t for e in partials for t in e["tokens"]] == ref.tokens
    assert NATIVE_FINAL <= set(final) and final["tokens_predicted"] == len(ref.tokens)


def test_native_prompt_as_token_ids_equals_the_text_prompt(server: Server, reference: Any) -> None:
    tokens = reference.tokenize(PROMPTS[2])
    with server.client() as c:
        by_text = c.post("/completion", json={"prompt": PROMPTS[2], "n_predict": 6, "temperature": 0}).json()
        by_ids = c.post("/completion", json={"prompt": tokens, "n_predict": 6, "temperature": 0}).json()
    assert by_ids["content"] == by_text["content"]


# --- /slots -----------------------------------------------------------------------------------------

def test_slots_lists_every_slot_in_llama_servers_shape(server: Server) -> None:
    with server.client() as c:
        assert c.post("/completion", json={"prompt": PROMPTS[0], "n_predict": 2}).status_code == 200
        slots = c.get("/slots").json()
    assert [s["id"] for s in slots] == list(range(N_SLOTS))
    assert all(s["n_ctx"] == N_CTX and s["is_processing"] is False and s["speculative"] is server.has_mtp
               for s in slots)
    assert any("id_task" in s and s["n_prompt_tokens"] > 0 for s in slots)  # the slot that served it


# --- CORS and the API key headers -------------------------------------------------------------------

def test_a_cors_preflight_is_answered_without_the_key(server: Server) -> None:
    headers = {"Origin": "http://example.test", "Access-Control-Request-Method": "POST",
               "Access-Control-Request-Headers": "authorization, content-type"}
    r = httpx.options(f"{server.url}/v1/chat/completions", headers=headers, timeout=TIMEOUT_S)
    assert r.status_code == 200, r.text
    assert r.headers["access-control-allow-origin"] in ("*", "http://example.test")
    assert "POST" in r.headers["access-control-allow-methods"]
    assert r.headers["access-control-allow-credentials"] == "true"


def test_responses_allow_any_origin_by_default(server: Server) -> None:
    with server.client() as c:
        r = c.get("/v1/models", headers={"Origin": "http://example.test"})
    # llama-server's default (origins *, credentials allowed) echoes the caller's origin
    assert r.status_code == 200 and r.headers["access-control-allow-origin"] == "http://example.test"


def test_cors_origins_limits_the_origins_allowed(tmp_path: Path) -> None:
    with running_server(["-c", "256", "--cors-origins", "http://ok.test"], tmp_path) as s, s.client() as c:
        ok = c.get("/v1/models", headers={"Origin": "http://ok.test"})
        other = c.get("/v1/models", headers={"Origin": "http://other.test"})
    assert ok.headers["access-control-allow-origin"] == "http://ok.test"
    assert "access-control-allow-origin" not in other.headers


def test_x_api_key_is_accepted_beside_the_bearer_token(server: Server) -> None:
    with httpx.Client(base_url=server.url, timeout=TIMEOUT_S) as c:
        assert c.get("/v1/models", headers={"X-Api-Key": KEY}).status_code == 200
        check_error(c.get("/v1/models", headers={"X-Api-Key": "wrong"}), 401, "invalid_api_key")
        check_error(c.get("/v1/models"), 401, "invalid_api_key")


def test_max_tokens_zero_generates_nothing_as_llama_server(server: Server) -> None:
    resp = server.openai().completions.create(model="any", prompt=PROMPTS[0], max_tokens=0, temperature=0)
    assert resp.choices[0].text == "" and resp.usage.completion_tokens == 0


def test_ignore_eos_bans_end_of_generation_as_llama_servers_logit_bias(server: Server, reference: Any) -> None:
    eog = [t for t in range(reference.n_vocab) if reference.is_eog(t)]
    body = {"prompt": PROMPTS[1], "max_tokens": 24, "temperature": 0, "logit_bias": {str(eog[0]): 100.0}}
    with server.client() as c:
        forced = c.post("/v1/completions", json=body).json()  # the bias makes the model end at once...
        ignored = c.post("/v1/completions", json={**body, "ignore_eos": True}).json()  # ...unless EOG is banned
    assert forced["choices"][0]["finish_reason"] == "stop" and forced["usage"]["completion_tokens"] <= 1
    ref = reference.generate(PROMPTS[1], temperature=0.0, max_tokens=24, logit_bias={t: -100.0 for t in eog},
                             context=reference._test_ctx)
    assert ignored["choices"][0]["text"] == ref.text
    assert ignored["choices"][0]["finish_reason"] == "length" and ignored["usage"]["completion_tokens"] == 24
