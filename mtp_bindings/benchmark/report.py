"""The report: markdown tables, targets and PNG plots from ``bench.json``."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from .config import log
from .samples import round_breakdown



def _fmt(x: Any, nd: int = 1) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    if isinstance(x, float):
        return f"{x:.{nd}f}"
    return str(x)


def matrix_table(rows: Sequence[dict[str, Any]], part: str) -> str:
    head = ("| setup | out | temp | system | tokens/s (median) | best | spread | tokens/CPU-s | acceptance | tokens/round | "
            "vs ours plain | vs upstream plain | vs upstream best MTP | same, by CPU time |\n"
            "|---|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    lines = [head]
    for r in rows:
        cpu_cmp = "/".join(_fmt(r.get(k), 2) for k in ("vs_ours_plain_cpu", "vs_upstream_plain_cpu", "vs_upstream_best_mtp_cpu"))
        lines.append(f"| {r['kv']} | {r['n_out']} | {r['temp']} | {r['system']} | {_fmt(r['tokens_per_s'])} | "
                     f"{_fmt(r.get('tokens_per_s_best'))} | "
                     f"{_fmt(r['spread'] * 100 if r['spread'] is not None else None, 0)}% | "
                     f"{_fmt(r.get('tokens_per_cpu_s'))} | "
                     f"{_fmt(r['acceptance'] * 100 if r['acceptance'] is not None else None, 1)}"
                     f"{'%' if r['acceptance'] is not None else ''} | {_fmt(r['mean_tokens_per_round'], 2)} | "
                     f"{_fmt(r['vs_ours_plain'], 2)} | {_fmt(r['vs_upstream_plain'], 2)} | "
                     f"{_fmt(r['vs_upstream_best_mtp'], 2)} | {cpu_cmp} |")
    return "\n".join(lines)


def write_report(result: dict[str, Any], out_dir: Path) -> Path:
    cfg = result["config"]
    lines = [f"# MTP benchmark ({cfg['mode']})", "",
             f"{result['machine']['cpu']} ({result['machine']['cores']} cores), {cfg['threads']} threads per system, "
             f"{cfg['runs']} runs a cell, started {result['started']}; target `{Path(cfg['target']).name}`, "
             f"assistant `{Path(cfg['assistant']).name}`; prompt {len(result.get('inproc', {}).get('prompt_ids', []))} tokens.",
             "", f"Source checkout `{result.get('git_head') or '?'}` (installed package), OMP_WAIT_POLICY="
             f"{result.get('omp_wait_policy') or 'unset'}, niceness {cfg.get('nice', 0):+d}; wall time "
             f"{result.get('wall_s', 0) / 60:.1f} min.",
             "", "Reproduce: `" + result["command"] + "`", ""]
    for u in result.get("setups", []):
        if cfg.get("pair") == "e2b":
            lines += [f"* {u['name']}: target `{Path(u['target']).name}`; ours `{Path(u['assistant']).name}`"
                      + (f" (dense-head rows: `{Path(u['dense_assistant']).name}`)" if u.get("dense_assistant") else "")
                      + f"; upstream `{Path(u['upstream_assistant']).name}` (its drafter has no centroid head); "
                      f"KV {u['kv']}; files in `{Path(u['target']).parent}`"]
    if cfg.get("pair") == "e2b":
        lines += ["", "The pair: `mtp-bindings scale-pair` (the bundled trained pair scaled to Gemma 4 E2B's shapes, "
                  "its behaviour kept; q4_K is llama.cpp's Q4_K_M mix).", ""]
    merged = result.get("merged_from_earlier_run")
    if merged:
        lines += [f"Kept from the run started {merged.get('started')}: " + ", ".join(f"`{k}`" for k in merged["keys"]) +
                  " (this run measured the other parts).", ""]
    tg = result.get("targets", [])
    if tg:
        lines += ["## Targets (issue 13 on the E2B pair, issue 6 on the tiny one)", "", "| target | measured | met |", "|---|---|---|"]
        lines += [f"| {t['target']} | {t['measured']} | {'-' if t['met'] is None else ('yes' if t['met'] else '**no**')} |" for t in tg]
        lines.append("")
    for part, title in (("inproc", "In process (ours: Python API; upstream: llama-server's reported generation timings)"),
                        ("http", "End to end over HTTP (same client, same /v1/completions bodies; client wall time)")):
        sec = result.get(part)
        if not sec:
            continue
        lines += [f"## {title}", "", matrix_table(sec["rows"], part), ""]
        ident = sec.get("identity", [])
        if ident:
            lines += ["Identical output at temperature 0 (all systems, all runs, vs ours plain):", ""]
            for i in ident:
                status = "identical" if i["identical"] else (
                    "agrees (near-ties only)" if i.get("agrees") else "**differs**") + ": " + ", ".join(
                    f"{m['system']} from token {m['first_difference']}" + (
                        f" ({m['parting']['why']})" if (m.get("parting") or {}).get("near_tie") else "")
                    for m in i["mismatches"][:8])
                lines.append(f"* {i['kv']}, {i['n_out']} tokens ({i['compared']} outputs, by {i['by']}): {status}")
            lines.append("")
        nz = sec.get("noise")
        if nz:
            lines += [f"Noise: median spread {_fmt((nz.get('median_spread') or 0) * 100, 0)}%, max "
                      f"{_fmt((nz.get('max_spread') or 0) * 100, 0)}% (max-min over median of a cell's runs); "
                      f"other processes used {nz['others_cores']:.2f} of {nz['cores']} cores on average, load average "
                      f"{nz['loadavg_min']:.1f}..{nz['loadavg_max']:.1f}; wall {nz['wall_s']:.0f} s.", ""]
    bd = round_breakdown(result.get("samples", []))
    if bd:
        lines += ["## Where our time per round goes (in process, medians over runs; microseconds per round)", "",
                  "draft = MTP submit + wait (depth2 on: only the wait that was not overlapped); verify = target decode "
                  "of [last] + drafts and reading its logits; sample = host-side sampling/verification; other = the rest "
                  "of the loop (KV rollback, hidden state read, bookkeeping, text assembly).", "",
                  "| setup | out | temp | system | round | draft | verify | sample | other | tokens/round |",
                  "|---|---:|---:|---|---:|---:|---:|---:|---:|---:|"]
        for r in bd:
            lines.append(f"| {r['kv']} | {r['n_out']} | {r['temp']} | {r['system']} | {r['round_us']:.0f} | {r['draft_us']:.0f} | "
                         f"{r['verify_us']:.0f} | {r['sample_us']:.0f} | {r['other_us']:.0f} | {r['tokens_per_round']:.2f} |")
        lines.append("")
    drv = result.get("driver")
    if drv:
        lines += ["## Python driver time per round (round wall time minus time inside native calls)", "",
                  "| model | config | draft_n | temp | us/round | native share | rounds |", "|---|---|---:|---:|---:|---:|---:|"]
        for label, rows in (("matrix pair", drv.get("rows", [])),
                            *((f"E2B {k}", v) for k, v in result.get("cost", {}).get("driver_e2b", {}).items())):
            for r in rows:
                lines.append(f"| {label} | {r['config']} | {r['draft_n']} | {r['temp']} | {r['driver_us_per_round']:.0f} | "
                             f"{r['native_share'] * 100:.0f}% | {r['rounds']:.0f} |")
        lines.append("")
        ps = drv.get("pyspy")
        if ps:
            lines += [f"py-spy, {ps['samples']} samples of the Python thread in the generation loop (MTP depth2 on): "
                      f"{ps['native_share'] * 100:.0f}% inside libllama calls, {ps['python_share'] * 100:.0f}% the "
                      "driver's own Python. Top Python lines (share of the loop):", "",
                      "| share | frame: source |", "|---:|---|"]
            lines += [f"| {x['share_of_loop'] * 100:.1f}% | `{x['line']}` |" for x in ps["top_python_lines"][:15]]
            lines.append("")
            if ps.get("by_function"):
                lines += [f"The same Python time by the binding/driver function it belongs to ({ps['rounds']} rounds sampled; "
                          f"{_fmt(ps.get('python_us_per_round'), 0)} us of Python per round in all):", "",
                          "| function | share of the loop | us per round |", "|---|---:|---:|"]
                lines += [f"| `{x['function']}` | {x['share_of_loop'] * 100:.1f}% | {_fmt(x['us_per_round'], 1)} |"
                          for x in ps["by_function"]]
                lines.append("")
        prof = drv.get("profile")
        if prof:
            lines += ["Profile of MTP generation (cProfile, top by self time):", "",
                      "| function | calls | self ms | cumulative ms |", "|---|---:|---:|---:|"]
            lines += [f"| `{p['function']}` | {p['calls']} | {p['self_ms']:.1f} | {p['cumulative_ms']:.1f} |" for p in prof[:15]]
            lines.append("")
    tc = result.get("trained_costs")
    if tc:
        ud = tc.get("upstream_draft", {})
        lines += [f"## Costs of the matrix's pair (`{Path(cfg['target']).name}`)", "",
                  "Draft request time (ms) by n_steps -- ours: `ctx.decode_mtp` (best round of 8-call means); upstream: "
                  "its `dur(g)` counter per draft call (best of 3 requests, `llama-server -v`):", "",
                  "| drafter | 1 | 2 | 3 | 4 | ms/step (slope) |", "|---|---:|---:|---:|---:|---:|",
                  "| ours | " + " | ".join(_fmt(tc["draft"]["ms"].get(str(n)), 3) for n in (1, 2, 3, 4)) +
                  f" | {tc['draft']['ms_per_step_slope']:.3f} |"]
        if ud and "error" not in ud:
            lines.append("| upstream draft-mtp | " + " | ".join(_fmt(ud.get(str(n), {}).get("ms_per_call"), 3) for n in (1, 2, 3, 4))
                         + " | - |")
        v = tc["verify"]
        lines += ["", "Target decode of n tokens (ms, best round; with logits read back): " +
                  ", ".join(f"{n}: {v['ms'][n]:.3f} ({v['ms_with_readback'][n]:.3f})" for n in v["ms"]), ""]
        omp = [r for r in tc.get("omp_policy", []) if "error" not in r]
        if omp:
            keys = [k for k in omp[0] if k not in ("policy", "threads")]
            lines += ["Small-graph latency (ms, best of 200) by OMP_WAIT_POLICY and threads -- the price of the passive "
                      "policy the matrix runs with (libgomp's barriers sleep instead of spinning):", "",
                      "| policy | threads | " + " | ".join(keys) + " |", "|---|---:|" + "---:|" * len(keys)]
            lines += [f"| {r['policy']} | {r['threads']} | " + " | ".join(f"{r[k]:.3f}" for k in keys) + " |" for r in omp]
            lines.append("")
    cost = result.get("cost")
    if cost:
        lines += _cost_report(cost)
    sp = result.get("speedup")
    if sp:
        lines += ["## Expected vs measured speedup", "", sp["formula"], "",
                  "| model | draft_n | acceptance a | E i.i.d. | E measured | c = t_d/T_v(1) | Leviathan S | "
                  "S (E i.i.d., T_v(k+1), driver) | S (E measured, T_v(k+1), driver) | measured S (depth2 on / off) |",
                  "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for r in sp["rows"]:
            lines.append(f"| {r['model']} | {r['k']} | {_fmt(r['a'], 3)} | {_fmt(r['E_iid'], 2)} | {_fmt(r['E_measured'], 2)} | "
                         f"{_fmt(r['c'], 3)} | {_fmt(r['leviathan'], 2)} | {_fmt(r['with_verify_and_driver'], 2)} | "
                         f"{_fmt(r.get('with_measured_E'), 2)} | "
                         f"{_fmt(r.get('measured_d2'), 2)} / {_fmt(r.get('measured_sync'), 2)} |")
        lines.append("")
    if result.get("notes"):
        lines += ["## Notes", ""] + [f"* {n}" for n in result["notes"]] + [""]
    if result.get("plots"):
        lines += ["## Plots", ""] + [f"* `{p}`" for p in result["plots"]] + [""]
    if result.get("errors"):
        lines += ["## Errors", ""] + [f"* {e}" for e in result["errors"]] + [""]
    path = out_dir / "bench.md"
    path.write_text("\n".join(lines))
    return path


def _cost_report(cost: dict[str, Any]) -> list[str]:
    sh = cost["shape"]
    lines = [f"## Cost structure ({sh['name']} shape, random weights)", "",
             f"Target: hidden {sh['hidden']}, {len(sh['layers'])} layers, vocab {sh['vocab']}; assistant: hidden {sh['a_hidden']}, "
             f"{len(sh['a_layers'])} layers, head_dim {sh['hd_swa']}/{sh['hd_full']}, centroid head C={sh['n_centroids']} top-{sh['top_k']}. "
             f"Files (MiB): " + ", ".join(f"{k} {v:.0f}" for k, v in cost.get("file_mib", {}).items()), ""]
    d = cost.get("draft_ours", {})
    ups = cost.get("upstream", {})
    if d:
        lines += ["Draft time (ms) by n_steps (ours: `ctx.decode_mtp`, wall; upstream: its `dur(g)` counter per draft "
                  "call). *repack* = llama.cpp's default weight layout (extra buffer types: AMX/repacked), *no-repack* "
                  "= plain CPU buffers (`--no-repack`):", "",
                  "| drafter | 1 | 2 | 3 | 4 | ms/step (slope) | ms/step at 4 |", "|---|---:|---:|---:|---:|---:|---:|"]
        for k in ("dense", "centroid", "dense no-repack", "centroid no-repack"):
            if k in d:
                ms = d[k]["ms"]
                name = f"ours {k}" if "no-repack" in k else f"ours {k} (repack)"
                lines.append(f"| {name} | " + " | ".join(_fmt(ms.get(str(n)), 2) for n in (1, 2, 3, 4)) +
                             f" | {d[k]['ms_per_step_slope']:.2f} | {d[k]['ms_per_step_at_max']:.2f} |")
        for uk, name in (("draft", "upstream dense (repack)"), ("draft_no_repack", "upstream dense no-repack")):
            up = ups.get(uk, {})
            if up:
                cells = [_fmt(up.get(str(n), {}).get("ms_per_call"), 2) for n in (1, 2, 3, 4)]
                lines.append(f"| {name} | " + " | ".join(cells) + f" | - | {_fmt(up.get('4', {}).get('ms_per_step'), 2)} |")
        cr = cost.get("centroid_repack")
        if cr and not cr.get("ok"):
            lines += ["", f"Ours centroid head with the default (repacked) weights: **aborts** (`{cr.get('error')}`)."]
        lines.append("")
    for vk, note in (("verify", "repack"), ("verify_no_repack", "no-repack")):
        v = cost.get(vk)
        if v:
            lines += [f"Target decode of n tokens (logits for all, embeddings on), relative to n = 1 ({note} weights):", "",
                      "| n | ms | ratio | ms with logits read back | ratio |", "|---:|---:|---:|---:|---:|"]
            for n in v["ms"]:
                lines.append(f"| {n} | {v['ms'][n]:.2f} | {v['ratio_to_1'][n]:.2f} | {v['ms_with_readback'][n]:.2f} | "
                             f"{v['ratio_to_1_with_readback'][n]:.2f} |")
            lines.append("")
    b = cost.get("bytes_per_draft_step")
    if b:
        lines += [f"Bytes to the host per draft step: ours {b['ours']:,}; upstream {b['upstream_cpu_sampling']:,} with CPU "
                  f"sampling, {b['upstream_backend_topk10']:,} with its default backend top-k sampling ({b['note']}).", ""]
    pp, upp = cost.get("pp_ours"), cost.get("upstream", {}).get("pp")
    if pp:
        wp = pp["tokens_per_s"].get("with assistant, embeddings on for the whole prompt")
        lines += [f"Prompt processing ({pp['n_prompt']} tokens, the driver's `t_prompt`), tokens/s: ours without assistant "
                  f"{pp['tokens_per_s']['without assistant']:.1f}, with the assistant and drafting on "
                  f"{pp['tokens_per_s']['with assistant']:.1f} (ratio {pp['ratio_with_vs_without']:.3f}"
                  + (f"; one decode of the whole prompt with embeddings on, as the driver did before commit 2e620ae: "
                     f"{wp:.1f}, ratio {pp['ratio_whole_prompt_embeddings_vs_without']:.3f}" if wp else "")
                  + ")" +
                  (f"; upstream without -md {upp['tokens_per_s']['without assistant']:.1f}, with "
                   f"{upp['tokens_per_s']['with assistant']:.1f} (ratio {upp['ratio_with_vs_without']:.3f})" if upp else "") + ".", ""]
    mem, umem = cost.get("memory_ours", {}), cost.get("upstream", {}).get("memory", {})
    if mem and "rss_delta_mib" in mem:
        bufs = ", ".join(f"{x['kind']} {x['buffer']} {x['mib']:.1f} MiB" for x in mem.get("buffers_assistant", []))
        lines += [f"Memory, ours: RSS target {mem['rss_target_mib']:.0f} MiB -> attached {mem['rss_attached_mib']:.0f} -> "
                  f"after first draft {mem['rss_after_draft_mib']:.0f} (delta {mem['rss_delta_mib']:+.0f} MiB; assistant "
                  f"file {mem['assistant_file_mib']:.0f} MiB). Buffers llama.cpp logged for the assistant: {bufs or 'none'}.", ""]
    if umem and "rss_delta_mib" in umem:
        extra = umem.get("buffers_draft", [])
        lines += [f"Memory, upstream llama-server: RSS without -md {umem['without assistant']['rss_mib']:.0f} MiB, with "
                  f"{umem['with assistant']['rss_mib']:.0f} MiB (delta {umem['rss_delta_mib']:+.0f}); buffers of the "
                  f"draft model and its second context (as logged): " +
                  (", ".join(f"{x['kind']} {x['buffer']} {x['mib']:.1f} MiB" for x in extra) or "none logged") + ".", ""]
    return lines


def _save(plt: Any, fig: Any, path: Path) -> str:
    """Lay out, write and close one figure; its file name for the report."""
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path.name


def make_plots(result: dict[str, Any], out_dir: Path) -> list[str]:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        log("plots skipped: matplotlib is not installed (pip install 'mtp-bindings[bench]')")
        return []
    files = []
    colors = {"upstream draft-mtp": "tab:red", "ours MTP depth2 off": "tab:blue", "ours MTP depth2 on": "tab:green",
              "ours MTP dense head depth2 off": "tab:purple", "upstream plain": "tab:red", "ours plain": "tab:blue"}
    for part, ylabel in (("inproc", "tokens/s (in process)"), ("http", "tokens/s (HTTP, client wall)")):
        sec = result.get(part)
        if not sec or not sec["rows"]:
            continue
        rows = sec["rows"]
        cells = sorted({(r["kv"], r["n_out"], r["temp"]) for r in rows})
        ncol = min(4, len(cells))
        nrow = math.ceil(len(cells) / ncol)
        fig, axes = plt.subplots(nrow, ncol, figsize=(4.2 * ncol, 3.4 * nrow), squeeze=False)
        for ax, cell in zip(axes.flat, cells):
            cr = [r for r in rows if (r["kv"], r["n_out"], r["temp"]) == cell]
            for fam in ("upstream draft-mtp", "ours MTP depth2 off", "ours MTP depth2 on", "ours MTP dense head depth2 off"):
                pts = sorted((r["draft_n"], r["tokens_per_s"]) for r in cr if r["family"] == fam)
                if pts:
                    ax.plot(*zip(*pts), marker="o", label=fam, color=colors[fam],
                            linestyle="--" if fam.endswith("off") else "-")
            for fam, ls in (("upstream plain", ":"), ("ours plain", "-.")):
                pl = [r["tokens_per_s"] for r in cr if r["family"] == fam]
                if pl:
                    ax.axhline(pl[0], color=colors[fam], linestyle=ls, label=fam)
            ax.set_title(f"{cell[0]}, {cell[1]} tokens, T={cell[2]}", fontsize=9)
            ax.set_xlabel("draft_n_max")
            ax.set_ylabel(ylabel)
            ax.set_ylim(bottom=0)
        for ax in list(axes.flat)[len(cells):]:
            ax.axis("off")
        axes.flat[0].legend(fontsize=7)
        files.append(_save(plt, fig, out_dir / f"{part}_tokens_per_s.png"))
    sec = result.get("inproc")
    if sec and sec["rows"]:
        fig, ax = plt.subplots(figsize=(5.5, 3.8))
        for fam in ("upstream draft-mtp", "ours MTP depth2 off", "ours MTP dense head depth2 off"):
            for temp, ls in ((0.0, "-"), (0.7, "--")):
                by_n: dict[int, list[float]] = {}
                for r in sec["rows"]:
                    if r["family"] == fam and r["temp"] == temp and r["acceptance"] is not None:
                        by_n.setdefault(r["draft_n"], []).append(r["acceptance"])
                if by_n:
                    xs = sorted(by_n)
                    ax.plot(xs, [float(np.mean(by_n[x])) for x in xs], marker="o", linestyle=ls, color=colors[fam],
                            label=f"{fam}, T={temp}")
        ax.set_xlabel("draft_n_max")
        ax.set_ylabel("acceptance (accepted / drafted)")
        ax.set_ylim(0, 1)
        ax.legend(fontsize=7)
        files.append(_save(plt, fig, out_dir / "acceptance.png"))
    cost = result.get("cost")
    if cost and cost.get("draft_ours"):
        fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 3.8))
        d = cost["draft_ours"]
        for k, c, ls in (("dense", "tab:blue", "-"), ("centroid", "tab:green", "-"),
                         ("dense no-repack", "tab:blue", "--"), ("centroid no-repack", "tab:green", "--")):
            if k in d:
                xs = sorted(int(n) for n in d[k]["ms"])
                a1.plot(xs, [d[k]["ms"][str(n)] for n in xs], marker="o", color=c, linestyle=ls, label=f"ours {k}")
        for uk, ls, name in (("draft", "-", "upstream dense"), ("draft_no_repack", "--", "upstream dense no-repack")):
            up = cost.get("upstream", {}).get(uk, {})
            xs = sorted(int(n) for n in up if isinstance(up[n], dict) and up[n].get("ms_per_call"))
            if xs:
                a1.plot(xs, [up[str(n)]["ms_per_call"] for n in xs], marker="s", color="tab:red", linestyle=ls, label=name)
        a1.set_xlabel("draft steps")
        a1.set_ylabel("ms per draft request")
        a1.set_title(f"draft time, {cost['shape']['name']} shape", fontsize=9)
        a1.set_ylim(bottom=0)
        a1.legend(fontsize=7)
        v = cost.get("verify")
        if v:
            ns = sorted(int(n) for n in v["ratio_to_1"])
            a2.plot(ns, [v["ratio_to_1"][str(n)] for n in ns], marker="o", label="decode")
            a2.plot(ns, [v["ratio_to_1_with_readback"][str(n)] for n in ns], marker="o", label="decode + logits read back")
            a2.plot(ns, ns, color="gray", linestyle=":", label="linear")
            a2.set_xlabel("tokens verified")
            a2.set_ylabel("time relative to 1 token")
            a2.set_title("target verify cost", fontsize=9)
            a2.legend(fontsize=7)
        files.append(_save(plt, fig, out_dir / "cost_structure.png"))
    sp = result.get("speedup")
    if sp and sp["rows"]:
        fig, ax = plt.subplots(figsize=(5.5, 3.8))
        names = list(dict.fromkeys(r["model"] for r in sp["rows"]))
        for model, c in zip(names, ("tab:blue", "tab:purple", "tab:green", "tab:orange", "tab:brown")):
            rr = [r for r in sp["rows"] if r["model"] == model]
            if not rr:
                continue
            ks = [r["k"] for r in rr]
            ax.plot(ks, [r.get("with_measured_E") or r["with_verify_and_driver"] for r in rr], marker="o", color=c,
                    label=f"{model}: expected")
            ax.plot(ks, [r["leviathan"] for r in rr], marker="x", color=c, linestyle=":", label=f"{model}: Leviathan")
            meas = [(r["k"], r["measured_d2"]) for r in rr if r.get("measured_d2") is not None]
            if meas:
                ax.plot(*zip(*meas), marker="s", color=c, linestyle="--", label=f"{model}: measured (depth2 on)")
        ax.axhline(1.0, color="gray", linestyle=":")
        ax.set_xlabel("draft_n_max")
        ax.set_ylabel("speedup over plain")
        ax.legend(fontsize=7)
        files.append(_save(plt, fig, out_dir / "expected_speedup.png"))
    return files
