"""Parts 1 and 2: the matrix of systems, in process and over HTTP (its samples and their aggregation:
:mod:`.samples`)."""

from __future__ import annotations

import random
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ..generation.agreement import compare_greedy, forced_rows
from ..config.params import resolve_flash_attn
from .config import SAMPLING, BenchConfig, Setup, log, setups
from .samples import Sample
from .util import CpuMeter, ServerProcess, cpu_seconds, free_port, ours_serve_argv, upstream_argv

#: Upstream's greedy output may part from ours plain at a near-tie for this tolerance: it decodes the prompt in
#: another batch split, outside the batch-invariant kernels: tests/numerics.py's TOL["prompt_batch"], its measured
#: basis there (tests/test_bench_smoke.py checks the two values are one).
NEAR_TIE_TOL = 1.5e-2


@dataclass(frozen=True)
class System:
    """One column of the matrix: ``kind`` is ``upstream`` or ``ours``; ``mtp`` is ``off``,
    ``draft-mtp`` (upstream), ``sync`` (ours, depth2 off) or ``depth2`` (ours, depth2 on); ``head``
    ``dense`` runs ours on the setup's dense-head assistant (the main one is the setup's own)."""

    kind: str
    mtp: str
    draft_n: int = 0
    head: str = ""

    @property
    def label(self) -> str:
        names = {("upstream", "off"): "upstream plain", ("upstream", "draft-mtp"): "upstream draft-mtp",
                 ("ours", "off"): "ours plain", ("ours", "sync"): "ours MTP depth2 off",
                 ("ours", "depth2"): "ours MTP depth2 on"}
        base = names[(self.kind, self.mtp)]
        if self.head:
            base = base.replace("ours MTP", f"ours MTP {self.head} head")
        return base if self.mtp == "off" else f"{base} n={self.draft_n}"

    @property
    def family(self) -> str:
        return self.label.rsplit(" n=", 1)[0]


def systems_for(draft_ns: Sequence[int], depth2_ns: Sequence[int] | None = None,
                dense_ns: Sequence[int] = ()) -> list[System]:
    out = [System("upstream", "off"), System("ours", "off")]
    for n in draft_ns:
        out += [System("upstream", "draft-mtp", n), System("ours", "sync", n)]
        if depth2_ns is None or n in depth2_ns:
            out.append(System("ours", "depth2", n))
        if n in dense_ns:
            out.append(System("ours", "sync", n, head="dense"))
    return out


def eog_bias(model: Any) -> dict[int, float]:
    """-100 on every end-of-generation token: outputs run to their full length on both systems."""
    return {t: -100.0 for t in range(model.n_vocab) if model.is_eog(t)}


def request_body(prompt_ids: list[int], max_tokens: int, temp: float, seed: int, draft_n: int,
                 bias: dict[int, float]) -> dict[str, Any]:
    """The one request body both servers get (``return_tokens``: llama-server's ``/completion`` only)."""
    return {
        "model": "bench", "prompt": prompt_ids, "max_tokens": max_tokens, "n_predict": max_tokens,
        "temperature": temp, **SAMPLING.kwargs(), "typical_p": 1.0,
        "repeat_penalty": 1.0, "presence_penalty": 0.0, "frequency_penalty": 0.0, "seed": seed,
        "logit_bias": {str(t): b for t, b in bias.items()}, "cache_prompt": False, "return_tokens": True,
        "stream": False, "speculative.n_max": draft_n, "draft_n_max": draft_n,
    }


# ================================================================================================
# part 1 + 2: the matrix, in process and over HTTP
# ================================================================================================

