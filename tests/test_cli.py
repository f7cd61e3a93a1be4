"""The ``mtp-bindings`` command line, run as a user runs it (a subprocess, outside the source tree)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from fixture_paths import fixture_path


def run(*args: str, stdin: str | None = None, cwd: Path | None = None, timeout: float = 300,
        env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    exe = shutil.which("mtp-bindings")
    cmd = [exe] if exe else [sys.executable, "-m", "mtp_bindings.cli"]
    return subprocess.run(cmd + list(args), input=stdin, capture_output=True, text=True, timeout=timeout,
                          cwd=cwd or Path("/"), env={**os.environ, **env} if env else None)


def test_help_lists_every_command():
    out = run("--help")
    assert out.returncode == 0
    for cmd in ("demo", "generate", "chat", "serve", "bench", "convert", "verify-assistant", "info"):
        assert cmd in out.stdout


@pytest.mark.parametrize("cmd", ["demo", "generate", "chat", "serve", "bench", "convert", "verify-assistant", "info"])
def test_every_command_has_help(cmd):
    out = run(cmd, "--help")
    assert out.returncode == 0 and "usage:" in out.stdout


def test_info_help_imports_no_benchmark_module():
    """The benchmark is heavy: only ``bench`` may import it (PYTHONPROFILEIMPORTTIME lists every
    module the command imports on stderr)."""
    out = run("info", "--help", env={"PYTHONPROFILEIMPORTTIME": "1"})
    assert out.returncode == 0 and "usage:" in out.stdout
    imported = [line.rsplit("|", 1)[-1].strip() for line in out.stderr.splitlines() if line.startswith("import time:")]
    assert "mtp_bindings.cli" in imported, "the import log is empty: the test checks nothing"
    assert not [m for m in imported if m.startswith("mtp_bindings.benchmark")]


def test_bench_help_lists_the_benchmarks_flags():
    out = run("bench", "--help")
    assert out.returncode == 0
    for flag in ("--quick", "--smoke", "--parts", "--report-only"):
        assert flag in out.stdout


def test_generate_json_prints_text_tokens_and_stats():
    out = run("generate", "-p", "def main(argv):\n", "-n", "24", "--spec-draft-n-max", "2", "--json")
    assert out.returncode == 0, out.stderr
    d = json.loads(out.stdout)
    assert len(d["tokens"]) == 24 and isinstance(d["text"], str) and d["finish_reason"] == "length"
    assert d["stats"]["n_drafted"] > 0 and 0 <= d["stats"]["acceptance_rate"] <= 1


def test_generate_with_and_without_mtp_prints_the_same_greedy_text():
    a = json.loads(run("generate", "-p", "import os\n", "-n", "32", "--temp", "0", "--json").stdout)
    b = json.loads(run("generate", "-p", "import os\n", "-n", "32", "--temp", "0", "--json", "--no-mtp").stdout)
    assert a["tokens"] == b["tokens"] and b["stats"]["n_drafted"] == 0


def test_generate_streams_text_and_reports_speed_on_stderr():
    out = run("generate", "-p", "class Queue:\n", "-n", "16")
    assert out.returncode == 0 and out.stdout.strip()
    assert "tokens/s" in out.stderr


def test_missing_model_is_one_clear_line_and_a_non_zero_exit(tmp_path):
    out = run("generate", "-m", str(tmp_path / "nope.gguf"), "-p", "x")
    assert out.returncode != 0
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "not found" in lines[0] and "Traceback" not in out.stderr


def test_invalid_flag_value_is_refused_naming_the_flag():
    out = run("generate", "-p", "x", "--temp", "-3")
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert out.stderr.strip().splitlines()[-1].startswith("mtp-bindings: error: --temp must be")


def test_info_summarises_a_gguf_and_its_mtp_compatibility():
    out = run("info", str(fixture_path("centroid-assistant.gguf")), "--target", str(fixture_path("dense-target.gguf")))
    assert out.returncode == 0
    assert "gemma4-assistant" in out.stdout and "centroid" in out.stdout and "compatible" in out.stdout


def test_verify_assistant_accepts_a_good_file():
    out = run("verify-assistant", str(fixture_path("ple-assistant.gguf")), "--target", str(fixture_path("ple-target.gguf")))
    assert out.returncode == 0 and "OK" in out.stdout


def test_verify_assistant_says_what_is_wrong():
    out = run("verify-assistant", str(fixture_path("dense-target.gguf")))
    assert out.returncode == 2 and "mtp-bindings: error: " in out.stderr and "architecture is 'gemma4'" in out.stderr
    from mtp_bindings.models import TARGET

    out = run("verify-assistant", str(fixture_path("dense-assistant.gguf")), "--target", str(TARGET))
    assert out.returncode == 2 and "backbone width 64 does not match the target's hidden size 128" in out.stderr


def test_chat_answers_each_line_of_stdin():
    out = run("chat", "-n", "12", "--stats", stdin="hello\nwrite a function\n/quit\n")
    assert out.returncode == 0, out.stderr
    assert len([line for line in out.stderr.splitlines() if "tokens/s" in line]) == 2


def test_convert_reproduces_the_fixture_gguf(tmp_path):
    pytest.importorskip("torch", reason="conversion needs torch (pip install torch)")
    out = tmp_path / "dense-target.gguf"
    r = run("convert", str(fixture_path("dense-target.gguf").parent / "hf" / "dense-target"), str(out), "--outtype", "f32")
    assert r.returncode == 0, r.stderr
    assert out.read_bytes() == fixture_path("dense-target.gguf").read_bytes()


def test_convert_refuses_a_directory_without_a_checkpoint(tmp_path):
    r = run("convert", str(tmp_path), str(tmp_path / "x.gguf"))
    assert r.returncode != 0 and "config.json" in r.stderr
