"""Generations that overlap on one model: two streams zipped, a stream kept suspended while another
thread generates, a second generation asked of a context a stream owns.

The design under test (``Context.generation_claim``, ``Model.generation_context``): a generation
owns its context from its first token to its end; without ``context=`` the model lends each one an
idle or fresh context of its pool, so overlapping generations never wait on each other nor share KV;
with ``context=`` a busy context is refused at once with ``ContextBusyError`` -- never waited on.
"""

from __future__ import annotations

import itertools
import threading

import pytest

from mtp_bindings import ContextBusyError, Model

N = 24
PROMPTS = ("def parse(path):\n", "class Config:\n")
JOIN_TIMEOUT_S = 120  # a hang fails the test instead of hanging the run


@pytest.fixture(scope="module")
def model(trained_paths):
    target, assistant = trained_paths
    with Model(target, assistant=assistant) as m:
        yield m


@pytest.fixture(scope="module")
def alone(model) -> dict[str, str]:
    """What each prompt gives when nothing else runs (greedy: one answer)."""
    return {p: model.generate(p, max_tokens=N, temperature=0).text for p in PROMPTS}


def _in_thread(fn):
    """Run ``fn()`` in a thread; its result or exception, or a failure when it does not end in time."""
    out: list = []

    def run() -> None:
        try:
            out.append(("ok", fn()))
        except BaseException as e:  # noqa: BLE001 (handed back to the test)
            out.append(("error", e))

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(JOIN_TIMEOUT_S)
    if t.is_alive():
        pytest.fail(f"the other thread's generation did not end within {JOIN_TIMEOUT_S} s (it waits on the stream)")
    kind, value = out[0]
    if kind == "error":
        raise value
    return value


def test_two_zipped_streams_each_give_the_text_they_give_alone(model, alone):
    a, b = (model.generate(p, max_tokens=N, temperature=0, stream=True) for p in PROMPTS)
    got_a, got_b = [], []
    # zip_longest, not zip: zip drops the piece it took from a when b is exhausted (the streams yield their N
    # tokens in as many pieces as their rounds, which auto's draft counts decide)
    for piece_a, piece_b in itertools.zip_longest(a, b, fillvalue=""):
        got_a.append(piece_a)
        got_b.append(piece_b)
    assert "".join(got_a) == alone[PROMPTS[0]]
    assert "".join(got_b) == alone[PROMPTS[1]]


def test_a_second_generate_on_the_same_thread_leaves_an_open_stream_correct(model, alone):
    stream = model.generate(PROMPTS[0], max_tokens=N, temperature=0, stream=True)
    first = next(stream)
    assert model.generate(PROMPTS[1], max_tokens=N, temperature=0).text == alone[PROMPTS[1]]
    assert first + "".join(stream) == alone[PROMPTS[0]]


def test_a_suspended_stream_does_not_make_another_threads_generate_wait(model, alone):
    stream = model.generate(PROMPTS[0], max_tokens=N, temperature=0, stream=True)
    first = next(stream)  # read once, then kept suspended in a variable
    other = _in_thread(lambda: model.generate(PROMPTS[1], max_tokens=N, temperature=0).text)
    assert other == alone[PROMPTS[1]]
    assert first + "".join(stream) == alone[PROMPTS[0]]  # resumed afterwards: as if never interrupted


def test_a_stream_suspended_in_another_thread_does_not_block_this_one(model, alone):
    started = threading.Event()
    resume = threading.Event()
    texts: list[str] = []

    def reader() -> None:
        stream = model.generate(PROMPTS[0], max_tokens=N, temperature=0, stream=True)
        texts.append(next(stream))
        started.set()
        resume.wait(JOIN_TIMEOUT_S)
        texts.append("".join(stream))

    t = threading.Thread(target=reader, daemon=True)
    t.start()
    assert started.wait(JOIN_TIMEOUT_S)
    assert _in_thread(lambda: model.generate(PROMPTS[1], max_tokens=N, temperature=0).text) == alone[PROMPTS[1]]
    resume.set()
    t.join(JOIN_TIMEOUT_S)
    assert not t.is_alive()
    assert "".join(texts) == alone[PROMPTS[0]]


