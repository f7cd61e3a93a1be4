"""Generation survives a shared CPU: two generating processes at once each stay within a generous
bound of their own solo time (with spinning thread waits they ran 30-700x slower), and the threading
defaults (thread budget, OpenMP spin count) behave as documented.

The real target (<= 3x) is measured by ``bench/shared_cpu.py``; this test catches a collapse."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time

import pytest

from mtp_bindings.config import threads

# subprocesses start outside the checkout, so they import the installed package, not the source tree
NEUTRAL_CWD = tempfile.gettempdir()
BOUND = 10.0  # x the process's own solo time
GENERATIONS, TOKENS = 3, 64

# A process that loads the bundled pair, then on each "run" line from stdin generates and answers
# with the seconds it took; processes wait idle (blocked on stdin) while another runs alone.
WORKER = r"""
import sys, time
from mtp_bindings import Model
from mtp_bindings.models import ASSISTANT as DEFAULT_ASSISTANT, TARGET as DEFAULT_TARGET
draft, generations, tokens = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
with Model(DEFAULT_TARGET, assistant=DEFAULT_ASSISTANT) as model, \
        model.create_context(n_ctx=512, embeddings=True) as ctx:
    def run():
        t0 = time.perf_counter()
        for i in range(generations):
            model.generate(f"def f{i}(x):\n", context=ctx, max_tokens=tokens, draft_n_max=draft, ignore_eos=True)
        return time.perf_counter() - t0
    run()  # warm-up
    print("ready", flush=True)
    for line in sys.stdin:
        print(f"{run():.6f}", flush=True)
