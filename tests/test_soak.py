"""Soak (bounded): hundreds of generate calls in one process with MTP on and mixed parameters
(temperatures, draft sizes, stop strings, early-closed streams): the resident set stays flat after
warm-up. The longer campaign is ``python tools/soak.py --calls 1000``."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent.parent / "tools"))
import soak  # noqa: E402


def test_rss_is_stable_over_many_mtp_generations(trained_paths):
    target, assistant = trained_paths
    report = soak.run(target, assistant, calls=300, warmup=60)
    assert report["errors"] == 0
    assert report["rss_growth_mb"] < 16, report
