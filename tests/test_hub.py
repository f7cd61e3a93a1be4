"""Model files from the Hugging Face hub (``Model.from_pretrained``, ``-hf`` / ``--hf-file``), against a
stand-in for the hub: an HTTP server on loopback (``HF_ENDPOINT``) answering the requests
huggingface_hub makes -- ``HEAD`` / ``GET /{repo}/resolve/{revision}/{file}`` with ``ETag`` and
``X-Repo-Commit``, ``GET /api/models/{repo}/tree/{revision}`` -- with the bundled GGUFs under hub-like
names, and ``HF_HOME`` in a temporary folder. Each load runs in a subprocess: huggingface_hub reads
``HF_ENDPOINT`` when it is imported.

Without huggingface_hub installed (the ``hub`` extra) only the test of the error saying so runs.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

import pytest

from fixture_paths import BUNDLED

TARGET, ASSISTANT = BUNDLED / "trained-target.gguf", BUNDLED / "trained-assistant.gguf"
COMMIT = "0123456789abcdef0123456789abcdef01234567"
# repo -> {file name in the repo: the local file served for it}
REPOS: dict[str, dict[str, Path]] = {
    "test-org/trained-pair": {"trained-target.gguf": TARGET, "trained-assistant.gguf": ASSISTANT,
                              "README.md": BUNDLED / "__init__.py"},
    "test-org/tiny-GGUF": {"tiny-Q8_0.gguf": TARGET, "tiny-Q4_K_M.gguf": TARGET,
                           "tiny-assistant-Q4_K_M.gguf": ASSISTANT, "mmproj-tiny-f16.gguf": ASSISTANT},
}
HAS_HUB = importlib.util.find_spec("huggingface_hub") is not None
needs_hub = pytest.mark.skipif(not HAS_HUB, reason="huggingface_hub is not installed (the hub extra)")


class StandIn(BaseHTTPRequestHandler):
    """The hub's file and tree routes over :data:`REPOS`; every request is logged on the server."""

    def log_message(self, *args: Any) -> None:  # quiet: the requests are kept in self.server.seen
        pass

    def _file(self) -> tuple[Path, str] | None:
        path = unquote(urlsplit(self.path).path).lstrip("/")
        repo, sep, rest = path.partition("/resolve/")
        if not sep:
            return None
        _revision, _, name = rest.partition("/")
        files = REPOS.get(repo)
        if files is None:
            self._missing("RepoNotFound", "Repository not found")
            return None
        if name not in files:
            self._missing("EntryNotFound", "Entry not found")
            return None
        return files[name], name

    def _missing(self, code: str, message: str) -> None:
        body = json.dumps({"error": message}).encode()
        self.send_response(404)
        self.send_header("X-Error-Code", code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _send_file(self, with_body: bool) -> None:
        self.server.seen.append((self.command, urlsplit(self.path).path))  # type: ignore[attr-defined]
        found = self._file()
        if found is None:
            if "/resolve/" not in self.path:
                self._missing("RepoNotFound", "not a route of this stand-in")
            return
        local, _ = found
        data = local.read_bytes()
        self.send_response(200)
        self.send_header("ETag", f'"{hashlib.sha256(data).hexdigest()}"')
        self.send_header("X-Repo-Commit", COMMIT)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if with_body:
            self.wfile.write(data)

    def do_HEAD(self) -> None:  # noqa: N802 (http.server's names)
        self._send_file(with_body=False)

    def do_GET(self) -> None:  # noqa: N802
        path = unquote(urlsplit(self.path).path)
        if path.startswith("/api/models/") and "/tree/" in path:
            self.server.seen.append(("GET", path))  # type: ignore[attr-defined]
            repo = path.removeprefix("/api/models/").partition("/tree/")[0]
            if repo not in REPOS:
                self._missing("RepoNotFound", "Repository not found")
                return
            body = json.dumps([{"type": "file", "path": name, "size": local.stat().st_size,
                                "oid": hashlib.sha1(name.encode()).hexdigest()}
                               for name, local in REPOS[repo].items()]).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return
        self._send_file(with_body=True)


@pytest.fixture(scope="module")
def hub() -> Iterator[ThreadingHTTPServer]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), StandIn)
    server.seen = []  # type: ignore[attr-defined]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def run(code: str, hub: ThreadingHTTPServer, home: Path, *,
        args: list[str] | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "HF_ENDPOINT": f"http://127.0.0.1:{hub.server_address[1]}", "HF_HOME": str(home),
           "HF_HUB_DISABLE_TELEMETRY": "1", "HF_HUB_DISABLE_PROGRESS_BARS": "1"}
    env.pop("HF_TOKEN", None)
    cmd = [sys.executable, "-c", code] if args is None else [sys.executable, "-m", "mtp_bindings", *args]
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120)


