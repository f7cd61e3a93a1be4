"""Parts 1 and 2's records and what the report makes of them: :class:`Sample` (one generation: where,
what, how fast) and the aggregations (one row per cell, the identity check at temperature 0, where a
round's time goes, the run's noise).

One job: turn samples into the numbers the report prints; :mod:`.matrix` makes the samples.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from .util import median, spread


@dataclass
class Sample:
    """One generation: where, what, how fast."""

    part: str           # inproc | http
    system: str
    family: str
    draft_n: int
    kv: str
    n_out: int
    temp: float
    run: int
    tokens_per_s: float
    n_generated: int
    n_drafted: int
    n_accepted: int
    wall_s: float = 0.0
    cpu_s: float = 0.0  # CPU time of the generating process (all threads) over the request
    tokens: list[int] | None = None
    text: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def acceptance(self) -> float:
        return self.n_accepted / self.n_drafted if self.n_drafted else float("nan")


def aggregate(samples: Sequence[Sample], part: str) -> list[dict[str, Any]]:
    """One row per (system, kv, n_out, temp): median tokens/s, mean acceptance, spread."""
    groups: dict[tuple[Any, ...], list[Sample]] = {}
    for s in samples:
        if s.part == part and s.run >= 0:
            groups.setdefault((s.system, s.family, s.draft_n, s.kv, s.n_out, s.temp), []).append(s)
    rows = []
    for (system, family, n, kv, n_out, temp), ss in groups.items():
        tps = [s.tokens_per_s for s in ss]
        drafted = sum(s.n_drafted for s in ss)
        rows.append({
            "system": system, "family": family, "draft_n": n, "kv": kv, "n_out": n_out, "temp": temp,
            "runs": len(ss), "tokens_per_s": median(tps), "tokens_per_s_best": max(tps), "tokens_per_s_all": tps,
            "spread": spread(tps),
            "tokens_per_cpu_s": median([s.n_generated / s.cpu_s for s in ss if s.cpu_s > 0]),
            "acceptance": (sum(s.n_accepted for s in ss) / drafted) if drafted else None,
            "mean_tokens_per_round": None,
        })
        if ss[0].extra.get("n_rounds"):
            rounds = sum(s.extra["n_rounds"] for s in ss)
            rows[-1]["mean_tokens_per_round"] = (sum(s.n_generated for s in ss) - len(ss)) / rounds if rounds else None
    # speedups within a cell: vs ours plain, vs upstream plain, vs upstream's best draft-mtp
    by_cell: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    for r in rows:
        by_cell.setdefault((r["kv"], r["n_out"], r["temp"]), []).append(r)
    for cell_rows in by_cell.values():
        for stat, suffix in (("tokens_per_s", ""), ("tokens_per_s_best", "_best"), ("tokens_per_cpu_s", "_cpu")):
            plain_ours = next((r[stat] for r in cell_rows if r["family"] == "ours plain"), None)
            plain_up = next((r[stat] for r in cell_rows if r["family"] == "upstream plain"), None)
            best_up = max((r[stat] for r in cell_rows if r["family"] == "upstream draft-mtp"), default=None)
            for r in cell_rows:
                r["vs_ours_plain" + suffix] = r[stat] / plain_ours if plain_ours else None
                r["vs_upstream_plain" + suffix] = r[stat] / plain_up if plain_up else None
                r["vs_upstream_best_mtp" + suffix] = r[stat] / best_up if best_up else None
    rows.sort(key=lambda r: (r["kv"], r["n_out"], r["temp"], r["family"], r["draft_n"]))
    return rows


def identity_check(samples: Sequence[Sample]) -> list[dict[str, Any]]:
    """At temperature 0, every system's output per (kv, n_out): in process by token ids (ours'
    ids vs upstream's ``return_tokens``), over HTTP by text. ``identical``: every output is ours
    plain's; ``agrees``: each one that is not parts from it at a near-tie (:data:`.matrix.NEAR_TIE_TOL`,
    judged in process only)."""
    out = []
    keys = sorted({(s.part, s.kv, s.n_out) for s in samples if s.temp == 0.0 and s.run >= 0})
    for part, kv, n_out in keys:
        ss = [s for s in samples if (s.part, s.kv, s.n_out) == (part, kv, n_out) and s.temp == 0.0 and s.run >= 0]
        seqs: dict[str, Any]
        if part == "inproc":
            seqs = {s.system + f"#{s.run}": tuple(s.tokens) for s in ss if s.tokens is not None}
        else:
            seqs = {s.system + f"#{s.run}": s.text for s in ss if s.text is not None}
        ref_name = next((k for k in seqs if k.startswith("ours plain")), next(iter(seqs), None))
        ref: Any = seqs.get(ref_name) if ref_name else None
        verdicts: dict[str, Any] = {s.system + f"#{s.run}": s.extra.get("parting") for s in ss}
        mismatches: list[dict[str, Any]] = []
        for name, seq in seqs.items():
            if seq != ref:
                first = next((i for i, (a, b) in enumerate(zip(seq, ref)) if a != b), min(len(seq), len(ref)))
                # over HTTP only text is compared: no rows to judge a near-tie by
                mismatches.append({"system": name, "first_difference": first, "length": len(seq),
                                   "reference_length": len(ref), "parting": verdicts.get(name)})
        out.append({"part": part, "kv": kv, "n_out": n_out, "compared": len(seqs), "reference": ref_name,
                    "by": "token ids" if part == "inproc" else "text", "identical": not mismatches,
                    "agrees": all((m["parting"] or {}).get("near_tie", False) for m in mismatches),
                    "mismatches": mismatches})
    return out


def round_breakdown(samples: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Where our in-process time per round goes (from ``GenerationStats``, medians over runs):
    drafting (submit/wait), verifying (target decode + logits read back), sampling/verifying on
    the host, and the rest of the loop (KV rollback, bookkeeping, text assembly)."""
    groups: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    for s in samples:
        if s["part"] == "inproc" and s["run"] >= 0 and s["system"].startswith("ours") and s["extra"].get("n_rounds"):
            groups.setdefault((s["kv"], s["n_out"], s["temp"], s["system"]), []).append(s)
    rows = []
    for (kv, n_out, temp, system), ss in sorted(groups.items()):
        def per_round(fn: Callable[[dict[str, Any]], float]) -> float:
            return median([fn(x) / x["extra"]["n_rounds"] for x in ss]) * 1e6

        gen = lambda x: x["wall_s"] - x["extra"]["t_prompt"]  # noqa: E731
        rows.append({"kv": kv, "n_out": n_out, "temp": temp, "system": system,
                     "round_us": per_round(gen),
                     "draft_us": per_round(lambda x: x["extra"]["t_draft"]),
                     "verify_us": per_round(lambda x: x["extra"]["t_verify"]),
                     "sample_us": per_round(lambda x: x["extra"]["t_sample"]),
                     "other_us": per_round(lambda x: gen(x) - x["extra"]["t_draft"] - x["extra"]["t_verify"]
                                           - x["extra"]["t_sample"]),
                     "tokens_per_round": median([(x["n_generated"] - 1) / x["extra"]["n_rounds"] for x in ss])})
    return rows


def noise_summary(rows: Sequence[dict[str, Any]], meter: dict[str, Any]) -> dict[str, Any]:
    spreads = [r["spread"] for r in rows if r["runs"] > 1 and not math.isnan(r["spread"])]
    return {**meter, "median_spread": median(spreads) if spreads else None,
            "max_spread": max(spreads) if spreads else None,
            "note": "spread = (max - min) / median of the runs of one cell; others_cores = CPU time of "
                    "processes that are not ours or our servers, in cores, over the matrix's wall time"}
