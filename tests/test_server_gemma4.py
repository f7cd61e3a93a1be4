"""Gemma 4 chat through the real server, with the official ``openai`` client: tools in,
``tool_calls`` out, the tool's answer back into the prompt in Gemma 4's format, and the thinking
channel split into ``reasoning_content``, streamed and not.

The server runs with ``--chat-template FILE``: our Gemma 4 template plus one line that lets a
request append text to the generation prompt (``chat_template_kwargs.reply_prefill``), like an
assistant prefill. The test models write gibberish, so the model's own output is pinned by
``logit_bias``: the end-of-text token (the reply is exactly the prefill) or one ordinary token
(the reply is that token repeated). What this proves: the server renders the request's tools and
kwargs with the given template, parses the reply from the generation prompt on, and returns
OpenAI's shapes -- tool calls (with ``finish_reason: tool_calls``), reasoning and content split as
the model's tokens stream in. It does not prove a model calls tools well: no test model can.
The parser's behaviour on arbitrary text and splits is ``test_gemma4_chat.py``'s.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from mtp_bindings.chat.gemma4_template import GEMMA4_TEMPLATE
from test_server import Server, _free_port, _model_files, _serve_command, running_server

PREFILL_LINE = "{%- if add_generation_prompt and reply_prefill is defined %}{{ reply_prefill }}{% endif %}"
Q = '<|"|>'
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
CALL_TEXT = f"<|tool_call>call:get_weather{{city:{Q}Paris{Q}}}<tool_call|>"


@pytest.fixture(scope="module")
def g4(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    folder = tmp_path_factory.mktemp("gemma4")
    template = folder / "gemma4.jinja"
    template.write_text(GEMMA4_TEMPLATE + PREFILL_LINE, encoding="utf-8")
    with running_server(["-c", "1024", "-np", "1", "--chat-template", str(template)], folder) as server:
        yield server


def post(server: Server, path: str, body: dict[str, Any]) -> dict[str, Any]:
    with server.client() as c:
        r = c.post(path, json=body)
    assert r.status_code == 200, r.text
    return r.json()


def token(server: Server, text: str, special: bool = False) -> int:
    toks = post(server, "/tokenize", {"content": text, "parse_special": special})["tokens"]
    assert len(toks) == 1, (text, toks)
    return toks[0]


def n_tokens(server: Server, prompt: str) -> int:
    """The prompt's length as a chat prompt is tokenized (control-token text parsed, nothing added)."""
    return len(post(server, "/tokenize", {"content": prompt})["tokens"])


def eos_only(server: Server) -> dict[str, int]:
    return {str(token(server, "<eos>", special=True)): 100}


def test_the_template_file_overrides_the_ggufs(g4: Server) -> None:
    with g4.client() as c:
        assert c.get("/props").json()["chat_template"] == GEMMA4_TEMPLATE + PREFILL_LINE
    prompt = post(g4, "/apply-template", {"messages": ASK, "tools": [WEATHER]})["prompt"]
    assert prompt.startswith("<bos><|turn>system\n<|tool>declaration:get_weather{description:")
    assert prompt.endswith("<|turn>user\nWhat is the weather in Paris?<turn|>\n<|turn>model\n"
                           "<|channel>thought\n<channel|>")


def test_a_tool_round_trip(g4: Server) -> None:
    client = g4.openai()
    bias = eos_only(g4)
    first = client.chat.completions.create(
        model="any", messages=ASK, tools=[WEATHER], temperature=0, max_tokens=8, logit_bias=bias,
        extra_body={"chat_template_kwargs": {"reply_prefill": CALL_TEXT}})
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None
    (call,) = choice.message.tool_calls
    assert call.type == "function" and call.id.startswith("call_")
    assert call.function.name == "get_weather" and json.loads(call.function.arguments) == {"city": "Paris"}

    # the call and the tool's answer go back; the prompt holds both in Gemma 4's format
    messages = ASK + [choice.message.model_dump(exclude_none=True),
                      {"role": "tool", "tool_call_id": call.id, "content": "sunny, 21 C"}]
    prompt = post(g4, "/apply-template", {"messages": messages, "tools": [WEATHER]})["prompt"]
    assert prompt.endswith(f"<|turn>model\n{CALL_TEXT}<|tool_response>response:get_weather"
                           f"{{value:{Q}sunny, 21 C{Q}}}<tool_response|>")  # the model goes on in its turn
    second = client.chat.completions.create(model="any", messages=messages, tools=[WEATHER], temperature=0,
                                            max_tokens=4, logit_bias=bias)
    assert second.usage.prompt_tokens == n_tokens(g4, prompt)  # the prompt generated from is that one
    assert second.choices[0].finish_reason == "stop" and not second.choices[0].message.tool_calls


