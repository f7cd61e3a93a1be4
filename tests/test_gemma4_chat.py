"""Gemma 4 chat, below the server: the fallback template renders Gemma 4's turn format (and
renders exactly what Google's template renders, when the pinned llama.cpp tree is there to
compare with), the template environment is Hugging Face's, and replies split into content,
reasoning and tool calls whole and streamed (any split of the text gives the same parts, and no
marker ever leaks into the streamed content).

What this proves: the format and the parser, on text. That a real server applies them to a model's
output is ``test_server_gemma4.py``'s job.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest

from mtp_bindings.chat.reply import ReplyStream, ValueSyntaxError, gemma_value, parse_call, parse_reply, reply_prefix
from mtp_bindings.exceptions import InvalidParameterError
from mtp_bindings.chat.gemma4_template import GEMMA4_TEMPLATE
from mtp_bindings.chat.template_env import template_environment

UPSTREAM = Path(__file__).resolve().parent.parent / "vendor" / "llama.cpp" / "models" / "templates" / \
    "google-gemma-4-31B-it.jinja"
Q = '<|"|>'
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather in a city",
    "parameters": {"type": "object", "required": ["city"], "properties": {
        "city": {"type": "string", "description": "City name"},
        "unit": {"type": "string", "enum": ["c", "f"]},
        "days": {"type": "integer"},
        "tags": {"type": "array", "items": {"type": "string"}},
        "where": {"type": "object", "properties": {"lat": {"type": "number"}}, "required": ["lat"]}}}}}
CALL = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}
ASK = {"role": "user", "content": "Weather in Paris?"}
CONVERSATIONS: list[dict[str, Any]] = [
    {"messages": [{"role": "user", "content": "Hi"}]},
    {"messages": [{"role": "system", "content": " Be brief "}, {"role": "user", "content": "Hi"},
                  {"role": "assistant", "content": "<|channel>thought\nhmm<channel|>Hello"},
                  {"role": "user", "content": "More"}]},
    {"messages": [{"role": "developer", "content": "dev"}, {"role": "user", "content": "Hi"}], "enable_thinking": True},
    {"messages": [ASK], "tools": [WEATHER]},
    {"messages": [ASK, {"role": "assistant", "content": None, "reasoning_content": "need the tool",
                        "tool_calls": [{**CALL, "function": {"name": "get_weather", "arguments": {
                            "city": "Paris", "days": 2, "ok": True, "l": [1, "a"], "d": {"k": None}}}}]},
                  {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 21 C"}], "tools": [WEATHER]},
    {"messages": [ASK, {"role": "assistant", "content": None, "tool_calls": [CALL]},
                  {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
                  {"role": "assistant", "content": "It is sunny."}, {"role": "user", "content": "thanks"}],
     "tools": [WEATHER]},
    {"messages": [ASK, {"role": "assistant", "content": None, "tool_calls": [CALL]}], "tools": [WEATHER]},
    {"messages": [ASK, {"role": "assistant", "content": None, "tool_calls": [CALL, {**CALL, "id": "call_2"}]},
                  {"role": "tool", "tool_call_id": "call_2", "content": [{"type": "text", "text": "rain"}]},
                  {"role": "tool", "tool_call_id": "call_1", "content": "sun"}], "tools": [WEATHER]},
]


def render(source: str = GEMMA4_TEMPLATE, **variables: Any) -> str:
    return template_environment().from_string(source).render(bos_token="<bos>", **variables)


# ------------------------------------------------------------------------------------------------
# the fallback template: Gemma 4's format
# ------------------------------------------------------------------------------------------------

def test_a_user_turn_then_the_model_answers_without_thinking() -> None:
    text = render(messages=[{"role": "user", "content": " Hi "}], add_generation_prompt=True)
    assert text == "<bos><|turn>user\nHi<turn|>\n<|turn>model\n<|channel>thought\n<channel|>"


def test_thinking_on_and_system_share_the_first_turn() -> None:
    text = render(messages=[{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
                  add_generation_prompt=True, enable_thinking=True)
    assert text == "<bos><|turn>system\n<|think|>\nBe brief.<turn|>\n<|turn>user\nHi<turn|>\n<|turn>model\n"


def test_earlier_thoughts_are_dropped_from_the_prompt() -> None:
    text = render(messages=CONVERSATIONS[1]["messages"], add_generation_prompt=False)
    assert "<|turn>model\nHello<turn|>\n" in text and "hmm" not in text


def test_tools_are_declared_in_gemma_syntax() -> None:
    text = render(messages=[ASK], tools=[WEATHER], add_generation_prompt=True)
    assert text.startswith(
        f"<bos><|turn>system\n<|tool>declaration:get_weather{{description:{Q}Weather in a city{Q},"
        f"parameters:{{properties:{{city:{{description:{Q}City name{Q},type:{Q}STRING{Q}}},"
        f"days:{{type:{Q}INTEGER{Q}}},tags:{{items:{{type:{Q}STRING{Q}}},type:{Q}ARRAY{Q}}},"
        f"unit:{{enum:[{Q}c{Q},{Q}f{Q}],type:{Q}STRING{Q}}},"
        f"where:{{properties:{{lat:{{type:{Q}NUMBER{Q}}}}},required:[{Q}lat{Q}],type:{Q}OBJECT{Q}}}}},"
        f"required:[{Q}city{Q}],type:{Q}OBJECT{Q}}}}}<tool|><turn|>\n")


def test_a_tool_round_trip_stays_in_one_model_turn() -> None:
    text = render(**CONVERSATIONS[4], add_generation_prompt=True)
    assert text.endswith(
        f"<|turn>model\n<|channel>thought\nneed the tool\n<channel|>"
        f"<|tool_call>call:get_weather{{city:{Q}Paris{Q},d:{{k:None}},days:2,l:[1,{Q}a{Q}],ok:true}}<tool_call|>"
        f"<|tool_response>response:get_weather{{value:{Q}sunny, 21 C{Q}}}<tool_response|>")


def test_tool_responses_are_named_by_their_call_id() -> None:
    text = render(**CONVERSATIONS[7], add_generation_prompt=True)
    assert text.count("<|tool_response>response:get_weather{value:") == 2
    assert f"{{value:{Q}rain{Q}}}" in text and f"{{value:{Q}sun{Q}}}" in text


def test_a_call_without_its_response_waits_for_it() -> None:
    text = render(**CONVERSATIONS[6], add_generation_prompt=True)
    assert text.endswith(f"call:get_weather{{city:{Q}Paris{Q}}}<tool_call|><|tool_response>")


def test_after_a_closed_model_turn_the_generation_prompt_opens_one() -> None:
    messages = [ASK, {"role": "assistant", "content": "Sunny.", "tool_calls": [CALL]},
                {"role": "tool", "tool_call_id": "call_1", "content": "sun"}]
    text = render(messages=messages, tools=[WEATHER], add_generation_prompt=True)
    assert text.endswith("Sunny.<turn|>\n<|turn>model\n<|channel>thought\n<channel|>")


@pytest.mark.skipif(not UPSTREAM.is_file(), reason="the pinned llama.cpp tree (vendor/) is not unpacked")
@pytest.mark.parametrize("conversation", range(len(CONVERSATIONS)))
@pytest.mark.parametrize("add_generation_prompt", [True, False])
def test_ours_renders_what_googles_template_renders(conversation: int, add_generation_prompt: bool) -> None:
    variables = {**CONVERSATIONS[conversation], "add_generation_prompt": add_generation_prompt}
    assert render(**variables) == render(UPSTREAM.read_text(), **variables)


# ------------------------------------------------------------------------------------------------
# the environment: Hugging Face's
# ------------------------------------------------------------------------------------------------

def test_tojson_keeps_non_ascii_and_takes_indent() -> None:
    assert render("{{ x | tojson }}", x={"city": "Zürich <&>"}) == '{"city": "Zürich <&>"}'
    assert render("{{ x | tojson(indent=2) }}", x=[1]) == "[\n  1\n]"


def test_loopcontrols_strftime_now_and_raise_exception() -> None:
    assert render("{% for i in range(5) %}{% if i == 2 %}{% break %}{% endif %}{{ i }}{% endfor %}") == "01"
    assert len(render("{{ strftime_now('%Y-%m-%d') }}")) == 10
    with pytest.raises(InvalidParameterError, match="no system role"):
        render("{{ raise_exception('no system role') }}")


class _StubModel:
    """What render_chat reads from a model, without loading one."""

    chat_template: str | None = None
    add_bos, token_bos, token_eos = True, 2, 1

    def token_to_piece(self, token: int, special: bool = False) -> bytes:
        return b"<bos>" if token == 2 else b"<eos>"


def test_render_chat_passes_tools_and_template_kwargs() -> None:
    from mtp_bindings.chat.template import ChatOptions, chat_prompt, render_chat

    model: Any = _StubModel()
    assert render_chat(model, [ASK]).endswith("<|turn>model\n<|channel>thought\n<channel|>")  # the fallback
    opts = ChatOptions(tools=[WEATHER], kwargs={"enable_thinking": True, "messages": "ignored"})
    text = render_chat(model, [ASK], options=opts)
    assert "<|think|>" in text and "declaration:get_weather" in text and text.endswith("<|turn>model\n")
    custom = ChatOptions(template="{{ greeting }} {{ messages[0].content }}{% if add_generation_prompt %}!{% endif %}",
                         kwargs={"greeting": "hello"})
    prompt = chat_prompt(model, [ASK], custom)
    assert prompt.text == "hello Weather in Paris?!" and prompt.reply_prefix == ""  # no Gemma 4 model turn
    assert chat_prompt(model, [ASK], ChatOptions(kwargs={"enable_thinking": True})).reply_prefix == ""
    assert chat_prompt(model, [ASK]).reply_prefix == "<|channel>thought\n<channel|>"


# ------------------------------------------------------------------------------------------------
# replies: content, reasoning, tool calls
# ------------------------------------------------------------------------------------------------

REPLY = (f"<|channel>thought\nI should call it.<channel|>Sure <b>. <|tool_call>call:get_weather{{city:{Q}Paris{Q},"
         f"n:[1,2.5,-3e2,true,null],o:{{a:{Q}x, y: {{z}}{Q}}}}}<tool_call|><|tool_call>call:now{{}}<tool_call|>")


def test_a_whole_reply_splits_into_openais_message() -> None:
    msg = parse_reply(REPLY, tools=True).message()
    assert msg["content"] == "Sure <b>. " and msg["reasoning_content"] == "I should call it."
    calls = msg["tool_calls"]
    assert [c["function"]["name"] for c in calls] == ["get_weather", "now"]
    assert json.loads(calls[0]["function"]["arguments"]) == {"city": "Paris", "n": [1, 2.5, -300.0, True, None],
                                                             "o": {"a": "x, y: {z}"}}
    assert calls[1]["function"]["arguments"] == "{}" and calls[0]["id"] != calls[1]["id"]
    assert all(c["type"] == "function" and c["id"].startswith("call_") for c in calls)


def test_without_tools_a_tool_call_is_content() -> None:
    reply = parse_reply(REPLY, tools=False)
    assert reply.tool_calls == [] and reply.content.startswith("Sure <b>. <|tool_call>call:get_weather")


@pytest.mark.parametrize("body", ["call:f{a:}", "call:f{a:<|\"|>x}", "call:{a:1}", "f{a:1}", "call:f[1]"])
def test_a_call_that_does_not_parse_stays_in_the_content(body: str) -> None:
    assert parse_call(body) is None
    text = f"x<|tool_call>{body}<tool_call|>y"
    assert parse_reply(text, tools=True).content == text


def test_an_unterminated_call_or_thought_ends_as_what_it_was() -> None:
    assert parse_reply("a<|tool_call>call:f{x:1}", tools=True).content == "a<|tool_call>call:f{x:1}"
    assert parse_reply("<|channel>thought\nstill thinking").reasoning == "still thinking"
    assert parse_reply("answer<channel|>").content == "answer"  # a stray close is dropped


def test_the_prefix_says_where_the_reply_starts() -> None:
    assert parse_reply("answer", prefix="<|channel>thought\n<channel|>").message() == \
        {"role": "assistant", "content": "answer"}
    assert parse_reply("thinking", prefix="<|channel>thought\n").reasoning == "thinking"
    assert reply_prefix("A<|turn>model\n<|channel>thought\n", "A") == "<|channel>thought\n"
    assert reply_prefix("B", "A") == ""
    assert reply_prefix("A<start_of_turn>model\n", "A") == ""  # Gemma 3's format: the reply is its text


@pytest.mark.parametrize("seed", range(25))
def test_any_split_of_the_stream_gives_the_whole_reply(seed: int) -> None:
    rng = random.Random(seed)
    whole = parse_reply(REPLY, tools=True)
    stream, parts, at = ReplyStream(tools=True), [], 0
    while at < len(REPLY):
        step = rng.randint(1, 12)
        parts.append(stream.feed(REPLY[at:at + step]))
        at += step
    parts.append(stream.finish())
    assert "".join(p.content for p in parts) == whole.content
    assert "".join(p.reasoning for p in parts) == whole.reasoning
    calls = [c for p in parts for c in p.tool_calls]
    assert [(c.name, c.arguments) for c in calls] == [(c.name, c.arguments) for c in whole.tool_calls]
    for p in parts:  # no marker, nor the start of one, is ever sent as text
        assert "<|" not in p.content and "channel" not in p.content and "thought\n" not in p.reasoning


def test_text_that_might_start_a_marker_waits_for_the_next_piece() -> None:
    stream = ReplyStream(tools=True)
    assert stream.feed("Hi <|tool").content == "Hi "
    assert stream.feed("box").content == "<|toolbox"
    assert stream.feed("<").content == "" and stream.finish().content == "<"


@pytest.mark.parametrize("text,value", [
    ('{a:1,b:<|"|>x<|"|>}', {"a": 1, "b": "x"}), ("[]", []), ("{}", {}), ("-0.5", -0.5),
    ('{ "k" : [ true , false , null ] }'.replace('"', Q), {"k": [True, False, None]}),
    ("{nested:{deep:[{x:1}]}}", {"nested": {"deep": [{"x": 1}]}}),
])
def test_gemma_values(text: str, value: Any) -> None:
    assert gemma_value(text) == value


@pytest.mark.parametrize("text", ["{a 1}", "[1,", "{a:1}}", "tru", "<|\"|>open"])
def test_bad_gemma_values(text: str) -> None:
    with pytest.raises(ValueSyntaxError):
        gemma_value(text)


def test_the_request_schema_turns_tool_arguments_into_objects() -> None:
    from mtp_bindings.server.chat_schemas import ChatMessage

    msg = ChatMessage.model_validate({"role": "assistant", "content": None, "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "f", "arguments": '{"a": [1]}'}},
        {"id": "d", "type": "function", "function": {"name": "g", "arguments": "not json"}}]})
    out = msg.as_template_message()
    assert out["content"] is None
    assert [c["function"]["arguments"] for c in out["tool_calls"]] == [{"a": [1]}, "not json"]
    tool = ChatMessage.model_validate({"role": "tool", "tool_call_id": "c", "content": "ok"}).as_template_message()
    assert tool == {"role": "tool", "content": "ok", "tool_call_id": "c"}


class _MarkerVocab:
    """A vocabulary where Gemma 4's markers are single control tokens (as in real Gemma 4 GGUFs):
    they render as nothing unless asked for with ``special=True``."""

    def __init__(self) -> None:
        from mtp_bindings.chat.reply import MARKERS

        self.ids = {m: 1000 + i for i, m in enumerate(MARKERS)}
        self.text = {i: m for m, i in self.ids.items()}

    def tokenize(self, text: str, add_special: bool = False, parse_special: bool = False) -> list[int]:
        return [self.ids[text]] if parse_special and text in self.ids else [ord(c) for c in text]

    def token_to_piece(self, token: int, special: bool = False) -> bytes:
        if token in self.text:
            return self.text[token].encode() if special else b""
        return chr(token).encode()


def test_control_token_markers_are_kept_as_text_for_the_parser() -> None:
    from mtp_bindings.chat.template import reply_markers
    from mtp_bindings.generation.text import TextAssembler

    vocab: Any = _MarkerVocab()
    markers = reply_markers(vocab)
    assert markers == frozenset(vocab.ids.values())
    tokens = vocab.tokenize("<|channel>", parse_special=True) + [ord(c) for c in "thought\nhm"] + \
        vocab.tokenize("<channel|>", parse_special=True) + [ord("A")]
    assert TextAssembler(vocab, []).feed(tokens) == "thought\nhmA"  # what plain rendering would lose
    text = TextAssembler(vocab, [], markers).feed(tokens)
    assert parse_reply(text).message() == {"role": "assistant", "content": "A", "reasoning_content": "hm"}
    assert reply_markers(_StubVocabWithout()) == frozenset()


class _StubVocabWithout:
    """A vocabulary without the markers (they tokenize to several ordinary tokens, as the fixtures')."""

    def tokenize(self, text: str, add_special: bool = False, parse_special: bool = False) -> list[int]:
        return [ord(c) for c in text]

    def token_to_piece(self, token: int, special: bool = False) -> bytes:
        return chr(token).encode()
