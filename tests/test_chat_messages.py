"""What ``chat`` makes of messages and tools: tools never dropped unsaid when the template cannot
declare them, an assistant's ``content: None`` rendered as nothing, non-text parts refused."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from mtp_bindings import InvalidParameterError, Model, TextOnlyError
from mtp_bindings.chat.template import ChatOptions, declares_tools, render_chat

WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Weather of a city",
                                            "parameters": {"type": "object", "properties": {
                                                "city": {"type": "string"}}, "required": ["city"]}}}
ASK = {"role": "user", "content": "Weather in Paris?"}
NO_TOOLS = "{% for m in messages %}[{{ m['role'] }}:{{ m['content'] }}]{% endfor %}"


class _StubModel:
    """What render_chat reads from a model, without loading one."""

    add_bos, token_bos, token_eos = True, 2, 1

    def __init__(self, arch: str, chat_template: str | None) -> None:
        self.arch, self.chat_template = arch, chat_template

    def token_to_piece(self, token: int, special: bool = False) -> bytes:
        return b"<bos>" if token == 2 else b"<eos>"


def test_tools_on_a_gemma4_model_whose_template_cannot_declare_them_use_the_packages_gemma4_template():
    model: Any = _StubModel("gemma4", NO_TOOLS)
    assert not declares_tools(NO_TOOLS)
    assert render_chat(model, [ASK]) == "[user:Weather in Paris?]"  # no tools: the GGUF's template
    text = render_chat(model, [ASK], options=ChatOptions(tools=[WEATHER]))
    assert "<|tool>declaration:get_weather" in text and text.endswith("<|turn>model\n<|channel>thought\n<channel|>")


def test_the_bundled_models_chat_with_tools_declares_them(trained_paths):
    with Model(trained_paths[0], vocab_only=True) as model:
        assert model.chat_template and not declares_tools(model.chat_template)
        assert "declaration:get_weather" in render_chat(model, [ASK], options=ChatOptions(tools=[WEATHER]))


def test_tools_with_another_models_template_that_cannot_declare_them_are_warned_about(caplog):
    model: Any = _StubModel("llama", NO_TOOLS + "{# another one #}")
    with caplog.at_level(logging.WARNING, logger="mtp_bindings"):
        text = render_chat(model, [ASK], options=ChatOptions(tools=[WEATHER]))
    assert text == "[user:Weather in Paris?]"
    assert any("tool(s) offered are not in the prompt" in r.getMessage() for r in caplog.records)


def test_an_assistant_message_with_content_none_renders_as_empty_not_as_none():
    model: Any = _StubModel("llama", NO_TOOLS)
    call = {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}
    text = render_chat(model, [ASK, {"role": "assistant", "content": None, "tool_calls": [call]},
                               {"role": "user", "content": "and?"}])
    assert text == "[user:Weather in Paris?][assistant:][user:and?]"
    assert "None" not in render_chat(_StubModel("gemma4", None),  # type: ignore[arg-type]
                                     [ASK, {"role": "assistant", "content": None}, {"role": "user", "content": "?"}])


@pytest.mark.parametrize("part", [{"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
                                  {"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}},
                                  {"type": "image"}])
def test_an_image_or_audio_part_is_refused_as_text_only(part):
    model: Any = _StubModel("gemma4", None)
    with pytest.raises(TextOnlyError, match="this model takes text only"):
        render_chat(model, [{"role": "user", "content": [{"type": "text", "text": "what is this?"}, part]}])


def test_text_parts_are_rendered_and_an_unknown_part_is_refused():
    model: Any = _StubModel("gemma4", None)
    text = render_chat(model, [{"role": "user", "content": [{"type": "text", "text": "hello"}]}])
    assert "hello" in text
    with pytest.raises(InvalidParameterError, match="content part must be"):
        render_chat(model, [{"role": "user", "content": [{"type": "sticker"}]}])


def test_chat_refuses_an_image_part_before_generating(trained_paths):
    with Model(trained_paths[0]) as model:
        with pytest.raises(TextOnlyError, match="this model takes text only"):
            model.chat([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}],
                       max_tokens=2)
