"""The portable binary wheel (``make wheel``) installs and runs with no compiler, on any x86-64 CPU.

Uses the repaired wheel in ``dist/`` (or ``MTP_WHEEL=path``); skipped when there is none, because
building it takes ~20 minutes on 2 cores (``make wheel``, then ``make wheel-test``). Once per
session it creates a fresh virtual environment (``MTP_WHEEL_PYTHON`` picks its interpreter, e.g. a
3.10 or a 3.13 to try the abi3 tag), downloads the wheel's dependencies into a wheelhouse cached in
``build/wheel-test/`` and installs from there with ``pip install --no-index --only-binary :all:``,
``CC``/``CXX`` set to ``false`` and compilers shadowed on ``PATH`` by ``false``. Everything in the
venv runs from a directory outside the repository with a clean environment, so the installed
package is the one imported.

Which CPU variants this CPU can run is decided here independently of the library: each
``libggml-cpu-<variant>.so`` is loaded with ctypes in a bare subprocess and its
``ggml_backend_score()`` called (> 0: runnable).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
import time
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DIST = ROOT / "dist"
CACHE = ROOT / "build" / "wheel-test"
# every x86-64 variant ggml builds with GGML_CPU_ALL_VARIANTS (ggml/src/CMakeLists.txt)
VARIANTS = ("x64", "sse42", "sandybridge", "ivybridge", "piledriver", "haswell", "skylakex", "cannonlake",
            "cascadelake", "icelake", "cooperlake", "zen4", "alderlake", "sapphirerapids")
# the tests of the generated fixtures: our outputs against the Hugging Face references that
# tools/make_fixtures.py stored with them, and the scaled pair generated from the bundled one (with the
# wheel's own gguf-py and quantizer)
FIXTURE_TESTS = ("tests/test_hf_reference.py", "tests/test_scale_pair.py")
COMPILERS = ("cc", "gcc", "c++", "g++", "clang", "clang++", "cmake", "ninja", "make")
PROMPT = "def fibonacci(n):\n"
N_TOKENS = 48


def _find_wheel() -> Path | None:
    if env := os.environ.get("MTP_WHEEL"):
        return Path(env).resolve()
    wheels = sorted(DIST.glob("mtp_bindings-*manylinux*.whl"), key=lambda p: p.stat().st_mtime)
    return wheels[-1] if wheels else None


WHEEL = _find_wheel()
pytestmark = pytest.mark.skipif(
    WHEEL is None or not WHEEL.is_file(),
    reason=f"no portable wheel in {DIST} (nor MTP_WHEEL): run `make wheel` first (~20 min on 2 cores), "
           "then `make wheel-test`")


def _members() -> list[str]:
    assert WHEEL is not None
    with zipfile.ZipFile(WHEEL) as zf:
        return zf.namelist()


def _requirements() -> list[str]:
    """The wheel's own dependencies (Requires-Dist without an extra), from its METADATA."""
    assert WHEEL is not None
    with zipfile.ZipFile(WHEEL) as zf:
        meta = next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
        lines = zf.read(meta).decode().splitlines()
    return [line.split(":", 1)[1].strip() for line in lines
            if line.startswith("Requires-Dist:") and "extra ==" not in line]


class Venv:
    """A fresh venv with the wheel installed, and how to run things in it."""

    def __init__(self, root: Path, workdir: Path) -> None:
        self.root = root
        self.python = root / "bin" / "python"
        self.workdir = workdir  # outside the repository
        self.no_compilers = root / "no-compilers"
        self.install_log = ""

    def env(self, **extra: str) -> dict[str, str]:
        """A clean environment: no PYTHONPATH, no pip configuration, compilers that fail."""
        env = {"PATH": os.pathsep.join([str(self.root / "bin"), str(self.no_compilers), "/usr/bin", "/bin"]),
               "HOME": os.environ.get("HOME", str(self.workdir)), "LANG": "C.UTF-8",
               "TMPDIR": os.environ.get("TMPDIR", "/tmp"), "PYTHONNOUSERSITE": "1", "PIP_CONFIG_FILE": os.devnull,
               "PIP_DISABLE_PIP_VERSION_CHECK": "1", "CC": "false", "CXX": "false", "GGML_NO_BACKTRACE": "1"}
        env.update(extra)
        return env

    def run(self, *args: str, timeout: float = 600, **env: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(self.python), *args], cwd=self.workdir, env=self.env(**env), capture_output=True,
                              text=True, timeout=timeout)

    def run_json(self, code: str, **env: str) -> dict:
        out = self.run("-c", textwrap.dedent(code), **env)
        assert out.returncode == 0, out.stderr[-3000:]
        return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def venv(tmp_path_factory: pytest.TempPathFactory) -> Venv:
    assert WHEEL is not None
    base = os.environ.get("MTP_WHEEL_PYTHON", sys.executable)
    root = tmp_path_factory.mktemp("wheel-venv")
    v = Venv(root / "venv", tmp_path_factory.mktemp("outside-repo"))
    subprocess.run([base, "-m", "venv", str(v.root)], check=True, timeout=300)
    v.no_compilers.mkdir()
    for name in COMPILERS:
        shim = v.no_compilers / name
        shim.write_text("#!/bin/sh\necho \"$0: no compiler in this test\" >&2\nexit 1\n")
        shim.chmod(0o755)
    # the dependencies come from the registry once (cached across sessions); the install is offline
    tag = subprocess.run([str(v.python), "-c", "import sys; print(f'cp{sys.version_info[0]}{sys.version_info[1]}')"],
                         capture_output=True, text=True, check=True).stdout.strip()
    wheelhouse = CACHE / f"wheelhouse-{tag}"
    wheelhouse.mkdir(parents=True, exist_ok=True)
    subprocess.run([str(v.python), "-m", "pip", "download", "-q", "--only-binary", ":all:", "-d", str(wheelhouse),
                    *_requirements(), "pytest"], check=True, cwd=v.workdir, timeout=900,
                   env={k: val for k, val in os.environ.items() if k != "PYTHONPATH"})
    out = v.run("-m", "pip", "install", "--no-index", "--only-binary", ":all:", "--find-links", str(wheelhouse),
                str(WHEEL), "pytest", timeout=900)
    v.install_log = out.stdout + out.stderr
    assert out.returncode == 0, v.install_log[-3000:]
    return v