class MatrixRunner:
    def __init__(self, cfg: BenchConfig, log_dir: Path) -> None:
        self.cfg = cfg
        self.log_dir = log_dir
        self.systems = systems_for(cfg.draft_ns, cfg.depth2_ns, cfg.dense_ns)
        self.samples: list[Sample] = []
        self.meter = CpuMeter()
        self.rng = random.Random(cfg.seed_shuffle or cfg.seed)
        self.errors: list[str] = []

    # --- servers ------------------------------------------------------------------------------

    def _on_http(self, s: System) -> bool:
        return not s.head and (self.cfg.http_ns is None or s.mtp == "off" or s.draft_n in self.cfg.http_ns)

    def _start_upstream(self, setup: Setup) -> dict[System, ServerProcess]:
        cfg = self.cfg
        servers: dict[System, ServerProcess] = {}
        for s in self.systems:
            if s.kind != "upstream":
                continue
            port = free_port()
            argv = upstream_argv(setup.target, port, threads=cfg.threads, n_ctx=cfg.n_ctx, kv=setup.kv,
                                 assistant=setup.upstream_assistant if s.mtp == "draft-mtp" else None, draft_n=s.draft_n)
            servers[s] = ServerProcess(f"upstream-{setup.name}-{s.label}".replace(" ", "_"), argv, port, self.log_dir)
        for srv in servers.values():
            srv.wait_ready()
            self.meter.add(srv.pid)
        return servers

    def _start_ours(self, setup: Setup) -> dict[str, ServerProcess]:
        cfg = self.cfg
        servers: dict[str, ServerProcess] = {}
        wanted = {s.mtp for s in self.systems if s.kind == "ours" and self._on_http(s)}
        for name, assistant, depth2 in (("off", None, True), ("sync", setup.assistant, False),
                                        ("depth2", setup.assistant, True)):
            if name not in wanted:
                continue
            port = free_port()
            argv = ours_serve_argv(setup.target, port, threads=cfg.threads, n_ctx=cfg.n_ctx, kv=setup.kv,
                                   assistant=assistant, depth2=depth2)
            servers[name] = ServerProcess(f"ours-serve-{setup.name}-{name}".replace(" ", "_"), argv, port, self.log_dir)
        for srv in servers.values():
            srv.wait_ready()
            self.meter.add(srv.pid)
        return servers

    # --- one generation each --------------------------------------------------------------------

    def _ours_inproc(self, model: Any, ctx: Any, s: System, prompt_ids: list[int], n_out: int, temp: float,
                     seed: int, bias: dict[int, float], kv: str, run: int) -> Sample:
        c0 = cpu_seconds()
        r = model.generate(prompt_ids, context=ctx, max_tokens=n_out, temperature=temp,
                           **SAMPLING.kwargs(), seed=seed, logit_bias=bias or None,
                           draft_n_max=s.draft_n if s.mtp != "off" else 0, depth2=(s.mtp == "depth2"),
                           skip_streak=0)
        cpu = cpu_seconds() - c0
        st = r.stats
        return Sample("inproc", s.label, s.family, s.draft_n, kv, n_out, temp, run, st.tokens_per_second,
                      st.n_generated, st.n_drafted, st.n_accepted, wall_s=st.t_total, cpu_s=cpu, tokens=list(r.tokens),
                      text=r.text, extra={"t_prompt": st.t_prompt, "t_draft": st.t_draft, "t_verify": st.t_verify,
                                          "t_sample": st.t_sample, "n_rounds": st.n_rounds})

    def _http(self, srv: ServerProcess, body: dict[str, Any]) -> tuple[dict[str, Any], float]:
        # /v1/completions has no token ids (ours refuses the field there, as every field it does not implement)
        body = {k: v for k, v in body.items() if k != "return_tokens"}
        status, payload, wall = srv.client.request("POST", "/v1/completions", body)
        if status != 200 or not isinstance(payload, dict):
            raise RuntimeError(f"{srv.name}: HTTP {status}: {str(payload)[:500]}")
        return payload, wall

    def _upstream(self, srv: ServerProcess, s: System, body: dict[str, Any], kv: str, n_out: int, temp: float,
                  run: int) -> Sample:
        """Upstream's own numbers: llama-server's native ``/completion`` (its generation timings
        and, with ``return_tokens``, the token ids)."""
        c0 = cpu_seconds(srv.pid)
        status, payload, wall = srv.client.request("POST", "/completion", body)
        cpu = cpu_seconds(srv.pid) - c0
        if status != 200 or not isinstance(payload, dict):
            raise RuntimeError(f"{srv.name}: HTTP {status}: {str(payload)[:500]}")
        t = payload.get("timings", {})
        toks = payload.get("tokens")
        return Sample("inproc", s.label, s.family, s.draft_n, kv, n_out, temp, run,
                      float(t.get("predicted_per_second", 0.0)), int(t.get("predicted_n", 0)),
                      int(t.get("draft_n", 0)), int(t.get("draft_n_accepted", 0)), wall_s=wall, cpu_s=cpu,
                      tokens=list(toks) if toks else None, text=payload.get("content"),
                      extra={"prompt_ms": t.get("prompt_ms"), "predicted_ms": t.get("predicted_ms")})

    def _e2e(self, srv: ServerProcess, s: System, body: dict[str, Any], kv: str, n_out: int, temp: float,
             run: int) -> Sample:
        """Either server over ``/v1/completions``, timed by the client."""
        c0 = cpu_seconds(srv.pid)
        payload, wall = self._http(srv, body)
        cpu = cpu_seconds(srv.pid) - c0
        t = payload.get("timings", {})
        n_gen = int(t.get("predicted_n") or payload.get("usage", {}).get("completion_tokens", 0))
        return Sample("http", s.label, s.family, s.draft_n, kv, n_out, temp, run,
                      n_gen / wall if wall > 0 else 0.0, n_gen, int(t.get("draft_n", 0)),
                      int(t.get("draft_n_accepted", 0)), wall_s=wall, cpu_s=cpu, text=payload["choices"][0].get("text"),
                      extra={"reported_tokens_per_s": t.get("predicted_per_second")})

    def _judge_partings(self, ctx: Any, prompt_ids: list[int], bias: dict[int, float], kv: str) -> None:
        """Each temperature-0 in-process output that parts from ours plain gets the near-tie verdict, on
        the row ours plain chose from (replayed by teacher forcing, with the same logit bias)."""
        ss = [s for s in self.samples if s.part == "inproc" and s.kv == kv and s.temp == 0.0 and s.tokens]
        for n_out in {s.n_out for s in ss}:
            ref = next((s.tokens for s in ss if s.n_out == n_out and s.family == "ours plain"), None)
            if ref is None:
                continue
            rows = None
            for s in (x for x in ss if x.n_out == n_out and x.tokens and x.tokens != ref):
                if rows is None:
                    rows = forced_rows(ctx, prompt_ids, ref)
                    for tok, b in bias.items():
                        rows[:, tok] += b
                a = compare_greedy(ref, s.tokens or [], rows.__getitem__, NEAR_TIE_TOL)
                s.extra["parting"] = {"at": a.at, "gap": a.gap, "near_tie": a.agrees, "why": a.describe()}

    # --- the loop ---------------------------------------------------------------------------------

    def run(self) -> dict[str, Any]:
        from ..api import Model

        cfg = self.cfg
        do_http = "http" in cfg.parts
        cells = [(n, t) for n in cfg.outputs for t in cfg.temperatures]
        prompt_ids: list[int] = []
        bias: dict[int, float] = {}
        self.meter.begin()
        t_start = time.perf_counter()
        used = setups(cfg)
        for setup in used:
            log(f"matrix: {setup.name}: loading {setup.target.name} + {setup.assistant.name}"
                + (f" (+ {setup.dense_assistant.name})" if setup.dense_assistant and cfg.dense_ns else "")
                + f"; upstream: {setup.upstream_assistant.name}")
            models = {"": Model(setup.target, assistant=setup.assistant if cfg.draft_ns else None)}
            if setup.dense_assistant is not None and cfg.dense_ns:
                models["dense"] = Model(setup.target, assistant=setup.dense_assistant)
            prompt_ids = models[""].tokenize(cfg.prompt)
            bias = eog_bias(models[""]) if cfg.suppress_eog else {}
            fa = resolve_flash_attn("auto", setup.kv)  # the value the servers get too (util.py)
            ctxs = {head: m.create_context(n_ctx=cfg.n_ctx, n_threads=cfg.threads, type_k=setup.kv, type_v=setup.kv,
                                           type_k_swa=setup.kv, type_v_swa=setup.kv,  # as upstream's -ctk/-ctv
                                           flash_attn=fa, embeddings=bool(cfg.draft_ns)) for head, m in models.items()}
            ups: dict[System, ServerProcess] = {}
            ours_srv: dict[str, ServerProcess] = {}
            try:
                log(f"matrix: {setup.name}: starting servers")
                ups = self._start_upstream(setup)
                ours_srv = self._start_ours(setup) if do_http else {}

                def one(s: System, n_out: int, temp: float, seed: int, run: int) -> None:
                    if s.head not in models:
                        return  # a head this setup has no file for
                    body = request_body(prompt_ids, n_out, temp, seed, s.draft_n, bias)
                    if s.kind == "upstream":
                        sample = self._upstream(ups[s], s, body, setup.name, n_out, temp, run)
                    else:
                        sample = self._ours_inproc(models[s.head], ctxs[s.head], s, prompt_ids, n_out, temp, seed,
                                                   bias, setup.name, run)
                    if run >= 0:
                        self.samples.append(sample)
                    if do_http and self._on_http(s):
                        srv = ups[s] if s.kind == "upstream" else ours_srv[s.mtp]
                        if run >= 0:
                            self.samples.append(self._e2e(srv, s, body, setup.name, n_out, temp, run))
                        else:
                            self._http(srv, body)

                # warm-up: one short generation on every system (page cache, graph caches)
                for s in self.systems:
                    one(s, 8, 0.0, cfg.seed, -1)
                for run in range(cfg.runs):
                    for n_out, temp in self.rng.sample(cells, len(cells)):
                        order = self.rng.sample(self.systems, len(self.systems))
                        log(f"matrix: {setup.name} run {run + 1}/{cfg.runs} out {n_out} temp {temp}: "
                            f"{len(order)} systems{' (+http)' if do_http else ''}")
                        for s in order:
                            one(s, n_out, temp, cfg.seed + run, run)
                        self.meter.sample()
                self._judge_partings(ctxs[""], prompt_ids, bias, setup.name)
            finally:
                for srv in list(ups.values()) + list(ours_srv.values()):
                    self.meter.retire(srv.pid)
                    srv.stop()
                for ctx in ctxs.values():
                    ctx.close()
                for m in models.values():
                    m.close()
        noise = self.meter.end()
        noise["matrix_wall_s"] = time.perf_counter() - t_start
        return {"prompt_ids": prompt_ids, "eog_bias_tokens": sorted(bias), "noise": noise,
                "setups": [{k: str(v) if isinstance(v, Path) else v for k, v in asdict(u).items()} for u in used]}