LOAD = """
import json, sys
from mtp_bindings import Model
with Model.from_pretrained({repo!r}, {filename!r}, {assistant!r}) as m:
    print(json.dumps({{"path": str(m.path), "assistant": m.has_assistant,
                      "text": m.generate("def main(", max_tokens=8).text}}))
"""


def load(hub: ThreadingHTTPServer, home: Path, repo: str, filename: str | None, assistant: str | None = None) -> Any:
    out = run(LOAD.format(repo=repo, filename=filename, assistant=assistant), hub, home)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def reference_text() -> str:
    from mtp_bindings import Model

    with Model(TARGET) as m:
        return m.generate("def main(", max_tokens=8).text


@needs_hub
def test_from_pretrained_downloads_into_hf_home_and_loads_the_file(hub, tmp_path):
    got = load(hub, tmp_path, "test-org/trained-pair", "trained-target.gguf", "trained-assistant.gguf")
    assert got["path"].startswith(str(tmp_path)) and got["path"].endswith("trained-target.gguf")
    assert Path(got["path"]).read_bytes() == TARGET.read_bytes()
    assert got["assistant"] is True
    assert got["text"] == reference_text()


@needs_hub
def test_a_second_load_comes_from_the_cache_without_downloading_again(hub, tmp_path):
    load(hub, tmp_path, "test-org/trained-pair", "trained-target.gguf")
    before = [r for r in hub.seen if r[0] == "GET"]
    load(hub, tmp_path, "test-org/trained-pair", "trained-target.gguf")
    assert [r for r in hub.seen if r[0] == "GET"] == before


@needs_hub
def test_a_glob_filename_names_the_one_matching_file(hub, tmp_path):
    got = load(hub, tmp_path, "test-org/tiny-GGUF", "*Q8_0.gguf")
    assert got["path"].endswith("tiny-Q8_0.gguf") and got["assistant"] is False


@needs_hub
@pytest.mark.parametrize("filename, error, needle", [
    ("missing.gguf", "HubFileNotFoundError", "missing.gguf"),
    ("*.gguf", "HubFileNotFoundError", "several files"),
    ("*.bin", "HubFileNotFoundError", "no file matches"),
])
def test_a_file_the_repository_lacks_is_a_typed_error(hub, tmp_path, filename, error, needle):
    code = f"from mtp_bindings import Model\nModel.from_pretrained('test-org/tiny-GGUF', {filename!r})"
    out = run(code, hub, tmp_path)
    assert out.returncode != 0 and f"mtp_bindings.exceptions.{error}" in out.stderr and needle in out.stderr


@needs_hub
def test_an_unknown_repository_is_a_typed_error(hub, tmp_path):
    out = run("from mtp_bindings import Model\nModel.from_pretrained('nobody/nothing', 'x.gguf')", hub, tmp_path)
    assert out.returncode != 0 and "HubFileNotFoundError" in out.stderr


@needs_hub
def test_cli_hf_repo_takes_the_default_quant_and_its_assistant(hub, tmp_path):
    out = run("", hub, tmp_path, args=["generate", "-hf", "test-org/tiny-GGUF", "-p", "def main(", "-n", "8",
                                        "-v"])
    assert out.returncode == 0, out.stderr
    assert "tiny-Q4_K_M.gguf" in out.stderr and "tiny-assistant-Q4_K_M.gguf" in out.stderr
    assert out.stdout.startswith("def main(" + reference_text()) or reference_text() in out.stdout