@pytest.fixture(scope="module")
def scores(venv: Venv) -> dict[str, int]:
    """``{variant: ggml_backend_score()}`` of every variant module in the installed wheel, each
    scored in a bare interpreter with ctypes (not through the library)."""
    out = venv.run_json("""
        import ctypes, glob, json, os, re, sysconfig
        lib = os.path.join(sysconfig.get_paths()["platlib"], "mtp_bindings", "lib")
        scores = {}
        for path in sorted(glob.glob(os.path.join(lib, "libggml-cpu-*.so"))):
            fn = ctypes.CDLL(path, mode=ctypes.RTLD_LOCAL).ggml_backend_score
            fn.restype = ctypes.c_int
            scores[re.match(r"libggml-cpu-(\\w+)\\.so", os.path.basename(path)).group(1)] = fn()
        print(json.dumps(scores))
    """)
    assert out, "the installed wheel has no CPU variant modules"
    return out


GENERATE = f"""
    import json
    from mtp_bindings import Model, low_level
    from mtp_bindings.models import ASSISTANT, TARGET
    with Model(TARGET, assistant=ASSISTANT) as model:
        common = dict(max_tokens={N_TOKENS}, temperature=0.0, ignore_eos=True, cache_prompt=False)
        mtp = model.generate({PROMPT!r}, draft_n_max=3, **common)
        plain = model.generate({PROMPT!r}, draft_n_max=0, **common)
    print(json.dumps({{"variant": low_level.cpu_variant(), "mtp": mtp.tokens, "plain": plain.tokens,
                      "accepted": mtp.stats.acceptance_rate}}))
"""


@pytest.fixture(scope="module")
def generations(venv: Venv, scores: dict[str, int]) -> dict[str, dict]:
    """The greedy generation of each runnable variant, forced with MTP_BINDINGS_CPU_VARIANT."""
    return {v: venv.run_json(GENERATE, MTP_BINDINGS_CPU_VARIANT=v) for v, s in scores.items() if s > 0}


# --- what the wheel is ------------------------------------------------------------------------------

def test_wheel_is_one_abi3_manylinux_wheel_for_cpython_3_10_and_later():
    assert WHEEL is not None
    tags = WHEEL.name[:-len(".whl")].split("-")[-3:]
    assert tags[:2] == ["cp310", "abi3"], WHEEL.name
    assert "manylinux" in tags[2] and tags[2].endswith("x86_64"), WHEEL.name


def test_cffi_module_is_built_for_the_stable_abi():
    assert "mtp_bindings/_ffi.abi3.so" in _members()


def test_wheel_holds_every_x86_64_cpu_variant():
    names = set(_members())
    missing = [v for v in VARIANTS if f"mtp_bindings/lib/libggml-cpu-{v}.so" not in names]
    assert not missing
    assert "mtp_bindings/lib/libggml-cpu.so" not in names  # no native (this machine's) CPU backend


def test_wheel_has_rpc_server_and_not_llama_server():
    names = set(_members())
    assert "mtp_bindings/bin/rpc-server" in names
    assert "mtp_bindings/bin/llama-server" not in names


# --- installing it ------------------------------------------------------------------------------------

