"""Issue 26, items 6 and 8: llama-server / llama-cli command lines run here with their meaning
(``--spec-type draft-mtp``, ``--spec-draft-*``, ``-td``, ``--jinja``, ``--chat-template NAME``),
what we cannot honour is refused by name, structured output works from the command line, and no
hint says something false. Commands run as a user runs them (a subprocess); a few checks of the
parser and the session run in-process."""

from __future__ import annotations

import json
import shutil

import pytest

from fixture_paths import fixture_path
from test_cli import run
from test_front_door import one_error

from mtp_bindings import models

ASSISTANT = str(models.ASSISTANT)
# llama.cpp's speculative-simple README's MTP line, with our bundled pair for its model
UPSTREAM_MTP = ["--spec-type", "draft-mtp", "--spec-draft-model", ASSISTANT, "--spec-draft-n-max", "3",
                "-ngld", "99", "--temp", "0", "--top-k", "1", "--seed", "42", "-ngl", "99"]


def generate_json(*flags: str) -> dict:
    out = run("generate", "-p", "def parse(argv):\n", "-n", "24", "--json", "--temp", "0", *flags)  # greedy
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def parse(*argv: str):
    from mtp_bindings.cli import build_parser

    args = build_parser().parse_args(list(argv))
    args.argv = list(argv)
    return args


# --- item 6: speculative flags ------------------------------------------------------------------

def test_an_upstream_mtp_command_line_drafts_with_mtp():
    d = generate_json(*UPSTREAM_MTP, "--spec-draft-ngl", "all", "--spec-draft-device", "none", "--jinja",
                      "--spec-draft-p-min", "0", "--spec-draft-n-min", "3", "-t", "1", "-td", "1")
    assert d["stats"]["n_drafted"] > 0


def test_spec_type_none_decodes_plainly_with_the_same_text():
    mtp = generate_json(*UPSTREAM_MTP)
    plain = generate_json("--spec-type", "none", "--spec-draft-model", ASSISTANT)
    assert plain["stats"]["n_drafted"] == 0 and mtp["stats"]["n_drafted"] > 0
    assert plain["tokens"] == mtp["tokens"]


def test_spec_type_draft_mtp_without_an_assistant_is_refused(tmp_path):
    target = tmp_path / "lonely.gguf"
    shutil.copy(fixture_path("dense-target.gguf"), target)
    one_error(run("generate", "-m", str(target), "-p", "x", "--spec-type", "draft-mtp"),
              "--spec-type draft-mtp needs an MTP assistant", "--spec-draft-model or --mtp-head FILE")


def test_spec_type_draft_mtp_contradicts_no_mtp():
    one_error(run("generate", "-p", "x", "--no-mtp", "--spec-type", "draft-mtp"), "--no-mtp contradicts --spec-type")


@pytest.mark.parametrize("value, needle", [
    ("ngram-mod", "not supported: ngram-mod (mtp-bindings drafts with Gemma 4 MTP assistants only: draft-mtp"),
    ("draft-simple,draft-mtp", "not supported: draft-simple"),
    ("magic", "unknown speculative type 'magic' (llama.cpp's: none, draft-simple"),
])
def test_other_speculative_types_are_refused_by_name(value, needle):
    one_error(run("generate", "-p", "x", "--spec-type", value), needle)


def test_none_anywhere_in_the_spec_type_list_means_plain_decoding_as_in_llama_cpp():
    assert parse("generate", "-p", "x", "--spec-type", "draft-mtp,none").spec_type == "none"


def test_a_draft_confidence_cut_off_is_refused_as_we_cannot_honour_it():
    one_error(run("generate", "-p", "x", "--spec-draft-p-min", "0.5"), "--spec-draft-p-min", "0.5: not supported",
              "no confidence cut-off")
    assert run("generate", "-p", "x", "-n", "2", "--draft-p-min", "0").returncode == 0


