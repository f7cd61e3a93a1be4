"""llama-server's slot actions on real server processes (``serve --slot-save-path DIR``): a slot saved
by one server and restored by a fresh one goes on as if never interrupted (temperature 0, MTP drafting
on when this build has it), the restored KV reused rather than decoded again; bad file names and
actions are refused.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from test_server import Server, _model_files, running_server

PROMPT = "def parse_args(argv):\n"
N, M = 12, 16


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("slots")


@pytest.fixture(scope="module")
def first(folder: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    with running_server(["-c", "512", "--slot-save-path", str(folder)], tmp_path_factory.mktemp("a")) as s:
        yield s


@pytest.fixture(scope="module")
def second(folder: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    with running_server(["-c", "512", "--slot-save-path", str(folder)], tmp_path_factory.mktemp("b")) as s:
        yield s


@pytest.fixture(scope="module")
def tokens() -> tuple[list[int], list[int]]:
    """The prompt's tokens and the first N tokens generated from them (temperature 0)."""
    from mtp_bindings import Model

    with Model(_model_files()[0]) as m:
        prompt = m.tokenize(PROMPT)
        return prompt, m.generate(prompt, max_tokens=N).tokens


def complete(c: httpx.Client, prompt: list[int], n: int) -> dict[str, Any]:
    r = c.post("/v1/completions", json={"prompt": prompt, "max_tokens": n, "temperature": 0})
    assert r.status_code == 200, r.text
    return r.json()


def test_a_slot_restored_by_a_fresh_server_goes_on_as_if_never_interrupted(first: Server, second: Server,
                                                                          tokens: Any) -> None:
    prompt, generated = tokens
    with first.client() as a, second.client() as b:
        done = complete(a, prompt, N)
        if first.has_mtp:
            assert done["timings"]["draft_n"] > 0
        r = a.post("/slots/0?action=save", json={"filename": "chat.bin"})
        assert r.status_code == 200, r.text
        saved = r.json()
        assert saved["id_slot"] == 0 and saved["filename"] == "chat.bin"
        assert saved["n_saved"] == len(prompt) + N - 1 and saved["n_written"] > 0 and "save_ms" in saved["timings"]
        reference = complete(a, prompt + generated, M)

        r = b.post("/slots/0?action=restore", json={"filename": "chat.bin"})
        assert r.status_code == 200, r.text
        restored = r.json()
        assert restored["n_restored"] == saved["n_saved"] and restored["n_read"] == saved["n_written"]
        assert "restore_ms" in restored["timings"]
        again = complete(b, prompt + generated, M)
    assert again["choices"][0]["text"] == reference["choices"][0]["text"]
    assert again["timings"]["cache_n"] == saved["n_saved"]  # the restored KV was used, not decoded again
    if second.has_mtp:
        assert again["timings"]["draft_n"] > 0


def test_erase_empties_the_slot(first: Server, tokens: Any) -> None:
    prompt, _ = tokens
    with first.client() as c:
        complete(c, prompt, 4)
        r = c.post("/slots/0?action=erase")
        assert r.status_code == 200, r.text
        assert r.json() == {"id_slot": 0, "n_erased": len(prompt) + 3}
        assert complete(c, prompt, 4)["timings"]["cache_n"] == 0


@pytest.mark.parametrize("name", ["../escape.bin", "sub/file.bin", "..", ".", "a\\b", "", "x" * 256, "trailing.",
                                  " lead", "a:b", "bad\x01name", "dot\uff0e\uff0eslash"])
def test_a_filename_that_could_leave_the_folder_is_refused(first: Server, folder: Path, name: str) -> None:
    with first.client() as c:
        r = c.post("/slots/0?action=save", json={"filename": name})
    assert r.status_code == 400 and r.json()["error"]["message"] == "Invalid filename", r.text
    assert not (folder.parent / "escape.bin").exists()


@pytest.mark.parametrize("url, body, message", [
    ("/slots/0?action=fly", {"filename": "x"}, "Invalid action"),
    ("/slots/7?action=save", {"filename": "x"}, "Invalid slot ID"),
    ("/slots/abc?action=save", {"filename": "x"}, "Invalid slot ID"),
    ("/slots/0?action=save", {}, "filename: required"),
    ("/slots/0?action=restore", {"filename": "never-saved.bin"}, "no saved slot"),
])
def test_bad_slot_actions_are_a_400(first: Server, url: str, body: dict[str, Any], message: str) -> None:
    with first.client() as c:
        r = c.post(url, json=body)
    assert r.status_code == 400 and message in r.json()["error"]["message"], r.text


def test_restoring_a_file_that_is_not_a_state_is_a_400(first: Server, folder: Path) -> None:
    (folder / "junk.bin").write_bytes(b"junk" * 64)
    with first.client() as c:
        r = c.post("/slots/0?action=restore", json={"filename": "junk.bin"})
    assert r.status_code == 400 and "invalid slot save file" in r.json()["error"]["message"], r.text


def test_slot_actions_need_slot_save_path(tmp_path: Path) -> None:
    with running_server(["-c", "512"], tmp_path) as s, s.client() as c:
        r = c.post("/slots/0?action=save", json={"filename": "x.bin"})
    assert r.status_code == 501 and "--slot-save-path" in r.json()["error"]["message"]


def test_a_slot_busy_with_a_request_is_saved_once_the_request_is_done(first: Server, tokens: Any) -> None:
    import json
    import threading

    prompt, _ = tokens
    saved: dict[str, Any] = {}
    body = {"prompt": prompt, "max_tokens": 200, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}}
    with first.client() as c, first.client() as d, c.stream("POST", "/v1/completions", json=body) as r:
        lines = r.iter_lines()
        next(line for line in lines if line.startswith("data: "))  # the slot is generating now
        t = threading.Thread(target=lambda: saved.update(r=d.post("/slots/0?action=save",
                                                                   json={"filename": "busy.bin"})))
        t.start()
        chunks = [json.loads(line[6:]) for line in lines if line.startswith("data: {")]
        t.join(30)
    usage = next(ch["usage"] for ch in reversed(chunks) if ch.get("usage"))
    assert saved["r"].status_code == 200, saved["r"].text
    # the whole request's tokens: the save waited for it (mid-generation the slot records none)
    assert saved["r"].json()["n_saved"] == len(prompt) + usage["completion_tokens"] - 1
