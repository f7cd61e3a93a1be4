"""Issue 15, "the front door": what a new user meets, item by item. Commands run as a user runs
them (the installed ``mtp-bindings`` in a subprocess, outside the source tree); a few checks of the
library and the parser run in-process."""

from __future__ import annotations

import argparse
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from contextlib import redirect_stderr
from pathlib import Path

import pytest

from fixture_paths import fixture_path
from test_cli import run

ERROR = "mtp-bindings: error: "


def cli(*args: str) -> list[str]:
    exe = shutil.which("mtp-bindings")
    return ([exe] if exe else [sys.executable, "-m", "mtp_bindings"]) + list(args)


def last_line(text: str) -> str:
    lines = text.strip().splitlines()
    return lines[-1] if lines else ""


def one_error(out: subprocess.CompletedProcess, *needles: str) -> str:
    """Assert the one error convention (rc 2, last stderr line ``mtp-bindings: error: ...``, no
    traceback) and that the error says each of ``needles``; return the error line."""
    line = last_line(out.stderr)
    assert out.returncode == 2, (out.returncode, out.stderr)
    assert line.startswith(ERROR) and "Traceback" not in out.stderr, out.stderr
    for needle in needles:
        assert needle in line, (needle, line)
    return line


# --- item 1: the assistant is the model's own, or none --------------------------------------------

def test_a_users_model_alone_decodes_plainly_and_says_so_once(tmp_path):
    target = tmp_path / "mymodel.gguf"
    shutil.copyfile(fixture_path("dense-target.gguf"), target)
    out = run("generate", "-m", str(target), "-p", "hi", "-n", "4", "--json")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["stats"]["n_drafted"] == 0
    assert out.stderr.count("plain decoding") == 1 and "mtp-bindings: note: " in out.stderr


def test_an_assistant_beside_the_model_is_found_by_its_name():
    out = run("generate", "-m", str(fixture_path("dense-target.gguf")), "-p", "def f(x):\n", "-n", "12", "--temp", "0",
              "--json")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["stats"]["n_drafted"] > 0
    assert "dense-assistant.gguf" in out.stderr


def test_an_assistant_beside_the_model_that_does_not_fit_falls_back_to_plain_decoding(tmp_path):
    from mtp_bindings.models import ASSISTANT

    shutil.copyfile(fixture_path("dense-target.gguf"), tmp_path / "x-target.gguf")
    shutil.copyfile(ASSISTANT, tmp_path / "x-assistant.gguf")  # backbone 128, the dense target has 64
    out = run("generate", "-m", str(tmp_path / "x-target.gguf"), "-p", "hi", "-n", "4", "--json")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["stats"]["n_drafted"] == 0
    assert "does not fit" in out.stderr and "plain decoding" in out.stderr


def test_a_named_assistant_that_does_not_fit_is_an_error():
    from mtp_bindings.models import ASSISTANT

    one_error(run("generate", "-m", str(fixture_path("dense-target.gguf")), "--mtp-head", str(ASSISTANT),
                  "-p", "hi"), "cannot attach assistant", "backbone")


@pytest.mark.parametrize("target, expected", [
    ("trained-target.gguf", "trained-assistant.gguf"),
    ("gemma-4-E2B-it-Q4_K_M.gguf", "gemma-4-E2B-it-assistant-Q4_K_M.gguf"),
    ("gemma-4-E2B-it.gguf", "gemma-4-E2B-it-assistant.gguf"),
])
def test_assistant_names_follow_the_targets(tmp_path, target, expected):
    from mtp_bindings.models import find_assistant

    (tmp_path / target).write_bytes(b"")
    assert find_assistant(tmp_path / target) is None
    (tmp_path / "unrelated-assistant.gguf").write_bytes(b"")
    assert find_assistant(tmp_path / target) is None
    (tmp_path / expected).write_bytes(b"")
    assert find_assistant(tmp_path / target) == tmp_path / expected


# --- item 4: Ctrl-C ---------------------------------------------------------------------------------