@pytest.mark.parametrize("flags, needle", [
    ([], "--spec-draft-n-min 2: not supported with --preset auto"),
    (["--spec-draft-n-max", "1"], "--spec-draft-n-min 2 is more than the 1 tokens drafted a round"),
])
def test_a_minimum_draft_we_would_not_meet_is_refused(flags, needle):
    one_error(run("generate", "-p", "x", "--spec-draft-n-min", "2", *flags), needle)


def test_the_removed_draft_min_flag_points_to_its_new_name():
    one_error(run("generate", "-p", "x", "--draft-min", "2"), "not supported: --draft-min (use --spec-draft-n-min")


def test_the_spec_draft_aliases_set_the_assistants_file_layers_and_devices():
    a = parse("chat", "--spec-draft-model", "a.gguf", "--spec-draft-ngl", "all", "--spec-draft-device", "none")
    b = parse("chat", "-md", "a.gguf", "-ngld", "-1", "-devd", "none")
    assert (str(a.mtp_head), a.n_gpu_layers_draft, a.device_draft) == (str(b.mtp_head), -1, "none")
    assert parse("chat", "--spec-draft-ngl", "auto").n_gpu_layers_draft is None  # llama.cpp's default: as -ngl
    assert parse("chat", "-ngl", "all").n_gpu_layers == -1


def test_td_sets_the_drafting_threads_of_generate_and_serve_takes_only_t_s_count():
    """generate/chat keep -td's count for drafting (the output is the same whatever it is); serve's slots
    share the CPUs by their own rule, so there a count other than -t's is refused, not ignored."""
    one = generate_json("-t", "2", "-td", "1")
    assert one["text"] == generate_json("-t", "2")["text"] and one["stats"]["n_drafted"] > 0
    one_error(run("generate", "-p", "x", "-td", "0"), "-td 0: must be an int in 1..")
    one_error(run("serve", "-t", "1", "--spec-draft-threads", "3"), "--spec-draft-threads 3: not supported by serve")


def test_jinja_is_accepted_and_no_jinja_refused():
    assert run("generate", "-p", "x", "-n", "2", "--jinja").returncode == 0
    one_error(run("chat", "--no-jinja"), "not supported: --no-jinja (use --chat-template NAME")


def test_batch_flags_set_the_contexts_batches_and_b_alone_clamps_ub_as_llama_cpp():
    from mtp_bindings.cli.interrupt import Interrupt
    from mtp_bindings.cli.session import session

    for flags, want in ((["-b", "64", "-ub", "32"], (64, 32)), (["-b", "256"], (256, 256)), (["-b", "16"], (16, 16))):
        with session(parse("generate", "-p", "x", *flags), Interrupt()) as (_, ctx):
            assert (ctx.params.n_batch, ctx.params.n_ubatch) == want, flags


def test_a_small_batch_gives_the_same_text():
    assert generate_json("-b", "8", "-ub", "8")["tokens"] == generate_json()["tokens"]


def test_a_batch_smaller_than_an_mtp_round_is_refused():
    one_error(run("generate", "-p", "x", "-b", "4"), "-b 4 is less than the 7 tokens an MTP round verifies")
    assert run("generate", "-p", "x", "-n", "2", "-b", "4", "--no-mtp").returncode == 0


# --- item 6: --chat-template NAME ---------------------------------------------------------------

def test_a_builtin_template_name_renders_llama_cpps_format():
    from mtp_bindings import Model
    from mtp_bindings.chat.template import ChatOptions, chat_prompt

    with Model(models.TARGET) as m:
        p = chat_prompt(m, [{"role": "system", "content": "S"}, {"role": "user", "content": "hi"}],
                        ChatOptions(template="chatml"))
        bos = m.token_to_piece(m.token_bos, special=True).decode()
    assert p.text == bos + "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