"""


class Worker:
    def __init__(self, draft: int) -> None:
        env = {k: v for k, v in os.environ.items() if k not in threads.OPENMP_CHOICE_VARS}
        self.proc = subprocess.Popen([sys.executable, "-c", WORKER, str(draft), str(GENERATIONS), str(TOKENS)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env,
                                     cwd=NEUTRAL_CWD)
        assert self.proc.stdout.readline().strip() == "ready"

    def start(self) -> None:
        self.proc.stdin.write("run\n")
        self.proc.stdin.flush()

    def seconds(self) -> float:
        return float(self.proc.stdout.readline())

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait()


@pytest.mark.slow
@pytest.mark.parametrize("draft", [0, 2], ids=["plain", "mtp"])
def test_two_generating_processes_stay_near_their_solo_time(draft):
    workers = [Worker(draft), Worker(draft)]
    try:
        solo = []
        for w in workers:  # each alone (the other one idle)
            w.start()
            solo.append(w.seconds())
        t0 = time.perf_counter()
        for w in workers:
            w.start()
        together = [w.seconds() for w in workers]
        wall = time.perf_counter() - t0
    finally:
        for w in workers:
            w.close()
    report = json.dumps({"solo_s": solo, "together_s": together, "wall_s": wall})
    for alone, both in zip(solo, together):
        assert both <= BOUND * alone, f"generation collapsed on a shared CPU: {report}"


def test_a_process_allowed_one_cpu_computes_with_one_thread_by_default(trained_paths):
    code = ("import os, sys\n"
            "os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})\n"
            "from mtp_bindings import Model\n"
            "from mtp_bindings.low_level import lib\n"
            "with Model(sys.argv[1]) as m, m.create_context(n_ctx=64) as ctx:\n"
            "    print(lib.llama_n_threads(ctx.ptr))\n")
    out = subprocess.run([sys.executable, "-c", code, str(trained_paths[0])], capture_output=True, text=True,
                         check=True, cwd=NEUTRAL_CWD)
    assert out.stdout.strip() == "1"


def test_a_thread_budget_splits_across_slots():
    assert threads.threads_per_slot(1, 8) == 8
    assert threads.threads_per_slot(2, 8) == 4
    assert threads.threads_per_slot(3, 8) == 2
    assert threads.threads_per_slot(4, 2) == 1


def test_cgroup_v2_quota_limits_the_cpus(tmp_path):
    (tmp_path / "cpu.max").write_text("150000 100000\n")
    assert threads.cgroup_cpu_limit(tmp_path) == 1.5
    (tmp_path / "cpu.max").write_text("max 100000\n")
    assert threads.cgroup_cpu_limit(tmp_path) is None


def test_cgroup_v1_quota_limits_the_cpus(tmp_path):
    (tmp_path / "cpu").mkdir()
    (tmp_path / "cpu" / "cpu.cfs_quota_us").write_text("50000\n")
    (tmp_path / "cpu" / "cpu.cfs_period_us").write_text("100000\n")
    assert threads.cgroup_cpu_limit(tmp_path) == 0.5
    (tmp_path / "cpu" / "cpu.cfs_quota_us").write_text("-1\n")
    assert threads.cgroup_cpu_limit(tmp_path) is None


def test_openmp_default_applies_only_while_loading_and_never_over_a_user_choice():
    env: dict[str, str] = {}
    with threads.openmp_defaults(env) as applied:
        if not threads.libgomp_loaded():
            assert env == {"GOMP_SPINCOUNT": str(threads.OPENMP_SPIN_COUNT)} == applied
    assert env == {}
    env = {"OMP_WAIT_POLICY": "active"}
    with threads.openmp_defaults(env) as applied:
        assert env == {"OMP_WAIT_POLICY": "active"} and applied == {}
    assert env == {"OMP_WAIT_POLICY": "active"}


def test_loading_the_package_leaves_the_environment_as_it_was():
    code = "import os, mtp_bindings.native._native; print(os.environ.get('GOMP_SPINCOUNT'))"
    env = {k: v for k, v in os.environ.items() if k not in threads.OPENMP_CHOICE_VARS}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True,
                         cwd=NEUTRAL_CWD)
    assert out.stdout.strip() == "None"


def test_more_threads_than_usable_cpus_warn_once(caplog):
    too_many = threads.usable_cpus() + 1
    threads._warned.discard(f"threads:{too_many}")
    with caplog.at_level("WARNING", logger="mtp_bindings"):
        threads.check_threads(too_many)
        threads.check_threads(too_many)
    assert len([r for r in caplog.records if "threads requested" in r.getMessage()]) == 1


def test_server_slots_share_the_thread_budget(trained_paths):
    from mtp_bindings import Model
    from mtp_bindings.server import create_app

    with Model(trained_paths[0]) as model:
        app = create_app(model, model_name="m", n_slots=2, n_threads=4)
        assert app.state.server.pool.context_kwargs["n_threads"] == 2
        app = create_app(model, model_name="m", n_slots=3)
        assert app.state.server.pool.context_kwargs["n_threads"] == max(1, threads.default_threads() // 3)


def test_logits_do_not_depend_on_the_thread_count(trained_paths):
    from mtp_bindings import Model

    with Model(trained_paths[0]) as model:
        toks = model.tokenize("def parse_args(argv):\n    x = 1\n")
        rows = []
        for n in (1, 2):
            with model.create_context(n_ctx=256, n_threads=n) as ctx:
                ctx.decode(toks, pos=0, logits="all")
                rows.append([ctx.logits_view(i).copy() for i in range(len(toks))])
    assert all((a == b).all() for a, b in zip(*rows))


def test_one_token_decodes_past_512_cells_do_not_depend_on_the_thread_count(trained_paths):
    # one query row over >= 512 KV cells takes flash attention's split-KV path (patch 0108: a fixed
    # number of chunks, not one per thread), the path of every generated token in a long context
    import numpy as np

    from mtp_bindings import Model

    toks = [int(t) for t in np.random.default_rng(1).integers(10, 1000, 601)]
    with Model(trained_paths[0]) as model:
        rows = []
        for n in (1, 2, 3):
            with model.create_context(n_ctx=1024, n_threads=n, flash_attn="on") as ctx:
                ctx.decode(toks[:600], pos=0, logits="none")
                ctx.decode(toks[600:], pos=600)
                rows.append(ctx.logits_view(-1).copy())
    assert (rows[0] == rows[1]).all() and (rows[1] == rows[2]).all()


def test_free_cpus_decide_the_thread_count():
    assert threads.threads_for_load(2, 0, 2, 2) == 2   # alone
    assert threads.threads_for_load(2, 1, 2, 2) == 1   # beside a busy loop
    assert threads.threads_for_load(2, 2, 2, 2) == 1   # beside another 2-thread generation
    assert threads.threads_for_load(8, 1, 8, 8) == 7
    assert threads.threads_for_load(4, 30, 4, 64) == 2  # a container on a busy 64-CPU host


def test_runnable_threads_come_from_loadavg(tmp_path):
    (tmp_path / "loadavg").write_text("0.52 0.58 0.59 3/467 12345\n")
    assert threads.runnable_threads(tmp_path / "loadavg") == 3
    assert threads.runnable_threads(tmp_path / "missing") is None


def test_a_default_context_gives_way_to_busy_cpus_and_an_explicit_one_does_not(trained_paths):
    from mtp_bindings import Model

    cpus = threads.usable_cpus()
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(cpus)]
    try:
        time.sleep(0.3)
        with Model(trained_paths[0]) as model, model.create_context(n_ctx=256) as auto, \
                model.create_context(n_ctx=256, n_threads=cpus) as explicit:
            for ctx in (auto, explicit):
                model.generate("def f(x):\n", context=ctx, max_tokens=8, draft_n_max=0, temperature=0)
            assert auto.n_threads == 1
            assert explicit.n_threads == cpus
    finally:
        for p in busy:
            p.kill()
            p.wait()


def test_short_decodes_run_on_the_thread_count_they_were_faster_on_and_an_explicit_count_is_kept(trained_paths):
    from mtp_bindings import Model

    with Model(trained_paths[0]) as model, model.create_context(n_ctx=256) as auto, \
            model.create_context(n_ctx=256, n_threads=2) as explicit:
        for ctx in (auto, explicit):
            model.generate("def f(x):\n", context=ctx, max_tokens=2 * threads.THREAD_SAMPLES + 4, draft_n_max=0,
                           temperature=0, ignore_eos=True)
        if auto.n_threads > 1:  # a busy machine may have left the default context one thread to start with
            one = auto._few_rows.one
            assert one is not None, "both thread counts were timed on a model whose decode takes microseconds"
            assert auto.decode_threads == (1 if one else auto.n_threads)
        assert explicit.decode_threads == 2
