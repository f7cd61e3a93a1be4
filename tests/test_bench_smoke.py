"""The benchmark (``mtp-bindings bench``) end to end, in its seconds-long smoke size.

Runs every part -- the matrix in process and over HTTP against the bundled upstream
``llama-server``, and the cost structure on tiny random-weight models -- on the dense test fixtures,
then checks that the JSON and markdown are written and sane. Speed is never asserted: only that
every system produced tokens at a positive rate and that all systems agree at temperature 0.
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


def test_identical_at_temperature_zero(smoke: dict) -> None:
    res = smoke["result"]
    checks = res["inproc"]["identity"] + res["http"]["identity"]
    assert checks
    for c in checks:
        assert c["compared"] >= 5
        assert c["identical"], c


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