@needs_hub
def test_cli_hf_repo_quant_picks_that_file_case_insensitively(hub, tmp_path):
    out = run("", hub, tmp_path, args=["generate", "-hf", "test-org/tiny-GGUF:q8_0", "-p", "x", "-n", "2", "-v"])
    assert out.returncode == 0, out.stderr
    assert "tiny-Q8_0.gguf" in out.stderr


@needs_hub
def test_cli_hf_file_overrides_the_quant(hub, tmp_path):
    out = run("", hub, tmp_path, args=["generate", "-hf", "test-org/trained-pair", "--hf-file", "trained-target.gguf",
                                       "-p", "x", "-n", "2", "-v"])
    assert out.returncode == 0, out.stderr
    assert "trained-target.gguf" in out.stderr and "trained-assistant.gguf" in out.stderr


@needs_hub
def test_cli_hf_repo_with_an_unknown_quant_is_one_clear_error(hub, tmp_path):
    out = run("", hub, tmp_path, args=["generate", "-hf", "test-org/tiny-GGUF:IQ1_S", "-p", "x", "-n", "2"])
    assert out.returncode != 0 and "IQ1_S" in out.stderr and "Traceback" not in out.stderr


def test_without_huggingface_hub_the_error_says_to_install_the_hub_extra(tmp_path):
    code = ("import sys; sys.modules['huggingface_hub'] = None\n"
            "from mtp_bindings import Model\n"
            "from mtp_bindings.exceptions import HubNotInstalledError\n"
            "try:\n    Model.from_pretrained('test-org/trained-pair', 'trained-target.gguf')\n"
            "except HubNotInstalledError as e:\n    print('refused:', e)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "refused:" in out.stdout and "mtp-bindings[hub]" in out.stdout


@pytest.mark.parametrize("spec", ["", "noslash", "a/b/c", "/model", "user/"])
def test_a_malformed_repository_is_refused_before_any_request(spec):
    from mtp_bindings.exceptions import InvalidParameterError
    from mtp_bindings.hub import parse_repo

    with pytest.raises(InvalidParameterError):
        parse_repo(spec)


def test_the_quant_rule_is_llama_cpps():
    from mtp_bindings.exceptions import HubFileNotFoundError
    from mtp_bindings.hub import choose_file

    files = ["README.md", "m-Q8_0.gguf", "m-Q4_K_M.gguf", "m-assistant-Q4_K_M.gguf", "mmproj-m-f16.gguf"]
    assert choose_file(files) == "m-Q4_K_M.gguf"  # the default quant
    assert choose_file(files, "q8_0") == "m-Q8_0.gguf"  # case-insensitive
    assert choose_file(["b-Q8_0.gguf", "a-F16.gguf"]) == "a-F16.gguf"  # no Q4_K_M: the first GGUF
    with pytest.raises(HubFileNotFoundError, match="IQ2_XS"):
        choose_file(files, "IQ2_XS")
    with pytest.raises(HubFileNotFoundError, match="no GGUF"):
        choose_file(["README.md", "mmproj-x.gguf"])


@pytest.mark.parametrize("args, needle", [
    (["--hf-file", "x.gguf"], "give -hf USER/MODEL too"),
    (["-m", str(TARGET), "-hf", "test-org/trained-pair"], "both name the model"),
])
def test_cli_hub_flags_that_contradict_are_one_clear_error(args, needle, tmp_path):
    out = subprocess.run([sys.executable, "-m", "mtp_bindings", "generate", *args, "-p", "x", "-n", "1"],
                         capture_output=True, text=True, timeout=60, env={**os.environ, "HF_HOME": str(tmp_path)})
    assert out.returncode != 0 and needle in out.stderr and "Traceback" not in out.stderr
