"""The embedding routes on the real server process (``serve --embeddings [--pooling P]``):
OpenAI's ``/v1/embeddings`` through the official ``openai`` client, llama-server's ``/embedding`` and
``/embeddings`` through httpx, each checked against ``Model.embed`` in-process (the same context
settings: the vectors are equal to float32 rounding of the JSON round trip, i.e. exactly).
"""

from __future__ import annotations

import base64
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from test_server import KEY, Server, _model_files, running_server

TEXTS = ["Hello world, this is a test.", "def parse_args(argv):\n"]


@pytest.fixture(scope="module")
def mean_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    with running_server(["-c", "512", "--embeddings", "--pooling", "mean"], tmp_path_factory.mktemp("emb")) as s:
        yield s


@pytest.fixture(scope="module")
def none_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    with running_server(["-c", "512", "--embedding", "--pooling", "none"], tmp_path_factory.mktemp("embn")) as s:
        yield s


@pytest.fixture(scope="module")
def raw_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    with running_server(["-c", "512", "--embeddings", "--embd-normalize", "-1"], tmp_path_factory.mktemp("raw")) as s:
        yield s


@pytest.fixture(scope="module")
def plain_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    with running_server(["-c", "512"], tmp_path_factory.mktemp("plain")) as s:
        yield s


@pytest.fixture(scope="module")
def reference() -> Iterator[Any]:
    from mtp_bindings import Model

    with Model(_model_files()[0]) as m:
        yield m


def test_the_openai_client_gets_one_unit_vector_per_input_equal_to_model_embed(mean_server: Server,
                                                                                 reference: Any) -> None:
    r = mean_server.openai().embeddings.create(model="anything", input=TEXTS)
    assert [d.index for d in r.data] == [0, 1] and r.object == "list" and r.model == "anything"
    for d, text in zip(r.data, TEXTS):
        np.testing.assert_array_equal(np.asarray(d.embedding, dtype=np.float32), reference.embed(text))
    n = sum(len(reference.tokenize(t, add_special=True, parse_special=True)) for t in TEXTS)
    assert r.usage.prompt_tokens == n and r.usage.total_tokens == n


def test_base64_encoding_carries_the_same_float32_vector(mean_server: Server, reference: Any) -> None:
    with mean_server.client() as c:
        r = c.post("/v1/embeddings", json={"input": TEXTS[0], "encoding_format": "base64"})
    assert r.status_code == 200, r.text
    vec = np.frombuffer(base64.b64decode(r.json()["data"][0]["embedding"]), dtype="<f4")
    np.testing.assert_array_equal(vec, reference.embed(TEXTS[0]))


def test_the_openai_client_default_base64_path_decodes(mean_server: Server, reference: Any) -> None:
    # the openai client asks for base64 when no encoding_format is given, and decodes it itself
    r = mean_server.openai().embeddings.create(model="m", input=TEXTS[1], encoding_format="base64")
    assert isinstance(r.data[0].embedding, str)
    vec = np.frombuffer(base64.b64decode(r.data[0].embedding), dtype="<f4")
    np.testing.assert_array_equal(vec, reference.embed(TEXTS[1]))


def test_a_null_encoding_format_gives_floats(mean_server: Server, reference: Any) -> None:
    with mean_server.client() as c:
        r = c.post("/v1/embeddings", json={"input": TEXTS[0], "encoding_format": None, "user": "u1"})
    assert r.status_code == 200, r.text
    np.testing.assert_array_equal(np.asarray(r.json()["data"][0]["embedding"], dtype=np.float32),
                                  reference.embed(TEXTS[0]))


def test_token_inputs_embed_like_their_text(mean_server: Server, reference: Any) -> None:
    tokens = reference.tokenize(TEXTS[0], add_special=True, parse_special=True)
    with mean_server.client() as c:
        r = c.post("/v1/embeddings", json={"input": [tokens, TEXTS[0]]})
    data = r.json()["data"]
    np.testing.assert_array_equal(data[0]["embedding"], data[1]["embedding"])