def test_a_context_a_stream_owns_refuses_a_second_generation_at_once(model, alone):
    with model.create_context(n_ctx=256, embeddings=True) as ctx:
        stream = model.generate(PROMPTS[0], max_tokens=N, temperature=0, stream=True, context=ctx)
        first = next(stream)
        with pytest.raises(ContextBusyError, match="another generation is using this context"):
            model.generate(PROMPTS[1], max_tokens=N, temperature=0, context=ctx)
        with pytest.raises(ContextBusyError):  # from another thread too: refused, not waited on
            _in_thread(lambda: model.generate(PROMPTS[1], max_tokens=4, temperature=0, context=ctx))
        assert first + "".join(stream) == alone[PROMPTS[0]]
        # the stream's end hands the context back: the next generation on it runs
        assert model.generate(PROMPTS[1], max_tokens=N, temperature=0, context=ctx).text == alone[PROMPTS[1]]


def test_zipping_two_streams_on_one_given_context_refuses_the_second(model):
    with model.create_context(n_ctx=256, embeddings=True) as ctx:
        a, b = (model.generate(p, max_tokens=N, temperature=0, stream=True, context=ctx) for p in PROMPTS)
        with pytest.raises(ContextBusyError):
            list(zip(a, b))
        a.close()


def test_a_closed_stream_hands_its_context_back(model):
    with model.create_context(n_ctx=256, embeddings=True) as ctx:
        stream = model.generate(PROMPTS[0], max_tokens=N, temperature=0, stream=True, context=ctx)
        next(stream)
        assert ctx.busy
        stream.close()
        assert not ctx.busy


def test_the_model_keeps_at_most_two_idle_generation_contexts(model):
    from mtp_bindings.llama_model import GENERATION_POOL_IDLE

    streams = [model.generate(p, max_tokens=4, temperature=0, stream=True) for p in PROMPTS * 2]
    for s in streams:
        next(s)
    for s in streams:
        s.close()
    assert len(model._idle) == GENERATION_POOL_IDLE


def test_threads_sharing_one_given_context_for_whole_generations_take_turns(model, alone):
    """A whole (non-stream) generation runs to its end, so another thread's waits for it, in turn."""
    with model.create_context(n_ctx=256, embeddings=True) as ctx:
        results: list[tuple[str, str]] = []
        errors: list[BaseException] = []

        def work(p: str) -> None:
            try:
                for _ in range(3):
                    results.append((p, model.generate(p, max_tokens=N, temperature=0, context=ctx).text))
            except BaseException as e:  # noqa: BLE001
                errors.append(e)

        threads = [threading.Thread(target=work, args=(p,), daemon=True) for p in PROMPTS]
        for t in threads:
            t.start()
        for t in threads:
            t.join(JOIN_TIMEOUT_S)
        assert not any(t.is_alive() for t in threads) and not errors
        assert sorted(results) == sorted((p, alone[p]) for p in PROMPTS for _ in range(3))


def test_decoding_or_clearing_a_context_a_suspended_stream_owns_is_refused(model, alone):
    with model.create_context(n_ctx=256, embeddings=True) as ctx:
        stream = model.generate(PROMPTS[0], max_tokens=N, temperature=0, stream=True, context=ctx)
        first = next(stream)
        with pytest.raises(ContextBusyError, match="would corrupt it"):
            ctx.clear()
        with pytest.raises(ContextBusyError, match="would corrupt it"):
            ctx.decode(model.tokenize("x", add_special=False))
        assert first + "".join(stream) == alone[PROMPTS[0]]  # untouched
        ctx.clear()  # the stream ended: the context is the caller's again