def test_a_streamed_tool_call(g4: Server) -> None:
    chunks = list(g4.openai().chat.completions.create(
        model="any", messages=ASK, tools=[WEATHER], tool_choice="auto", temperature=0, max_tokens=8,
        logit_bias=eos_only(g4), stream=True, extra_body={"chat_template_kwargs": {"reply_prefill": CALL_TEXT}}))
    calls = [tc for ch in chunks if ch.choices for tc in ch.choices[0].delta.tool_calls or []]
    assert len(calls) == 1 and calls[0].index == 0 and calls[0].id.startswith("call_")
    assert calls[0].function.name == "get_weather" and json.loads(calls[0].function.arguments) == {"city": "Paris"}
    assert "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices) == ""
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


def test_without_tools_or_with_tool_choice_none_the_call_is_text(g4: Server) -> None:
    kwargs: dict[str, Any] = dict(model="any", messages=ASK, temperature=0, max_tokens=8, logit_bias=eos_only(g4),
                                  extra_body={"chat_template_kwargs": {"reply_prefill": CALL_TEXT}})
    for extra in ({}, {"tools": [WEATHER], "tool_choice": "none"}):
        choice = g4.openai().chat.completions.create(**kwargs, **extra).choices[0]
        assert choice.message.content == CALL_TEXT and not choice.message.tool_calls
        assert choice.finish_reason == "stop"


def _stream(server: Server, prefill: str, n: int) -> tuple[str, str, list[Any]]:
    the = token(server, " the")
    chunks = list(server.openai().chat.completions.create(
        model="any", messages=ASK, temperature=0, max_tokens=n, logit_bias={str(the): 100}, stream=True,
        extra_body={"chat_template_kwargs": {"enable_thinking": True, "reply_prefill": prefill}}))
    deltas = [ch.choices[0].delta for ch in chunks if ch.choices]
    reasoning = "".join(getattr(d, "reasoning_content", None) or "" for d in deltas)
    content = "".join(d.content or "" for d in deltas)
    return reasoning, content, deltas


def test_a_streamed_reply_that_thinks_streams_reasoning(g4: Server) -> None:
    prompt = post(g4, "/apply-template", {"messages": ASK, "chat_template_kwargs": {"enable_thinking": True}})
    assert "<|think|>" in prompt["prompt"] and prompt["prompt"].endswith("<|turn>model\n")
    reasoning, content, deltas = _stream(g4, "<|channel>thought\n", 6)
    assert reasoning == " the" * 6 and content == ""
    assert sum(1 for d in deltas if getattr(d, "reasoning_content", None)) >= 2  # it arrives as it is generated


def test_a_streamed_reply_after_its_thought_streams_content(g4: Server) -> None:
    reasoning, content, deltas = _stream(g4, "<|channel>thought\nAnswer briefly.<channel|>", 5)
    assert reasoning == "Answer briefly." and content == " the" * 5
    first_reasoning = next(i for i, d in enumerate(deltas) if getattr(d, "reasoning_content", None))
    first_content = next(i for i, d in enumerate(deltas) if d.content)
    assert first_reasoning <= first_content  # the prefill's thought comes with the first token


def test_a_whole_reply_splits_reasoning_from_content(g4: Server) -> None:
    the = token(g4, " the")
    msg = g4.openai().chat.completions.create(
        model="any", messages=ASK, temperature=0, max_tokens=3, logit_bias={str(the): 100},
        extra_body={"chat_template_kwargs": {"reply_prefill": "<|channel>thought\nHmm.<channel|>"}}).choices[0].message
    assert msg.content == " the" * 3 and msg.model_extra["reasoning_content"] == "Hmm."


@pytest.mark.parametrize("body,param", [
    ({"tools": [WEATHER], "tool_choice": "required"}, "tool_choice"),
    ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "get_weather"}}}, "tool_choice"),
    ({"tools": [{"type": "function"}]}, "tools.0.function"),
    ({"tools": [{"type": "retrieval", "function": {"name": "x"}}]}, "tools.0.type"),
    ({"chat_template_kwargs": ["enable_thinking"]}, "chat_template_kwargs"),
])
def test_what_is_not_done_is_refused(g4: Server, body: dict[str, Any], param: str) -> None:
    with g4.client() as c:
        r = c.post("/v1/chat/completions", json={"messages": ASK, "max_tokens": 1, **body})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param


def test_a_template_that_does_not_parse_stops_serve(tmp_path: Path) -> None:
    import subprocess

    target, _ = _model_files()
    bad = tmp_path / "bad.jinja"
    bad.write_text("{% for %}", encoding="utf-8")
    cmd = _serve_command() + ["serve", "-m", str(target), "--no-mtp", "--port", str(_free_port()),
                              "--chat-template", str(bad)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0 and "chat template does not parse" in proc.stderr + proc.stdout


def test_the_python_api_returns_the_message() -> None:
    from mtp_bindings import Model

    target, _ = _model_files()
    with Model(target) as model:
        eos = model.token_eos
        result = model.chat(ASK, tools=[WEATHER], chat_template=GEMMA4_TEMPLATE + PREFILL_LINE,
                            chat_template_kwargs={"reply_prefill": CALL_TEXT}, max_tokens=4, temperature=0.0,
                            logit_bias={eos: 100.0})
    assert result.text == ""
    (call,) = result.message["tool_calls"]
    assert call["function"] == {"name": "get_weather", "arguments": '{"city": "Paris"}'}