def _start(*args: str, stdin: int | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen(cli(*args), stdin=stdin, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd="/", env={**os.environ, "PYTHONUNBUFFERED": "1"})


def _wait_for_line(stream: io.TextIOBase, startswith: str, timeout: float = 60.0) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = stream.readline()
        if not line:
            break
        if line.startswith(startswith):
            return line
    pytest.fail(f"no line starting with {startswith!r}")


LONG = ("-n", "-1", "--ignore-eos", "-c", "4096")  # a generation that runs for seconds


def test_ctrl_c_stops_generate_and_still_prints_the_text_and_the_stats():
    proc = _start("generate", "-p", "def main(argv):\n", *LONG)
    proc.stdout.read(16)  # it is generating
    proc.send_signal(signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=30)
    assert proc.returncode == 130, stderr
    assert "tokens/s" in stderr and "interrupted after" in stderr and "Traceback" not in stderr
    assert stdout.endswith("\n")


def test_ctrl_c_stops_generate_json_and_still_prints_the_json():
    proc = _start("generate", "-p", "def main(argv):\n", *LONG, "--json", "-v")
    _wait_for_line(proc.stderr, "assistant ")  # loaded: the generation starts now
    time.sleep(0.3)
    proc.send_signal(signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=30)
    assert proc.returncode == 130, stderr
    d = json.loads(stdout)
    assert d["finish_reason"] == "cancelled" and 0 < len(d["tokens"]) < 4000
    assert "Traceback" not in stderr


def test_ctrl_c_in_chat_stops_the_reply_and_a_second_at_the_prompt_ends_it():
    proc = _start("chat", *LONG, "--stats", stdin=subprocess.PIPE)
    proc.stdin.write("hello\n")
    proc.stdin.flush()
    proc.stdout.read(16)  # the reply is being written
    proc.send_signal(signal.SIGINT)
    _wait_for_line(proc.stderr, "mtp ")  # the reply ended (its stats line); the chat goes on
    assert proc.poll() is None
    time.sleep(0.2)  # back at the prompt, waiting for the next line
    proc.send_signal(signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=30)
    assert proc.returncode == 130 and "Traceback" not in stderr


@pytest.mark.parametrize("delay", [0.2, 0.5, 1.0])
def test_ctrl_c_during_start_up_prints_no_traceback(delay):
    proc = _start("generate", "-p", "x", *LONG)
    time.sleep(delay)
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=30)
    assert proc.returncode == 130 and "Traceback" not in stderr, stderr


# --- item 5: say why it stopped, warn, show progress ------------------------------------------------

def test_a_full_context_is_said_on_stderr():
    out = run("generate", "-p", "def f():\n", "-c", "256", "-n", "500", "--ignore-eos")
    assert out.returncode == 0, out.stderr
    assert "the context is full (256 tokens; -c sets it): stopped after" in out.stderr
    assert "of 500 tokens" in out.stderr


def test_n_minus_one_generates_until_the_context_is_full():
    out = run("generate", "-p", "def f():\n", "--ctx-size", "256", "-n", "-1", "--ignore-eos", "--json")
    assert out.returncode == 0, out.stderr
    d = json.loads(out.stdout)
    assert d["finish_reason"] == "length" and d["stats"]["hit_context_limit"]
    assert d["stats"]["n_prompt"] + len(d["tokens"]) > 256  # the KV cache full, and the last token sampled
    assert "the context is full (256 tokens; --ctx-size sets it)" in out.stderr


def test_a_context_beyond_the_training_context_warns():
    out = run("generate", "-p", "x", "-n", "1", "-c", "8192")
    assert out.returncode == 0, out.stderr
    assert "mtp-bindings: warning: context size 8192 is beyond" in out.stderr and "(4096 tokens)" in out.stderr


def test_a_long_prompt_shows_its_progress(tmp_path):
    prompt = tmp_path / "prompt.py"
    prompt.write_text("".join(f"def function_{i}(value):\n    return value * {i}\n\n" for i in range(150)))
    out = run("generate", "-f", str(prompt), "-n", "1")
    assert out.returncode == 0, out.stderr
    lines = [line for line in out.stderr.splitlines() if line.startswith("prompt: ")]
    assert lines and lines[-1].endswith("(100%)"), out.stderr


