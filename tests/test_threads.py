"""Threads: contexts on one shared model run in parallel and give the serial outputs; threads
sharing one context are serialized by the context's lock (documented), never corrupted."""

from __future__ import annotations

import threading

from mtp_bindings import Model

PROMPTS = ["def main(argv):\n", "import os\nimport sys\n", "class Queue:\n", "for i in range(10):\n"]


def test_threads_with_their_own_contexts_reproduce_the_serial_outputs(dense_target_path):
    with Model(dense_target_path) as model:
        serial = []
        for p in PROMPTS:
            with model.create_context(n_ctx=128, n_threads=1) as ctx:
                serial.append(model.generate(p, max_tokens=24, draft_n_max=0, context=ctx, temperature=0).tokens)
        results: dict[int, list[int]] = {}
        errors: list[BaseException] = []

        def work(i: int) -> None:
            try:
                with model.create_context(n_ctx=128, n_threads=1) as ctx:
                    for _ in range(3):
                        results[i] = model.generate(PROMPTS[i], max_tokens=24, draft_n_max=0, context=ctx, temperature=0).tokens
            except BaseException as e:  # surfaced below
                errors.append(e)

        threads = [threading.Thread(target=work, args=(i,)) for i in range(len(PROMPTS))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
        assert not errors
        assert [results[i] for i in range(len(PROMPTS))] == serial


def test_threads_sharing_one_context_are_serialized(dense_target_path):
    with Model(dense_target_path) as model, model.create_context(n_ctx=128) as ctx:
        want = {p: model.generate(p, max_tokens=16, draft_n_max=0, context=ctx, temperature=0).tokens for p in PROMPTS}
        got: list[tuple[str, list[int]]] = []
        errors: list[BaseException] = []

        def work(p: str) -> None:
            try:
                for _ in range(3):
                    got.append((p, model.generate(p, max_tokens=16, draft_n_max=0, context=ctx, temperature=0).tokens))
            except BaseException as e:
                errors.append(e)

        threads = [threading.Thread(target=work, args=(p,)) for p in PROMPTS]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
        assert not errors
        assert len(got) == 3 * len(PROMPTS)
        assert all(toks == want[p] for p, toks in got)