def test_chat_with_chat_template_chatml_answers_the_chatml_prompt():
    """The reply to "write a function" in chatml is what ``generate`` writes after that chatml
    prompt (greedy), and differs from the reply in the GGUF's own template."""
    chatml = run("chat", "-n", "24", "--temp", "0", "--chat-template", "chatml", stdin="write a function\n")
    raw = run("generate", "-n", "24", "--temp", "0", "-p", "<|im_start|>user\nwrite a function<|im_end|>\n<|im_start|>assistant\n")
    own = run("chat", "-n", "24", "--temp", "0", stdin="write a function\n")
    assert chatml.returncode == raw.returncode == own.returncode == 0, chatml.stderr
    assert chatml.stdout.strip() and chatml.stdout == raw.stdout != own.stdout


def test_a_template_file_renders_like_the_builtin_of_the_same_format(tmp_path):
    f = tmp_path / "chatml.jinja"
    f.write_text("{{ bos_token }}{% for m in messages %}"
                 "{{ '<|im_start|>' + m.role + '\n' + m.content + '<|im_end|>\n' }}"
                 "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
    by_name = run("chat", "-n", "16", "--temp", "0", "--chat-template", "chatml", stdin="hello\n")
    for flag in ("--chat-template", "--chat-template-file"):
        by_file = run("chat", "-n", "16", "--temp", "0", flag, str(f), stdin="hello\n")
        assert by_file.returncode == 0 and by_file.stdout == by_name.stdout, by_file.stderr


def test_serve_with_chat_template_chatml_renders_chatml(tmp_path):
    from test_server import running_server

    with running_server(["-c", "512", "--chat-template", "chatml"], tmp_path) as server, server.client() as c:
        r = c.post("/apply-template", json={"messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 200, r.text
    assert r.json()["prompt"].endswith("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")


def test_an_unknown_template_name_lists_the_builtin_ones():
    one_error(run("chat", "--chat-template", "chatmlx"), "--chat-template chatmlx: no such file, and not one of "
              "llama.cpp's built-in chat templates:", "chatml", "llama3", "gemma")


def test_a_builtin_template_refuses_tools_rather_than_dropping_them():
    from mtp_bindings import InvalidParameterError, Model
    from mtp_bindings.chat.template import ChatOptions, chat_prompt

    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    with Model(models.TARGET) as m, pytest.raises(InvalidParameterError, match="'chatml' has no tool calls"):
        chat_prompt(m, [{"role": "user", "content": "hi"}], ChatOptions(tools=[tool], template="chatml"))


# --- item 8: structured output, and true hints --------------------------------------------------

SCHEMA = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
          "additionalProperties": False}


def test_generate_json_schema_writes_json_that_follows_it():
    pytest.importorskip("llguidance")
    d = generate_json("-n", "64", "-j", json.dumps(SCHEMA))
    assert d["finish_reason"] == "stop" and set(json.loads(d["text"])) == {"ok"}


def test_generate_grammar_writes_only_what_the_grammar_allows():
    pytest.importorskip("llguidance")
    d = generate_json("--grammar", 'root ::= "yes" | "no"')
    assert d["text"] in ("yes", "no") and d["finish_reason"] == "stop"


def test_grammar_and_schema_files_are_read(tmp_path):
    pytest.importorskip("llguidance")
    (tmp_path / "g.gbnf").write_text('root ::= "maybe"')
    (tmp_path / "s.json").write_text(json.dumps(SCHEMA))
    assert generate_json("--grammar-file", str(tmp_path / "g.gbnf"))["text"] == "maybe"
    assert set(json.loads(generate_json("-n", "64", "-jf", str(tmp_path / "s.json"))["text"])) == {"ok"}
    one_error(run("generate", "-p", "x", "-jf", str(tmp_path / "none.json")), "-jf: cannot read")


def test_chat_takes_a_grammar_too():
    pytest.importorskip("llguidance")
    out = run("chat", "-n", "16", "--grammar", 'root ::= "fine"', stdin="how are you?\n")
    assert out.returncode == 0 and out.stdout.strip() == "fine", out.stderr


def test_one_grammar_at_most():
    out = run("generate", "-p", "x", "--grammar", 'root ::= "a"', "-j", "{}")
    assert out.returncode == 2 and "not allowed with argument" in out.stderr


def test_a_bad_schema_is_refused_naming_the_flag():
    pytest.importorskip("llguidance")
    one_error(run("generate", "-p", "x", "-j", "{bad"), "-j is not valid JSON")


def test_the_cache_reuse_hint_says_what_the_prompt_cache_does():
    line = one_error(run("serve", "--cache-reuse", "256"), "not supported: --cache-reuse")
    assert "no prompt cache" not in line and "prompt cache, on by default" in line and "--no-cache-prompt" in line


def test_no_hint_says_a_feature_we_have_is_not_implemented():
    from mtp_bindings.cli.flags import UNSUPPORTED

    stale = [(flags, hint) for flags, hint in UNSUPPORTED if "not implemented" in hint or "no prompt cache" in hint]
    assert not stale


# --- llama-server's other samplers (issue 27) ---------------------------------------------------

LLAMA_SAMPLER_FLAGS = ["--typical", "0.9", "--top-n-sigma", "1.5", "--xtc-probability", "0.5", "--xtc-threshold",
                       "0.2", "--dry-multiplier", "0.8", "--dry-base", "1.5", "--dry-allowed-length", "3",
                       "--dry-penalty-last-n", "-1", "--dry-sequence-breaker", "\n", "--dry-sequence-breaker", "##"]


def test_llama_cpps_sampler_flags_reach_the_library_with_their_values():
    from mtp_bindings.cli.generate import gen_kwargs

    class Ctx:
        n_ctx = 64

    kwargs = gen_kwargs(parse("generate", "-p", "x", *LLAMA_SAMPLER_FLAGS), Ctx())
    assert {k: kwargs[k] for k in ("typical_p", "top_n_sigma", "xtc_probability", "xtc_threshold", "dry_multiplier",
                                   "dry_base", "dry_allowed_length", "dry_penalty_last_n", "dry_sequence_breakers")} \
        == {"typical_p": 0.9, "top_n_sigma": 1.5, "xtc_probability": 0.5, "xtc_threshold": 0.2, "dry_multiplier": 0.8,
            "dry_base": 1.5, "dry_allowed_length": 3, "dry_penalty_last_n": -1, "dry_sequence_breakers": ("\n", "##")}


def test_the_sampler_flags_default_to_the_librarys_values():
    from mtp_bindings.cli.args import SAMPLING_FLAGS, dry_sequence_breakers
    from mtp_bindings.config.params import SAMPLING_DEFAULTS

    args = parse("chat")
    for flag, name, _, _ in SAMPLING_FLAGS:
        dest = flag.lstrip("-").replace("-", "_")
        assert getattr(args, dest) == getattr(SAMPLING_DEFAULTS, name), flag
    assert dry_sequence_breakers(args.dry_sequence_breaker) == SAMPLING_DEFAULTS.dry_sequence_breakers


def test_llama_cpps_other_spellings_of_typical_and_top_n_sigma_are_taken():
    args = parse("generate", "-p", "x", "--typical-p", "0.7", "--top-nsigma", "2")
    assert (args.typical, args.top_n_sigma) == (0.7, 2.0)


def test_dry_sequence_breaker_none_clears_the_breakers_before_it_as_llama_cpp():
    from mtp_bindings.cli.args import dry_sequence_breakers

    assert dry_sequence_breakers(["none"]) == ()
    assert dry_sequence_breakers(["a", "none", "b"]) == ("b",)


def test_a_sampler_flag_out_of_range_is_refused_naming_the_flag():
    one_error(run("generate", "-p", "x", "-n", "2", "--xtc-probability", "2"), "--xtc-probability")


def test_generate_samples_with_llama_servers_other_samplers():
    out = run("generate", "-p", "def parse(argv):\n", "-n", "12", "--json", "--seed", "3", "--ignore-eos",
              *LLAMA_SAMPLER_FLAGS)
    assert out.returncode == 0, out.stderr
    assert len(json.loads(out.stdout)["tokens"]) == 12