# --- items 6-7: llama.cpp's flags and conventions ---------------------------------------------------

@pytest.mark.parametrize("flags, needle", [
    (["-mu", "https://example.org/m.gguf"], "not supported: -mu (use -m FILE"),
    (["--mirostat", "2"], "not supported: --mirostat (use --temp"),
    (["-cnv"], "not supported: -cnv (use mtp-bindings chat)"),
    (["--te", "0.5"], "unrecognized arguments: --te 0.5"),  # no abbreviations
    (["-nx", "5"], "unrecognized arguments: -nx 5"),  # no single-dash prefixes
])
def test_llama_cpp_flags_we_lack_are_refused_by_name(flags, needle):
    out = run("generate", "-p", "x", *flags)
    one_error(out, needle)
    assert "usage: mtp-bindings generate" in out.stderr


def test_chat_refuses_f_and_points_to_stdin():
    one_error(run("chat", "-f", "prompt.txt"), "not supported: -f", "chat < FILE")


def test_every_unsupported_flag_is_refused_by_every_command_that_lacks_it():
    from mtp_bindings.cli import build_parser
    from mtp_bindings.cli.flags import UNSUPPORTED

    parser = build_parser()
    subparsers = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    supported = []
    for command in ("demo", "generate", "chat", "serve"):
        own = subparsers.choices[command]._option_string_actions
        for flags, _ in UNSUPPORTED:
            for flag in flags:
                if type(own[flag]).__name__ != "_Unsupported":
                    supported.append((command, flag))
                    continue
                err = io.StringIO()
                with redirect_stderr(err), pytest.raises(SystemExit) as e:
                    parser.parse_args([command, flag, "1"])
                assert e.value.code == 2 and f"not supported: {flag} (use " in err.getvalue(), (command, flag)
    # the llama.cpp flags a command has itself (issue 26: --jinja, --chat-template, grammars, batches,
    # embeddings and slot state)
    constraint = ("--grammar", "--grammar-file", "-j", "--json-schema", "-jf", "--json-schema-file")
    template = ("--chat-template", "--chat-template-file")
    batch = ("-b", "--batch-size", "-ub", "--ubatch-size")
    embed = ("--embd-normalize", "--embedding", "--embeddings", "--pooling", "--slot-save-path")
    samplers = ("--typical", "--typical-p", "--top-nsigma", "--top-n-sigma", "--xtc-probability", "--xtc-threshold",
                "--dry-multiplier", "--dry-base", "--dry-allowed-length", "--dry-penalty-last-n",
                "--dry-sequence-breaker")
    assert sorted(supported) == sorted(
        [("chat", "--system-prompt"), ("chat", "-sys"), ("chat", "-st"), ("chat", "--single-turn"),
         ("generate", "--file"), ("generate", "-f")]
        + [(c, "--jinja") for c in ("generate", "chat", "serve")]
        + [(c, f) for c in ("chat", "serve") for f in template]
        + [(c, f) for c in ("generate", "chat") for f in constraint + batch + samplers]
        + [("serve", f) for f in embed])


def test_flag_defaults_are_the_librarys():
    from mtp_bindings.cli import build_parser
    from mtp_bindings.config.params import SAMPLING_DEFAULTS, ContextParams

    args = build_parser().parse_args(["generate", "-p", "x"])
    flags = {"temp": "temperature", "top_k": "top_k", "top_p": "top_p", "min_p": "min_p",
             "repeat_penalty": "repeat_penalty", "repeat_last_n": "repeat_last_n",
             "presence_penalty": "presence_penalty", "frequency_penalty": "frequency_penalty"}
    for dest, param in flags.items():
        assert getattr(args, dest) == getattr(SAMPLING_DEFAULTS, param), dest
    context = ContextParams()
    assert (args.cache_type_k, args.cache_type_v, args.cache_type_k_swa, args.cache_type_v_swa, args.flash_attn) == \
        (context.type_k, context.type_v, context.type_k_swa, context.type_v_swa, context.flash_attn)


