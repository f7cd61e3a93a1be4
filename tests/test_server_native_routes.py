"""llama-server's own endpoints on the real server process: ``/tokenize``, ``/detokenize``,
``/props``, and the per-request drafting switches (``speculative: false``, ``draft_n_max``).

The server is :mod:`test_server`'s fixture (a process on loopback with an API key); the
in-process ``reference`` model says what the answers must be.
"""

from __future__ import annotations

from typing import Any

import pytest

from test_server import N_CTX, N_SLOTS, Server, _model_files, check_error, ref_generate, reference, server

__all__ = ["reference", "server"]  # fixtures used by name
TEXT = "def parse_args(argv):\n    return argv"


def test_tokenize_equals_the_model_tokenizer_without_bos_by_default(server: Server, reference: Any) -> None:
    with server.client() as c:
        r = c.post("/tokenize", json={"content": TEXT})
    assert r.status_code == 200, r.text
    assert r.json() == {"tokens": reference.tokenize(TEXT, add_special=False, parse_special=True)}


def test_tokenize_add_special_adds_bos(server: Server, reference: Any) -> None:
    with server.client() as c:
        r = c.post("/tokenize", json={"content": TEXT, "add_special": True})
    assert r.json()["tokens"] == reference.tokenize(TEXT, add_special=True, parse_special=True)


def test_tokenize_with_pieces_gives_id_and_piece(server: Server, reference: Any) -> None:
    with server.client() as c:
        r = c.post("/tokenize", json={"content": TEXT, "with_pieces": True})
    tokens = r.json()["tokens"]
    assert [t["id"] for t in tokens] == reference.tokenize(TEXT, add_special=False, parse_special=True)
    assert "".join(t["piece"] for t in tokens) == TEXT


def test_detokenize_round_trips_tokenize(server: Server, reference: Any) -> None:
    ids = reference.tokenize(TEXT, add_special=False)
    with server.client() as c:
        r = c.post("/detokenize", json={"tokens": ids})
    assert r.status_code == 200, r.text
    assert r.json() == {"content": TEXT}


def test_detokenize_out_of_vocabulary_is_400(server: Server) -> None:
    with server.client() as c:
        check_error(c.post("/detokenize", json={"tokens": [10**9]}), 400, "invalid_value", "tokens")


def test_tokenize_without_content_is_400(server: Server) -> None:
    with server.client() as c:
        check_error(c.post("/tokenize", json={"add_special": True}), 400, "missing_required_parameter", "content")


@pytest.mark.parametrize("method,path", [("POST", "/tokenize"), ("POST", "/detokenize"), ("GET", "/props")])
def test_native_routes_need_the_key(server: Server, method: str, path: str) -> None:
    with server.client(key=None) as c:
        check_error(c.request(method, path, json={"content": "x", "tokens": [1]}), 401)


def test_props_reports_slots_context_model_and_defaults(server: Server, reference: Any) -> None:
    with server.client() as c:
        r = c.get("/props")
    assert r.status_code == 200, r.text
    props = r.json()
    target = _model_files()[0]
    assert props["total_slots"] == N_SLOTS
    assert props["model_path"].endswith(target.name) and props["model_alias"] == target.stem
    assert props["chat_template"] == (reference.chat_template or "")
    settings = props["default_generation_settings"]
    assert settings["n_ctx"] == N_CTX and settings["speculative"] is server.has_mtp
    assert settings["params"]["speculative.n_max"] == (2 if server.has_mtp else 0)
    from mtp_bindings.config.params import SAMPLING_DEFAULTS

    assert settings["params"]["temperature"] == SAMPLING_DEFAULTS.temperature  # the one set of defaults
    assert settings["params"]["top_k"] == SAMPLING_DEFAULTS.top_k


@pytest.mark.parametrize("switch", [{"speculative": False}, {"draft_n_max": 0}], ids=["speculative-false", "n-max-0"])
def test_a_request_can_turn_drafting_off(server: Server, reference: Any, switch: dict[str, Any]) -> None:
    prompt = "def parse_args(argv):\n"
    with server.client() as c:
        r = c.post("/v1/completions", json={"prompt": prompt, "max_tokens": 12, "temperature": 0, **switch})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["timings"]["draft_n"] == 0
    assert body["choices"][0]["text"] == ref_generate(reference, prompt, max_tokens=12).text