def test_wheel_installs_offline_without_building_anything(venv: Venv):
    assert "Building wheel" not in venv.install_log and "setup.py" not in venv.install_log
    out = venv.run("-c", "import mtp_bindings, sys; print(mtp_bindings.__file__)")
    assert out.returncode == 0, out.stderr
    assert Path(out.stdout.strip()).is_relative_to(venv.root), out.stdout


def test_fixture_tests_pass_from_the_installed_wheel(venv: Venv):
    out = venv.run("-m", "pytest", "-q", "-p", "no:cacheprovider", *(str(ROOT / t) for t in FIXTURE_TESTS),
                   timeout=1200)
    assert out.returncode == 0, (out.stdout + out.stderr)[-4000:]
    assert " passed" in out.stdout and " skipped" not in out.stdout, out.stdout[-2000:]


# --- the CPU variants ---------------------------------------------------------------------------------

@pytest.mark.parametrize("variant", VARIANTS)
def test_forced_variant_gives_the_same_greedy_tokens_with_and_without_mtp(variant, scores, generations):
    if scores.get(variant, 0) == 0:
        pytest.skip(f"this CPU cannot run the {variant} variant (ggml_backend_score() is 0)")
    got = generations[variant]
    assert got["variant"] == variant
    assert got["mtp"] == got["plain"]
    assert len(got["mtp"]) == N_TOKENS and got["accepted"] > 0


def test_every_runnable_variant_gives_the_same_greedy_tokens(generations):
    tokens = {v: tuple(g["plain"]) for v, g in generations.items()}
    assert len(set(tokens.values())) == 1, tokens


def test_default_pick_is_the_best_scoring_variant(venv: Venv, scores: dict[str, int]):
    got = venv.run_json("""
        import json
        from mtp_bindings import low_level
        print(json.dumps({"variant": low_level.cpu_variant()}))
    """)
    best = max(scores.values())
    assert best > 0
    assert scores[got["variant"]] == best, (got, scores)


def test_unknown_variant_is_a_typed_error(venv: Venv):
    out = venv.run("-c", "from mtp_bindings import low_level; low_level.ensure_initialised()",
                   MTP_BINDINGS_CPU_VARIANT="pentium2")
    assert out.returncode != 0
    assert "CPUVariantError" in out.stderr and "unknown CPU variant 'pentium2'" in out.stderr


def test_variant_this_cpu_cannot_run_is_a_typed_error(venv: Venv, scores: dict[str, int]):
    unrunnable = [v for v, s in scores.items() if s == 0]
    if not unrunnable:
        pytest.skip("this CPU runs every variant")
    out = venv.run("-c", "from mtp_bindings import low_level; low_level.ensure_initialised()",
                   MTP_BINDINGS_CPU_VARIANT=unrunnable[-1])
    assert out.returncode != 0
    assert "CPUVariantError" in out.stderr and "this CPU cannot run" in out.stderr


def test_a_threadpool_drafts_through_the_loaded_cpu_variant(venv: Venv):
    """The threadpool functions come from the CPU backend's registry (here a dynamically loaded variant
    module, which libllama does not link): a pool of 2 threads computes an asynchronous draft."""
    got = venv.run_json("""
        import json
        import numpy as np
        from mtp_bindings import Model
        from mtp_bindings.models import ASSISTANT, TARGET
        from mtp_bindings.mtp import graph_stats
        from mtp_bindings.native.threadpool import ThreadPool
        with ThreadPool(2) as pool, Model(TARGET, assistant=ASSISTANT) as m:
            ctx = m.create_context(n_ctx=128, n_threads=1, embeddings=True)
            ctx.decode([2, 100, 200, 300], pos=0)
            tok, h = int(np.argmax(ctx.get_logits(-1))), ctx.get_embeddings(-1)
            want, _ = ctx.decode_mtp(attn_pos=3, last_token=tok, h_prev=h, n_steps=3)
            ctx.attach_mtp_threadpool(pool)
            got, _ = ctx.decode_mtp_async(attn_pos=3, last_token=tok, h_prev=h, n_steps=3).wait()
            print(json.dumps({"threads": graph_stats(ctx)["n_threads_last"], "same": got.tolist() == want.tolist()}))
    """)
    assert got == {"threads": 2, "same": True}


# --- rpc-server ---------------------------------------------------------------------------------------

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_bundled_rpc_server_finds_its_backends_and_listens(venv: Venv):
    # rpc-server registers ggml's backends itself; in the wheel they are modules in lib/, beside libllama
    port = _free_port()
    proc = subprocess.Popen([str(venv.root / "bin" / "mtp-bindings"), "rpc-server", "-p", str(port)], cwd=venv.workdir,
                            env=venv.env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        listening = False
        while time.monotonic() < deadline and proc.poll() is None and not listening:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                listening = True
            except OSError:
                time.sleep(0.5)
        alive = proc.poll() is None
    finally:
        proc.terminate()
        out, err = proc.communicate(timeout=30)
    assert alive and listening, (out + err)[-2000:]