def test_the_sliding_window_cache_type_flags_reach_the_context():
    from mtp_bindings.cli import build_parser
    from mtp_bindings.cli.session import context_kwargs

    class Pair:  # what context_kwargs reads of a model
        has_assistant = False
        n_ctx_train = 4096

    args = build_parser().parse_args(["generate", "-p", "x", "-ctk", "q8_0", "--cache-type-k-swa", "q4_0",
                                      "--cache-type-v-swa", "turbo4"])
    kwargs = context_kwargs(args, Pair())
    assert (kwargs["type_k"], kwargs["type_k_swa"], kwargs["type_v_swa"]) == ("q8_0", "q4_0", "turbo4")


def test_ngl_seed_minus_one_and_no_mmap_are_accepted():
    out = run("generate", "-p", "x", "-n", "2", "-ngl", "99", "--seed", "-1", "--temp", "0.8", "--no-mmap")
    assert out.returncode == 0, out.stderr


def test_f_reads_the_prompt_from_a_file(tmp_path):
    (tmp_path / "p.txt").write_text("import os\n")
    a = json.loads(run("generate", "-f", str(tmp_path / "p.txt"), "-n", "8", "--temp", "0", "--json").stdout)
    b = json.loads(run("generate", "-p", "import os\n", "-n", "8", "--temp", "0", "--json").stdout)
    assert a["tokens"] == b["tokens"]
    one_error(run("generate", "-f", str(tmp_path / "missing.txt")), "cannot read the prompt file (-f ")


@pytest.mark.parametrize("flags, needle", [
    (["-c", "-5"], "-c must be a positive int"),
    (["--ctx-size", "-5"], "--ctx-size must be a positive int"),
    (["-t", "0"], "-t must be an int in 1..512, got 0"),
    (["-n", "-7"], "-n must be a number of tokens, or -1"),
    (["--top-p", "3"], "--top-p must be a number"),
])
def test_errors_name_the_flag_the_user_typed(flags, needle):
    line = one_error(run("generate", "-p", "x", *flags), needle)
    assert "n_ctx" not in line and "n_threads" not in line and "max_tokens" not in line


# --- item 8: the small things -----------------------------------------------------------------------

def test_version_and_python_m():
    from mtp_bindings import __version__

    out = run("--version")
    assert out.returncode == 0 and out.stdout.startswith(f"mtp-bindings {__version__} (llama.cpp ")
    out = subprocess.run([sys.executable, "-m", "mtp_bindings", "--version"], capture_output=True, text=True,
                         cwd="/", timeout=60)
    assert out.returncode == 0 and __version__ in out.stdout


def test_list_devices_prints_the_devices_dev_takes_and_exits():
    """llama.cpp's --list-devices: its heading, then a line per device named as -dev takes it."""
    from mtp_bindings.native.devices import list_devices

    out = run("--list-devices")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == "Available devices:"
    # this process's local devices (RPC servers other tests added stay registered here, not in the command's)
    names = [d.name for d in list_devices() if d.total_bytes is not None]
    if names:
        assert [line.split(":")[0].strip() for line in lines[1:]] == names
    else:
        assert len(lines) == 2 and "no device" in lines[1]


def test_top_level_help_describes_the_tool_whole():
    from mtp_bindings.cli import DESCRIPTION

    out = run("--help")
    assert out.returncode == 0 and " ".join(DESCRIPTION.split()) in " ".join(out.stdout.split())


def test_every_flag_has_help():
    from mtp_bindings.cli import build_parser

    parser = build_parser()
    subparsers = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    missing = [f"{name} {a.option_strings or a.dest}" for name, p in subparsers.choices.items() for a in p._actions
               if not a.help and a.help != argparse.SUPPRESS]
    assert not missing


def test_an_unknown_flag_after_a_subcommand_shows_that_subcommands_usage():
    out = run("info", "x.gguf", "--bogus")
    one_error(out, "unrecognized arguments: --bogus")
    assert "usage: mtp-bindings info" in out.stderr


