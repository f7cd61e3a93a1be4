"""GPU placement and thread flags, llama.cpp's names and meaning (issue 16, item 2): ``-ngl``,
``-ngld``, ``--device``, ``-devd``, ``-fa``, ``-t``, ``-tb`` in ``generate``, ``chat`` and
``serve``; the assistant placed like the target unless told; and on this CPU-only build
``-ngl 99`` still works (llama.cpp ignores it without a GPU backend).
"""

from __future__ import annotations

import subprocess
from typing import Any

import pytest

from test_server import _model_files, _serve_command, running_server

FLAGS = ["-ngl", "99", "-ngld", "3", "--device", "none", "-devd", "none", "-fa", "on", "-t", "2", "-tb", "3"]


class _FakeModel:
    n_ctx_train = 4096
    has_assistant = True


def _parse(command: str, *flags: str) -> Any:
    from mtp_bindings.cli import build_parser

    extra = ["-p", "x"] if command == "generate" else []
    return build_parser().parse_args([command, *extra, *flags])


@pytest.mark.parametrize("command", ["generate", "chat", "serve"])
def test_placement_flags_reach_the_load_arguments(command: str) -> None:
    from mtp_bindings.cli.session import load_kwargs

    args = _parse(command, *FLAGS)
    assert load_kwargs(args) == dict(n_gpu_layers=99, devices="none", rpc_servers=None, use_mmap=True, verbose=False)
    assert (args.n_gpu_layers_draft, args.device_draft) == (3, "none")


@pytest.mark.parametrize("command", ["generate", "chat", "serve"])
def test_thread_and_flash_attention_flags_reach_the_context_arguments(command: str) -> None:
    from mtp_bindings.cli.session import context_kwargs

    kw = context_kwargs(_parse(command, *FLAGS), _FakeModel())
    assert (kw["n_threads"], kw["n_threads_batch"], kw["flash_attn"]) == (2, 3, "on")


def test_long_spellings_are_llama_cpp_s() -> None:
    args = _parse("generate", "--n-gpu-layers", "5", "--n-gpu-layers-draft", "1", "--threads-batch", "4",
                  "--flash-attn", "off")
    assert (args.n_gpu_layers, args.n_gpu_layers_draft, args.threads_batch, args.flash_attn) == (5, 1, 4, "off")


def test_flags_left_out_mean_the_defaults() -> None:
    from mtp_bindings.cli.session import context_kwargs, load_kwargs

    args = _parse("generate")
    assert load_kwargs(args)["n_gpu_layers"] == 0 and load_kwargs(args)["devices"] is None
    assert args.n_gpu_layers_draft is None and args.device_draft is None  # None: as the target
    kw = context_kwargs(args, _FakeModel())
    assert (kw["n_threads"], kw["n_threads_batch"], kw["flash_attn"]) == (None, None, "auto")


class _SpyLib:
    """The native library, recording the load parameters of the assistant."""

    def __init__(self, lib: Any) -> None:
        self._lib = lib
        self.n_gpu_layers: list[int] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._lib, name)

    def llama_model_load_mtp_from_file(self, model: Any, path: bytes, params: Any) -> int:
        self.n_gpu_layers.append(int(params.n_gpu_layers))
        return self._lib.llama_model_load_mtp_from_file(model, path, params)


@pytest.mark.parametrize("ngl,ngld,expected", [(99, None, 99), (0, None, 0), (99, 0, 0), (0, 7, 7)],
                         ids=["follows-99", "follows-0", "told-0", "told-7"])
def test_the_assistant_follows_the_target_placement_unless_told(monkeypatch: pytest.MonkeyPatch, ngl: int,
                                                                ngld: int | None, expected: int) -> None:
    import mtp_bindings.mtp as mtp
    from mtp_bindings import Model

    target, assistant = _model_files()
    if assistant is None or not hasattr(mtp.lib, "llama_model_load_mtp_from_file"):
        pytest.skip("this build cannot attach an assistant")
    spy = _SpyLib(mtp.lib)
    monkeypatch.setattr(mtp, "lib", spy)
    with Model(target, assistant=assistant, n_gpu_layers=ngl, n_gpu_layers_draft=ngld) as model:
        assert model.has_assistant
    assert spy.n_gpu_layers == [expected]


def test_ngl_99_and_device_none_are_accepted_without_a_gpu_and_leave_the_cpu_output() -> None:
    # What this can show on a CPU-only machine: the flags load (no error, no abort) and leave the CPU's
    # computation alone. Where layers go is the spy tests' above (the values reach llama_model_params);
    # placement itself needs a GPU build, which no test here has.
    from mtp_bindings import Model

    target, _ = _model_files()
    outs = []
    for load in ({}, {"n_gpu_layers": 99}, {"n_gpu_layers": 99, "devices": "none"}):
        with Model(target, **load) as model:
            outs.append(model.generate("def parse_args(argv):\n", max_tokens=8, temperature=0.0,
                                       draft_n_max=0).tokens)
    assert outs[0] == outs[1] == outs[2]


def test_an_unknown_device_is_refused_naming_the_flag_and_what_exists() -> None:
    target, _ = _model_files()
    out = subprocess.run(_serve_command() + ["generate", "-m", str(target), "--no-mtp", "-p", "x", "-n", "1",
                                             "--device", "NoSuchGPU0"], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 2, out.stderr
    line = out.stderr.strip().splitlines()[-1]
    assert "--device" in line and "NoSuchGPU0" in line and "available" in line, line


@pytest.mark.parametrize("flags", [["-ngl", "0", "-fa", "auto"],
                                   ["-ngl", "99", "-ngld", "99", "-fa", "off", "-t", "1", "-tb", "2"]],
                         ids=["ngl-0-fa-auto", "ngl-99-tb"])
def test_serve_with_placement_flags_starts_and_answers(tmp_path: Any, flags: list[str]) -> None:
    with running_server(["-c", "512", *flags], tmp_path) as server, server.client() as c:
        r = c.post("/v1/completions", json={"prompt": "def f(", "max_tokens": 4, "temperature": 0})
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["completion_tokens"] >= 1


@pytest.mark.parametrize("tb,expected", [(None, None), (4, 2), (1, 1)])
def test_serve_shares_the_prompt_threads_across_slots(tb: int | None, expected: int | None) -> None:
    from mtp_bindings.server import create_app

    app = create_app(_FakeModel(), model_name="m", n_slots=2, n_threads=2, n_threads_batch=tb)
    kw = app.state.server.pool.context_kwargs
    assert (kw["n_threads"], kw["n_threads_batch"]) == (1, expected)
