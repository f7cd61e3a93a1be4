"""Issue 26, item 11 (the command line's side): in ``chat``, ``/help``, ``/clear``, ``/regen``,
``/read`` and ``/exit`` (llama-cli's commands) are commands, never messages to the model; and
``--help`` says what each preset does, and that none changes the text (MTP is lossless).
Commands run as a user runs them (a subprocess, its replies on stdout, one ``--stats`` line on
stderr per reply)."""

from __future__ import annotations

import pytest

from test_cli import run


def chat(stdin: str, *flags: str):
    out = run("chat", "-n", "12", "--temp", "0", "--stats", *flags, stdin=stdin)  # greedy: replies comparable
    assert out.returncode == 0, out.stderr
    return out


def replies(out) -> int:
    return len([line for line in out.stderr.splitlines() if "tokens/s" in line])


def test_help_clear_and_exit_are_commands_not_messages():
    out = chat("/help\n/clear\n/exit\nhello\n")
    assert replies(out) == 0 and out.stdout == ""  # the model was never asked, and /exit ended the chat
    assert "/regen" in out.stderr and "/read FILE" in out.stderr  # /help listed the commands


def test_the_old_quit_and_reset_still_work():
    out = chat("hello\n/reset\n/quit\nhello\n")
    assert replies(out) == 1


def test_clear_forgets_the_conversation():
    after_clear = chat("write a function\n/clear\nhello\n").stdout.splitlines()
    fresh = chat("hello\n").stdout.splitlines()
    assert after_clear[-1] == fresh[-1]


def test_regen_writes_the_last_reply_again():
    out = chat("write a function\n/regen\n")
    assert replies(out) == 2
    half = len(out.stdout) // 2
    assert out.stdout.strip() and out.stdout[:half] == out.stdout[half:]  # greedy: the same reply twice


def test_regen_without_a_reply_says_so():
    out = chat("/regen\n")
    assert replies(out) == 0 and "mtp-bindings: error: no reply to write again" in out.stderr


def reply_to(content: str) -> str:
    """The reply the Python API writes to one user message, greedy, as ``chat -n 12`` asks."""
    from mtp_bindings import Model, models

    with Model(models.TARGET, assistant=models.ASSISTANT) as m:
        return m.chat([{"role": "user", "content": content}], max_tokens=12, temperature=0.0).text


def test_read_adds_the_file_to_the_next_message(tmp_path):
    f = tmp_path / "notes.txt"
    f.write_text("def add(a, b):\n")
    out = chat(f"/read {f}\nexplain\n")
    assert replies(out) == 1 and "added" in out.stderr
    assert out.stdout == reply_to(f"--- File: {f} ---\ndef add(a, b):\nexplain") + "\n"


def test_an_unknown_command_is_refused_not_sent():
    out = chat("/bogus\n")
    assert replies(out) == 0 and "unknown command /bogus: /help lists them" in out.stderr


def test_two_slashes_send_a_line_that_starts_with_one():
    out = chat("//bogus\n")
    assert replies(out) == 1 and out.stdout == reply_to("/bogus") + "\n"


def test_a_path_is_a_message_not_a_command():
    assert replies(chat("/usr/bin/env python?\n")) == 1


def test_p_is_the_first_turn_and_st_ends_after_its_reply():
    both = chat("hello\n", "-p", "write a function")
    assert replies(both) == 2 and both.stdout.startswith(reply_to("write a function") + "\n")
    one = chat("hello\n", "-p", "write a function", "-st")
    assert replies(one) == 1 and one.stdout == reply_to("write a function") + "\n"
    assert replies(chat("write a function\nhello\n", "-st")) == 1


def test_chat_help_lists_the_commands():
    out = run("chat", "--help")
    text = " ".join(out.stdout.split())
    for command in ("/help", "/clear", "/regen", "/read FILE", "/exit"):
        assert command in text


# --- presets ------------------------------------------------------------------------------------

def test_help_says_what_each_preset_does_and_that_the_text_never_changes():
    from mtp_bindings.config.presets import PRESETS

    text = " ".join(run("generate", "--help").stdout.split())
    assert "MTP is lossless, so a preset changes the speed only, never the text" in text
    for name, preset in PRESETS.items():
        assert f"{name}: {preset.summary()}" in text


@pytest.mark.parametrize("word", ["better", "higher quality", "more accurate"])
def test_no_preset_promises_better_text(word):
    from mtp_bindings.config.presets import PRESETS

    assert not [p.name for p in PRESETS.values() if word in p.summary().lower()]


def test_a_preset_says_its_own_draft_count():
    from mtp_bindings.config.presets import PRESETS

    for p in PRESETS.values():
        assert f"{p.draft_n_max} token" in p.summary() and p.description