def test_bench_help_says_nothing_about_issues():
    out = run("bench", "--help")
    assert out.returncode == 0 and "issue" not in out.stdout.lower()


def test_demo_refuses_no_mtp():
    one_error(run("demo", "--no-mtp"), "not supported: --no-mtp")


def test_verbose_shows_what_was_loaded():
    out = run("generate", "-p", "x", "-n", "1", "-v")
    assert out.returncode == 0, out.stderr
    assert "model      " in out.stderr and "trained-target.gguf" in out.stderr
    assert "assistant  " in out.stderr and " head, " in out.stderr
    assert "buffer size" in out.stderr  # llama.cpp's load log


# --- item 9: typed errors, one convention -----------------------------------------------------------

def test_a_non_gguf_assistant_is_an_assistant_load_error(tmp_path):
    from mtp_bindings import AssistantFileNotFoundError, AssistantLoadError, Model

    bad = tmp_path / "assistant.gguf"
    bad.write_bytes(b"not a gguf at all")
    with Model(fixture_path("dense-target.gguf")) as m:
        with pytest.raises(AssistantLoadError, match="assistant file .* is not a GGUF"):
            m.attach_assistant(bad)
        with pytest.raises(AssistantFileNotFoundError) as e:
            m.attach_assistant(tmp_path / "missing.gguf")
        assert isinstance(e.value, FileNotFoundError) and "assistant" in str(e.value)
    one_error(run("generate", "--mtp-head", str(bad), "-p", "x"), "assistant file", "is not a GGUF")


@pytest.mark.parametrize("keep", [40, 0.1, 0.5, 0.9])
@pytest.mark.parametrize("command", ["info", "verify-assistant"])
def test_a_truncated_gguf_is_said_to_be_truncated(tmp_path, command, keep):
    data = fixture_path("dense-assistant.gguf").read_bytes()
    bad = tmp_path / "truncated.gguf"
    bad.write_bytes(data[: keep if isinstance(keep, int) else int(len(data) * keep)])
    out = run(command, str(bad))
    one_error(out, "is truncated")
    assert "dtype" not in out.stderr


def test_generate_with_a_prompt_of_the_wrong_type_is_an_invalid_parameter_error(dense_model):
    from mtp_bindings import InvalidParameterError

    for prompt in (123, 1.5, None, {"a": 1}):
        with pytest.raises(InvalidParameterError, match="prompt must be a str or a sequence of token ids"):
            dense_model.generate(prompt, max_tokens=2, temperature=0)


def test_demo_with_a_missing_model_prints_only_the_error(tmp_path):
    out = run("demo", "-m", str(tmp_path / "missing.gguf"))
    one_error(out, "not found")
    assert out.stdout == ""


@pytest.mark.parametrize("args", [
    ["generate", "-m", "/nonexistent.gguf", "-p", "x"],
    ["generate"],  # no prompt
    ["info", "/nonexistent.gguf"],
    ["verify-assistant", "/nonexistent.gguf"],
    ["serve", "--port", "70000"],
    ["bench", "--parts", "nope"],
    ["nosuchcommand"],
])
def test_every_error_follows_one_convention(args):
    one_error(run(*args))


# --- item 12: the bundled models ----------------------------------------------------------------------

def test_the_bundled_models_are_exported_and_installed():
    import mtp_bindings
    from mtp_bindings.models import ASSISTANT, TARGET

    pkg = Path(mtp_bindings.__file__).resolve().parent
    assert TARGET.is_file() and ASSISTANT.is_file() and TARGET.parent == pkg / "models"


def test_the_readmes_first_python_snippet_runs():
    readme = (Path(__file__).parent.parent / "README.md").read_text()
    snippet = readme.split("```python\n", 1)[1].split("```", 1)[0]
    assert "from mtp_bindings.models import" in snippet
    out = subprocess.run([sys.executable, "-c", snippet], capture_output=True, text=True, cwd="/", timeout=120)
    assert out.returncode == 0, out.stderr