def test_embd_normalize_minus_one_returns_the_raw_pooled_vector(mean_server: Server, reference: Any) -> None:
    with mean_server.client() as c:
        r = c.post("/v1/embeddings", json={"input": TEXTS[0], "embd_normalize": -1})
    np.testing.assert_array_equal(np.asarray(r.json()["data"][0]["embedding"], dtype=np.float32),
                                  reference.embed(TEXTS[0], normalize=False))


def test_serve_embd_normalize_sets_what_a_request_that_says_none_gets(raw_server: Server, reference: Any) -> None:
    with raw_server.client() as c:
        raw = c.post("/v1/embeddings", json={"input": TEXTS[0]}).json()["data"][0]["embedding"]
        unit = c.post("/v1/embeddings", json={"input": TEXTS[0], "embd_normalize": 2}).json()["data"][0]["embedding"]
    np.testing.assert_array_equal(np.asarray(raw, dtype=np.float32), reference.embed(TEXTS[0], normalize=False))
    np.testing.assert_array_equal(np.asarray(unit, dtype=np.float32), reference.embed(TEXTS[0]))


def test_the_native_routes_answer_in_llama_servers_shape(mean_server: Server, reference: Any) -> None:
    with mean_server.client() as c:
        for route in ("/embedding", "/embeddings"):
            r = c.post(route, json={"content": TEXTS[0]})
            assert r.status_code == 200, r.text
            body = r.json()
            assert isinstance(body, list) and body[0]["index"] == 0 and len(body[0]["embedding"]) == 1
            np.testing.assert_array_equal(np.asarray(body[0]["embedding"][0], dtype=np.float32),
                                          reference.embed(TEXTS[0]))


def test_pooling_none_gives_raw_per_token_vectors_on_the_native_route(none_server: Server, reference: Any) -> None:
    with none_server.client() as c:
        r = c.post("/embedding", json={"content": TEXTS[0]})
    assert r.status_code == 200, r.text
    got = np.asarray(r.json()[0]["embedding"], dtype=np.float32)
    np.testing.assert_array_equal(got, reference.embed(TEXTS[0], pooling="none", normalize=False))


def test_pooling_none_is_refused_on_the_openai_route(none_server: Server) -> None:
    with none_server.client() as c:
        r = c.post("/v1/embeddings", json={"input": TEXTS[0]})
    assert r.status_code == 400 and "not OAI compatible" in r.json()["error"]["message"]


def test_a_server_without_embeddings_refuses_them_with_501(plain_server: Server) -> None:
    with plain_server.client() as c:
        for route in ("/v1/embeddings", "/embedding", "/embeddings"):
            r = c.post(route, json={"input": "x"})
            assert r.status_code == 501, (route, r.text)
            assert "--embeddings" in r.json()["error"]["message"]


def test_the_embedding_routes_need_the_api_key(mean_server: Server) -> None:
    with mean_server.client(key=None) as c:
        assert c.post("/v1/embeddings", json={"input": "x"}).status_code == 401
    with mean_server.client(key=KEY + "x") as c:
        assert c.post("/embedding", json={"content": "x"}).status_code == 401


@pytest.mark.parametrize("body, param", [
    ({}, "input"),
    ({"input": []}, "input"),
    ({"input": 3}, "input"),
    ({"input": [1.5]}, "input"),
    ({"input": [[10 ** 9]]}, "input"),
    ({"input": "x", "encoding_format": "int8"}, "encoding_format"),
    ({"input": "x", "dimensions": 64}, "dimensions"),
    ({"input": "x", "embd_normalize": -5}, "embd_normalize"),
    ({"input": "word " * 600}, "input"),
])
def test_bad_embedding_requests_are_a_400_naming_the_field(mean_server: Server, body: dict[str, Any],
                                                          param: str) -> None:
    with mean_server.client() as c:
        r = c.post("/v1/embeddings", json=body)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param, r.text


def test_embeddings_and_completions_share_the_server(mean_server: Server) -> None:
    client = mean_server.openai()
    before = client.completions.create(model="m", prompt=TEXTS[1], max_tokens=6, temperature=0).choices[0].text
    client.embeddings.create(model="m", input=TEXTS[0])
    after = client.completions.create(model="m", prompt=TEXTS[1], max_tokens=6, temperature=0).choices[0].text
    assert after == before
