"""Resource errors: a context too large for memory, a file that shrinks during load, an
interrupted generation — each a clear error, with the process and other contexts unaffected."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from fixture_paths import PAIRS, fixture_path
from mtp_bindings import Model, ModelLoadError
from mtp_bindings.mtp import current_session


def test_context_too_large_for_memory_is_a_context_error_and_others_keep_working(tmp_path):
    code = textwrap.dedent(f"""
        import resource, sys
        resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))
        from mtp_bindings import Model, ContextError
        m = Model({str(fixture_path("dense-target.gguf"))!r})
        small = m.create_context(n_ctx=128)
        want = m.generate("x = 1", max_tokens=8, draft_n_max=0, context=small, temperature=0).tokens
        try:
            m.create_context(n_ctx=1 << 24, n_batch=4096, n_ubatch=4096)
        except ContextError as e:
            print("CONTEXT_ERROR", str(e)[:200])
        assert m.generate("x = 1", max_tokens=8, draft_n_max=0, context=small, temperature=0).tokens == want
        print("STILL_OK")
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "CONTEXT_ERROR failed to create a context" in out.stdout and "STILL_OK" in out.stdout


def test_file_truncated_during_load_is_a_model_load_error(tmp_path):
    src = fixture_path("dense-target.gguf").read_bytes()
    p = tmp_path / "shrinking.gguf"
    p.write_bytes(src)

    def shrink(progress: float) -> bool:
        if p.stat().st_size == len(src):
            with p.open("r+b") as f:
                f.truncate(len(src) // 3)
        return True

    with pytest.raises(ModelLoadError):
        Model(p, use_mmap=False, progress=shrink)


def test_symlink_loop_is_a_model_load_error(tmp_path):
    a, b = tmp_path / "a.gguf", tmp_path / "b.gguf"
    a.symlink_to(b)
    b.symlink_to(a)
    with pytest.raises(ModelLoadError):
        Model(a)


def test_keyboard_interrupt_mid_generation_leaves_the_context_reusable():
    target, assistant = PAIRS["dense"]
    with Model(fixture_path(target), assistant=fixture_path(assistant)) as m, \
            m.create_context(n_ctx=256, embeddings=True) as ctx:
        want = m.generate("def f(x):", max_tokens=30, draft_n_max=2, context=ctx, temperature=0).tokens
        calls = []

        def interrupt() -> bool:
            calls.append(1)
            if len(calls) == 4:
                raise KeyboardInterrupt
            return False

        with pytest.raises(KeyboardInterrupt):
            m.generate("import os\n", max_tokens=100, draft_n_max=2, context=ctx, cancel=interrupt, temperature=0)
        session = current_session(ctx)
        assert session is None or session.in_flight is None
        assert m.generate("def f(x):", max_tokens=30, draft_n_max=2, context=ctx, temperature=0).tokens == want


def test_a_failed_context_does_not_disturb_another_model_in_the_process():
    with Model(fixture_path("dense-target.gguf")) as a, Model(fixture_path("keqv-target.gguf")) as b:
        want = b.generate("x", max_tokens=6, draft_n_max=0, temperature=0).tokens
        from mtp_bindings import InvalidParameterError
        with pytest.raises(InvalidParameterError):
            a.create_context(n_ctx=-1)
        assert b.generate("x", max_tokens=6, draft_n_max=0, temperature=0).tokens == want
