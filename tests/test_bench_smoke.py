"""The benchmark (``mtp-bindings bench``) end to end, in its seconds-long smoke size.

Runs every part -- the matrix in process and over HTTP against the bundled upstream
``llama-server``, and the cost structure on tiny random-weight models -- on the dense test fixtures,
then checks that the JSON and markdown are written and sane. Speed is never asserted: only that
every system produced tokens at a positive rate and that at temperature 0 ours with MTP is ours plain
exactly and upstream agrees with it up to the near-tie rule (mtp_bindings.generation.agreement).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from fixture_paths import fixture_path

pytestmark = pytest.mark.slow


def _mtp_built() -> bool:
    from mtp_bindings.low_level import lib

    return hasattr(lib, "llama_decode_mtp_async")


@pytest.fixture(scope="module")
def smoke(tmp_path_factory: pytest.TempPathFactory) -> dict:
    from mtp_bindings import benchmark

    if not _mtp_built():
        pytest.skip("this build of libllama has no MTP patches")
    if not benchmark.llama_server_path().is_file():
        pytest.skip("the package was built without llama-server")
    out = tmp_path_factory.mktemp("bench")
    cfg = benchmark.config_for("smoke", target=fixture_path("dense-target.gguf"),
                               assistant=fixture_path("dense-assistant.gguf"), out_dir=out / "results",
                               cost_cache=out / "models")
    result = benchmark.run(cfg, command="pytest smoke")
    return {"result": result, "dir": out / "results"}


def test_files_written(smoke: dict) -> None:
    d: Path = smoke["dir"]
    data = json.loads((d / "bench.json").read_text())
    md = (d / "bench.md").read_text()
    assert data["config"]["mode"] == "smoke"
    assert "## In process" in md and "## End to end over HTTP" in md and "## Cost structure" in md
    assert "Identical output at temperature 0" in md
    assert not data["errors"], data["errors"]


def test_every_system_generated(smoke: dict) -> None:
    res = smoke["result"]
    for part in ("inproc", "http"):
        rows = res[part]["rows"]
        families = {r["family"] for r in rows}
        expected = {"upstream plain", "ours plain", "upstream draft-mtp", "ours MTP depth2 off", "ours MTP depth2 on"}
        assert families == expected, (part, families)
        for r in rows:
            assert r["tokens_per_s"] > 0 and math.isfinite(r["tokens_per_s"]), (part, r)
            if r["family"] != "upstream plain" and r["family"] != "ours plain":
                assert r["acceptance"] is not None and 0.0 <= r["acceptance"] <= 1.0, (part, r)
    for s in res["samples"]:
        if s["run"] >= 0:
            assert s["n_generated"] == res["config"]["outputs"][0], s


def test_ours_with_mtp_is_ours_plain_exactly_at_temperature_zero(smoke: dict) -> None:
    res = smoke["result"]
    checks = res["inproc"]["identity"] + res["http"]["identity"]
    assert checks
    for c in checks:
        assert c["compared"] >= 5
        assert c["reference"].startswith("ours plain")
        # one model, one build: batch-invariant verify rows, so no parting at all
        assert not [m for m in c["mismatches"] if m["system"].startswith("ours")], c


def test_upstream_agrees_with_ours_up_to_the_near_tie_rule(smoke: dict) -> None:
    # upstream decodes the prompt in another batch split: it may part at a near-tie, judged in process
    for c in smoke["result"]["inproc"]["identity"]:
        assert c["agrees"], c
        for m in c["mismatches"]:
            assert m["parting"]["near_tie"] and m["parting"]["at"] == m["first_difference"], m
    # over HTTP only text is compared (no rows to judge by): a system may differ there only where its
    # in-process output (the same server, the same request) parted at a near-tie
    judged = {(c["kv"], c["n_out"], m["system"]) for c in smoke["result"]["inproc"]["identity"]
              for m in c["mismatches"] if m["parting"]["near_tie"]}
    for c in smoke["result"]["http"]["identity"]:
        for m in c["mismatches"]:
            assert (c["kv"], c["n_out"], m["system"]) in judged, (c, m)


def test_cost_and_driver_sane(smoke: dict) -> None:
    res = smoke["result"]
    cost = res["cost"]
    for kind in ("dense", "dense no-repack", "centroid no-repack"):
        ms = cost["draft_ours"][kind]["ms"]
        assert all(v > 0 for v in ms.values()), ms
    assert cost["verify"]["ratio_to_1"]["1"] == pytest.approx(1.0)
    assert cost["bytes_per_draft_step"]["ours"] == 4 + 4 * cost["shape"]["hidden"]
    assert cost["pp_ours"]["tokens_per_s"]["with assistant"] > 0
    assert cost["memory_ours"].get("rss_after_draft_mib", 0) > 0, cost["memory_ours"]
    assert cost["upstream"]["draft"], cost["upstream"]
    rows = res["driver"]["rows"]
    assert rows and all(r["driver_us_per_round"] > 0 for r in rows)
    assert res["targets"]
    assert res["speedup"]["rows"]


def test_a_parting_from_ours_plain_is_judged_on_the_row_ours_plain_chose_from(trained_paths) -> None:
    import numpy as np

    from mtp_bindings import Model
    from mtp_bindings.benchmark.matrix import NEAR_TIE_TOL, MatrixRunner
    from mtp_bindings.benchmark.samples import Sample, identity_check
    from mtp_bindings.generation.agreement import forced_rows
    from numerics import TOL

    assert NEAR_TIE_TOL == TOL["prompt_batch"].value  # one tolerance, its basis in tests/numerics.py

    def sample(system: str, family: str, tokens: list[int]) -> Sample:
        return Sample("inproc", system, family, 0, "KV f16", len(tokens), 0.0, 0, 1.0, len(tokens), 0, 0,
                      tokens=tokens)

    with Model(trained_paths[0]) as m, m.create_context(n_ctx=256) as ctx:
        prompt = m.tokenize("def parse_args(argv):\n")
        plain = m.generate(prompt, max_tokens=12, context=ctx, draft_n_max=0, temperature=0).tokens
        runner = MatrixRunner.__new__(MatrixRunner)  # only its samples: no servers, no configuration
        want = forced_rows(ctx, prompt, plain)
        second = int(np.argsort(-want[5])[1])  # the runner-up at token 5: a parting there
        other = plain[:5] + [second] + plain[6:]
        runner.samples = [sample("ours plain", "ours plain", plain), sample("upstream plain", "upstream plain", other),
                          sample("ours MTP", "ours MTP depth2 off", list(plain))]
        runner._judge_partings(ctx, prompt, {}, "KV f16")
    verdict = runner.samples[1].extra["parting"]
    gap = float(want[5][plain[5]] - want[5][second])
    assert verdict["at"] == 5 and verdict["gap"] == gap and verdict["near_tie"] == (gap <= 2 * NEAR_TIE_TOL)
    assert "parting" not in runner.samples[2].extra  # identical: nothing to judge
    (check,) = identity_check(runner.samples)
    assert not check["identical"] and check["agrees"] == verdict["near_tie"]
    assert check["mismatches"][0]["parting"] == verdict


def test_the_host_work_bench_reports_every_setting_and_leaves_the_environment_as_it_was(tmp_path, monkeypatch) -> None:
    import importlib.util
    import os

    from mtp_bindings.config.env import ENV_GRAPH_GREEDY

    monkeypatch.delenv(ENV_GRAPH_GREEDY, raising=False)
    spec = importlib.util.spec_from_file_location("host_work", Path(__file__).parent.parent / "bench" / "host_work.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    out = tmp_path / "hw.json"
    assert bench.main(["--pairs", "tiny", "--tokens", "24", "--repeats", "1", "--out", str(out)]) == 0
    cells = json.loads(out.read_text())["pairs"]["tiny"]
    assert list(cells) == [f"{name} | {k}" for name, *_ in bench.SETTINGS for k in bench.DRAFTS]
    assert all(c["rounds"] > 0 and c["sample_us"] > 0 and c["tokens_per_s"] > 0 for c in cells.values()), cells
    assert (tmp_path / "hw.md").read_text().count("\n| ") == 1 + len(cells)
    assert ENV_GRAPH_GREEDY not in os.environ
