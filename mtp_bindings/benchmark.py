"""Benchmarks against upstream llama.cpp (``mtp-bindings bench``; project issue 6).

Three parts, each optional (``--parts``):

``inproc``
    The matrix: systems x ``draft_n_max`` x KV type x output length x temperature, ``runs`` runs a
    cell. *Ours* is timed in this process through :meth:`Model.generate` (its own
    ``GenerationStats``); *upstream* is the bundled ``llama-server`` built from the same pinned
    tree (plain, and ``--spec-type draft-mtp``), timed by the generation ``timings`` it reports.
    Systems are interleaved in random order inside every (run, cell), so a ratio between two
    systems compares measurements taken seconds apart.
``http``
    End to end over HTTP: our ``mtp-bindings serve`` against upstream's server, same client
    (``http.client``), same ``/v1/completions`` request bodies, client-side wall time.
``cost``
    Cost structure at real Gemma 4 E2B shapes with random weights (written here with gguf-py):
    draft step time (ours dense / ours centroid head / upstream dense), verify time of 1..5
    tokens, bytes moved to the host per draft step, prompt processing with and without an
    assistant, the Python driver's own time per round, memory of attaching an assistant, and the
    expected speedup per ``draft_n_max`` from these costs and the measured acceptance.

Results: ``<out>/bench.json``, ``<out>/bench.md`` and PNG plots (matplotlib, the ``[bench]``
extra). Run ``mtp-bindings bench --help``.
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import math
import os
import platform
import random
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

PKG = Path(__file__).resolve().parent
BUNDLED = PKG / "models"


def llama_server_path() -> Path:
    """The bundled upstream ``llama-server`` (next to the compiled module), or
    ``$MTP_BENCH_LLAMA_SERVER``."""
    env = os.environ.get("MTP_BENCH_LLAMA_SERVER")
    if env:
        return Path(env)
    cands = [PKG / "bin" / "llama-server"]
    with contextlib.suppress(ImportError):
        from . import _ffi

        cands.append(Path(_ffi.__file__).resolve().parent / "bin" / "llama-server")
    return next((c for c in cands if c.is_file()), cands[0])

# A prompt of the kind the trained pair was trained on (Python source).
DEFAULT_PROMPT = "import os\nimport sys\n\n\ndef parse_args(argv):\n"


def log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# ================================================================================================
# configuration
# ================================================================================================

@dataclass
class BenchConfig:
    """What one benchmark run measures (see :func:`config_for`)."""

    mode: str = "full"
    target: Path = BUNDLED / "trained-target.gguf"
    assistant: Path = BUNDLED / "trained-assistant.gguf"
    out_dir: Path = Path("bench/results")
    parts: tuple[str, ...] = ("inproc", "http", "cost")
    threads: int = 2
    runs: int = 3
    draft_ns: tuple[int, ...] = (1, 2, 3, 4)
    kv_types: tuple[str, ...] = ("f16", "q8_0")
    outputs: tuple[int, ...] = (128, 512)
    temperatures: tuple[float, ...] = (0.0, 0.7)
    prompt: str = DEFAULT_PROMPT
    n_ctx: int = 2048
    seed: int = 1234
    suppress_eog: bool = True          # fixed-length outputs: EOG tokens get a -100 logit bias (both systems)
    cost_shape: str = "e2b"            # "e2b" (real widths) or "tiny" (smoke test)
    cost_rounds: int = 7
    cost_cache: Path = Path("bench/.models")
    upstream_steps_tokens: int = 24    # tokens generated per upstream draft-step measurement (cost part)
    http_systems: bool = True
    plots: bool = True
    seed_shuffle: int = 0
    nice: int = 0                      # niceness increment for this process and its servers (negative: priority)
    omp_wait_policy: str = "passive"   # OMP_WAIT_POLICY for every system (see main_args); "default": unset
    pyspy_seconds: float = 20.0        # py-spy profile of the driver loop (0: off; needs py-spy)

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        return {k: (str(v) if isinstance(v, Path) else v) for k, v in d.items()}


def config_for(mode: str, **overrides: Any) -> BenchConfig:
    """``full`` (issue 6's matrix), ``quick`` (a few minutes) or ``smoke`` (seconds, for tests)."""
    if mode == "full":
        cfg = BenchConfig()
    elif mode == "quick":
        cfg = BenchConfig(mode="quick", runs=2, kv_types=("f16",), outputs=(128,), cost_rounds=3,
                          upstream_steps_tokens=12, pyspy_seconds=8.0)
    elif mode == "smoke":
        cfg = BenchConfig(mode="smoke", runs=1, draft_ns=(2,), kv_types=("f16",), outputs=(16,),
                          temperatures=(0.0,), cost_shape="tiny", cost_rounds=1, upstream_steps_tokens=6,
                          n_ctx=512, plots=False, pyspy_seconds=0.0)
    else:
        raise ValueError(f"unknown mode {mode!r}")
    for k, v in overrides.items():
        if v is not None:
            setattr(cfg, k, v)
    for k in ("target", "assistant", "out_dir", "cost_cache"):  # servers run elsewhere (cwd)
        setattr(cfg, k, Path(getattr(cfg, k)).resolve())
    return cfg


# ================================================================================================
# small utilities: statistics, CPU/noise accounting, processes, HTTP
# ================================================================================================

def median(xs: Sequence[float]) -> float:
    return float(statistics.median(xs)) if xs else float("nan")


def spread(xs: Sequence[float]) -> float:
    """Relative spread of repeated measurements: (max - min) / median (0 for one sample)."""
    if len(xs) < 2:
        return 0.0
    m = median(xs)
    return (max(xs) - min(xs)) / m if m else float("nan")


def _proc_jiffies(pid: int) -> int:
    try:
        parts = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return int(parts[11]) + int(parts[12])  # utime + stime
    except (OSError, IndexError, ValueError):
        return 0


def _busy_jiffies() -> tuple[int, int]:
    """(busy, total) jiffies over all CPUs from /proc/stat."""
    try:
        vals = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    except (OSError, ValueError):
        return 0, 0
    idle = vals[3] + (vals[4] if len(vals) > 4 else 0)
    return sum(vals) - idle, sum(vals)


class CpuMeter:
    """How busy the machine was with *other* work while we measured: (all CPUs' busy time -
    ours and our servers') / wall time, in cores. The machine is shared with builds."""

    def __init__(self) -> None:
        self.pids: set[int] = {os.getpid()}
        self.start_pid_j: dict[int, int] = {}
        self.start = (0, 0)
        self.t0 = 0.0
        self.load: list[float] = []

    def add(self, pid: int) -> None:
        self.pids.add(pid)
        self.start_pid_j.setdefault(pid, _proc_jiffies(pid))

    def begin(self) -> None:
        self.start = _busy_jiffies()
        self.t0 = time.perf_counter()
        self.start_pid_j = {p: _proc_jiffies(p) for p in self.pids}
        self.sample()

    def sample(self) -> None:
        with contextlib.suppress(OSError, ValueError):
            self.load.append(float(Path("/proc/loadavg").read_text().split()[0]))

    def end(self) -> dict[str, Any]:
        self.sample()
        busy1, _ = _busy_jiffies()
        hz = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
        wall = max(time.perf_counter() - self.t0, 1e-9)
        ours = sum(max(_proc_jiffies(p) - self.start_pid_j.get(p, 0), 0) for p in self.pids)
        others = max(busy1 - self.start[0] - ours, 0) / hz / wall
        return {"wall_s": wall, "cores": os.cpu_count(), "ours_cores": ours / hz / wall,
                "others_cores": others, "loadavg_min": min(self.load, default=float("nan")),
                "loadavg_max": max(self.load, default=float("nan"))}


def cpu_seconds(pid: int | None = None) -> float:
    """CPU time of all threads of a process (ns resolution, from each thread's schedstat)."""
    total = 0
    base = Path(f"/proc/{pid or os.getpid()}/task")
    try:
        for t in base.iterdir():
            with contextlib.suppress(OSError, ValueError, IndexError):
                total += int((t / "schedstat").read_text().split()[0])
    except OSError:
        return 0.0
    return total / 1e9


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def rss_bytes(pid: int | None = None) -> int:
    """Resident set size of a process (this one by default), from /proc."""
    try:
        for line in Path(f"/proc/{pid or 'self'}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


class HTTPClient:
    """One keep-alive connection per server; JSON in, JSON out, wall time measured around it."""

    def __init__(self, port: int, timeout: float = 600.0) -> None:
        self.port = port
        self.timeout = timeout
        self.conn: http.client.HTTPConnection | None = None

    def request(self, method: str, path: str, body: dict[str, Any] | None = None) -> tuple[int, Any, float]:
        data = json.dumps(body).encode() if body is not None else None
        headers = {"Content-Type": "application/json"} if data else {}
        for attempt in range(2):
            if self.conn is None:
                self.conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=self.timeout)
            try:
                t0 = time.perf_counter()
                self.conn.request(method, path, body=data, headers=headers)
                resp = self.conn.getresponse()
                raw = resp.read()
                dt = time.perf_counter() - t0
                try:
                    payload = json.loads(raw) if raw else None
                except json.JSONDecodeError:
                    payload = raw.decode(errors="replace")
                return resp.status, payload, dt
            except (ConnectionError, http.client.HTTPException, OSError):
                self.close()
                if attempt:
                    raise
        raise AssertionError("unreachable")

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None


class ServerProcess:
    """A server subprocess (upstream ``llama-server`` or our ``serve``) on a free port, its log in
    a temporary file, stopped with SIGTERM (then SIGKILL) by :meth:`stop`."""

    def __init__(self, name: str, argv: list[str], port: int, log_dir: Path, env: dict[str, str] | None = None) -> None:
        self.name = name
        self.port = port
        self.argv = argv
        self.log_path = log_dir / f"{re.sub(r'[^A-Za-z0-9_.-]+', '_', name)}.log"
        self._log = open(self.log_path, "wb")  # noqa: SIM115 (closed in stop())
        # cwd: never a source checkout, where `python -m mtp_bindings...` would import the
        # uncompiled tree instead of the installed package
        self.proc = subprocess.Popen(argv, stdout=self._log, stderr=subprocess.STDOUT, env=env, cwd=log_dir,
                                     start_new_session=True)
        self.client = HTTPClient(port)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def wait_ready(self, timeout: float = 300.0) -> None:
        t_end = time.monotonic() + timeout
        while time.monotonic() < t_end:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.proc.returncode}:\n{self.log_tail()}")
            try:
                status, body, _ = HTTPClient(self.port, timeout=5).request("GET", "/health")
                if status == 200:
                    return
            except OSError:
                pass
            time.sleep(0.2)
        raise RuntimeError(f"{self.name} not ready after {timeout:.0f} s:\n{self.log_tail()}")

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def log_tail(self, n: int = 30) -> str:
        return "\n".join(self.log_text().splitlines()[-n:])

    def stop(self) -> None:
        self.client.close()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=20)
        self._log.close()


def upstream_argv(target: Path, port: int, *, threads: int, n_ctx: int, kv: str, assistant: Path | None = None,
                  draft_n: int = 0, verbose: bool = False, extra: Sequence[str] = ()) -> list[str]:
    fa = "off" if kv in ("f16", "f32") else "on"  # a quantized V cache needs flash attention
    argv = [str(llama_server_path()), "-m", str(target), "--host", "127.0.0.1", "--port", str(port), "-c", str(n_ctx),
            "-t", str(threads), "-tb", str(threads), "-np", "1", "-fa", fa, "-ctk", kv, "-ctv", kv,
            "--no-webui", "-cram", "0"]
    if assistant is not None:
        argv += ["-md", str(assistant), "--spec-type", "draft-mtp", "--spec-draft-n-max", str(draft_n),
                 "-ctkd", kv, "-ctvd", kv]
    if verbose:
        argv += ["-v"]
    return argv + list(extra)


def ours_serve_argv(target: Path, port: int, *, threads: int, n_ctx: int, kv: str, assistant: Path | None,
                    depth2: bool = True) -> list[str]:
    fa = "off" if kv in ("f16", "f32") else "on"
    argv = [sys.executable, "-m", "mtp_bindings.cli", "serve", "-m", str(target), "--port", str(port),
            "-c", str(n_ctx), "-t", str(threads), "-ctk", kv, "-ctv", kv, "-fa", fa]
    if assistant is None:
        argv += ["--no-mtp"]
    else:
        argv += ["-md", str(assistant)]
        if not depth2:
            argv += ["--no-depth2"]
    return argv


# ================================================================================================
# systems of the matrix
# ================================================================================================

@dataclass(frozen=True)
class System:
    """One column of the matrix: ``kind`` is ``upstream`` or ``ours``; ``mtp`` is ``off``,
    ``draft-mtp`` (upstream), ``sync`` (ours, depth2 off) or ``depth2`` (ours, depth2 on)."""

    kind: str
    mtp: str
    draft_n: int = 0

    @property
    def label(self) -> str:
        names = {("upstream", "off"): "upstream plain", ("upstream", "draft-mtp"): "upstream draft-mtp",
                 ("ours", "off"): "ours plain", ("ours", "sync"): "ours MTP depth2 off",
                 ("ours", "depth2"): "ours MTP depth2 on"}
        base = names[(self.kind, self.mtp)]
        return base if self.mtp == "off" else f"{base} n={self.draft_n}"

    @property
    def family(self) -> str:
        return self.label.rsplit(" n=", 1)[0]


def systems_for(draft_ns: Sequence[int]) -> list[System]:
    out = [System("upstream", "off"), System("ours", "off")]
    for n in draft_ns:
        out += [System("upstream", "draft-mtp", n), System("ours", "sync", n), System("ours", "depth2", n)]
    return out


def eog_bias(model: Any) -> dict[int, float]:
    """-100 on every end-of-generation token: outputs run to their full length on both systems."""
    return {t: -100.0 for t in range(model.n_vocab) if model.is_eog(t)}


def request_body(prompt_ids: list[int], max_tokens: int, temp: float, seed: int, draft_n: int,
                 bias: dict[int, float]) -> dict[str, Any]:
    """The one request body both servers get (each ignores the other's extras)."""
    return {
        "model": "bench", "prompt": prompt_ids, "max_tokens": max_tokens, "n_predict": max_tokens,
        "temperature": temp, "top_k": 40, "top_p": 1.0, "min_p": 0.0, "typical_p": 1.0,
        "repeat_penalty": 1.0, "presence_penalty": 0.0, "frequency_penalty": 0.0, "seed": seed,
        "logit_bias": {str(t): b for t, b in bias.items()}, "cache_prompt": False, "return_tokens": True,
        "stream": False, "speculative.n_max": draft_n, "draft_n_max": draft_n,
    }


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


# ================================================================================================
# part 1 + 2: the matrix, in process and over HTTP
# ================================================================================================

class MatrixRunner:
    def __init__(self, cfg: BenchConfig, log_dir: Path) -> None:
        self.cfg = cfg
        self.log_dir = log_dir
        self.systems = systems_for(cfg.draft_ns)
        self.samples: list[Sample] = []
        self.meter = CpuMeter()
        self.rng = random.Random(cfg.seed_shuffle or cfg.seed)
        self.errors: list[str] = []

    # --- servers ------------------------------------------------------------------------------

    def _start_upstream(self, kv: str) -> dict[System, ServerProcess]:
        cfg = self.cfg
        servers: dict[System, ServerProcess] = {}
        for s in self.systems:
            if s.kind != "upstream":
                continue
            port = free_port()
            argv = upstream_argv(cfg.target, port, threads=cfg.threads, n_ctx=cfg.n_ctx, kv=kv,
                                 assistant=cfg.assistant if s.mtp == "draft-mtp" else None, draft_n=s.draft_n)
            servers[s] = ServerProcess(f"upstream-{kv}-{s.label}", argv, port, self.log_dir)
        for srv in servers.values():
            srv.wait_ready()
            self.meter.add(srv.pid)
        return servers

    def _start_ours(self, kv: str) -> dict[str, ServerProcess]:
        cfg = self.cfg
        servers: dict[str, ServerProcess] = {}
        for name, assistant, depth2 in (("off", None, True), ("sync", cfg.assistant, False),
                                        ("depth2", cfg.assistant, True)):
            if name != "off" and not cfg.draft_ns:
                continue
            port = free_port()
            argv = ours_serve_argv(cfg.target, port, threads=cfg.threads, n_ctx=cfg.n_ctx, kv=kv,
                                   assistant=assistant, depth2=depth2)
            servers[name] = ServerProcess(f"ours-serve-{kv}-{name}", argv, port, self.log_dir)
        for srv in servers.values():
            srv.wait_ready()
            self.meter.add(srv.pid)
        return servers

    # --- one generation each --------------------------------------------------------------------

    def _ours_inproc(self, model: Any, ctx: Any, s: System, prompt_ids: list[int], n_out: int, temp: float,
                     seed: int, bias: dict[int, float], kv: str, run: int) -> Sample:
        c0 = cpu_seconds()
        r = model.generate(prompt_ids, context=ctx, max_tokens=n_out, temperature=temp, top_k=40, top_p=1.0,
                           min_p=0.0, seed=seed, logit_bias=bias or None,
                           draft_n_max=s.draft_n if s.mtp != "off" else 0, depth2=(s.mtp == "depth2"),
                           skip_streak=0)
        cpu = cpu_seconds() - c0
        st = r.stats
        return Sample("inproc", s.label, s.family, s.draft_n, kv, n_out, temp, run, st.tokens_per_second,
                      st.n_generated, st.n_drafted, st.n_accepted, wall_s=st.t_total, cpu_s=cpu, tokens=list(r.tokens),
                      text=r.text, extra={"t_prompt": st.t_prompt, "t_draft": st.t_draft, "t_verify": st.t_verify,
                                          "t_sample": st.t_sample, "n_rounds": st.n_rounds})

    def _http(self, srv: ServerProcess, body: dict[str, Any]) -> tuple[dict[str, Any], float]:
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

    # --- the loop ---------------------------------------------------------------------------------

    def run(self) -> dict[str, Any]:
        from .model import Model

        cfg = self.cfg
        do_http = "http" in cfg.parts
        model = Model(cfg.target, assistant=cfg.assistant if cfg.draft_ns else None)
        prompt_ids = model.tokenize(cfg.prompt)
        bias = eog_bias(model) if cfg.suppress_eog else {}
        cells = [(n, t) for n in cfg.outputs for t in cfg.temperatures]
        self.meter.begin()
        t_start = time.perf_counter()
        try:
            for kv in cfg.kv_types:
                log(f"matrix: KV {kv}: starting servers")
                fa = "off" if kv in ("f16", "f32") else "on"
                ctx = model.create_context(n_ctx=cfg.n_ctx, n_threads=cfg.threads, type_k=kv, type_v=kv,
                                           flash_attn=fa, embeddings=bool(cfg.draft_ns))
                ups = self._start_upstream(kv)
                ours_srv = self._start_ours(kv) if do_http else {}
                try:
                    # warm-up: one short generation on every system (page cache, graph caches)
                    for s in self.systems:
                        body = request_body(prompt_ids, 8, 0.0, cfg.seed, s.draft_n, bias)
                        if s.kind == "upstream":
                            self._upstream(ups[s], s, body, kv, 8, 0.0, -1)
                        else:
                            self._ours_inproc(model, ctx, s, prompt_ids, 8, 0.0, cfg.seed, bias, kv, -1)
                        if do_http:
                            self._http(ups[s] if s.kind == "upstream" else ours_srv[s.mtp], body)
                    for run in range(cfg.runs):
                        for n_out, temp in self.rng.sample(cells, len(cells)):
                            seed = cfg.seed + run
                            order = self.rng.sample(self.systems, len(self.systems))
                            log(f"matrix: KV {kv} run {run + 1}/{cfg.runs} out {n_out} temp {temp}: "
                                f"{len(order)} systems{' (+http)' if do_http else ''}")
                            for s in order:
                                body = request_body(prompt_ids, n_out, temp, seed, s.draft_n, bias)
                                if s.kind == "upstream":
                                    self.samples.append(self._upstream(ups[s], s, body, kv, n_out, temp, run))
                                else:
                                    self.samples.append(self._ours_inproc(model, ctx, s, prompt_ids, n_out, temp,
                                                                          seed, bias, kv, run))
                                if do_http:
                                    srv = ups[s] if s.kind == "upstream" else ours_srv[s.mtp]
                                    self.samples.append(self._e2e(srv, s, body, kv, n_out, temp, run))
                            self.meter.sample()
                finally:
                    for srv in list(ups.values()) + list(ours_srv.values()):
                        srv.stop()
                    ctx.close()
        finally:
            model.close()
        noise = self.meter.end()
        noise["matrix_wall_s"] = time.perf_counter() - t_start
        return {"prompt_ids": prompt_ids, "eog_bias_tokens": sorted(bias), "noise": noise}


# --- aggregation ------------------------------------------------------------------------------------

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
    ids vs upstream's ``return_tokens``), over HTTP by text."""
    out = []
    keys = sorted({(s.part, s.kv, s.n_out) for s in samples if s.temp == 0.0 and s.run >= 0})
    for part, kv, n_out in keys:
        ss = [s for s in samples if (s.part, s.kv, s.n_out) == (part, kv, n_out) and s.temp == 0.0 and s.run >= 0]
        if part == "inproc":
            seqs = {s.system + f"#{s.run}": tuple(s.tokens) for s in ss if s.tokens is not None}
        else:
            seqs = {s.system + f"#{s.run}": s.text for s in ss if s.text is not None}
        ref_name = next((k for k in seqs if k.startswith("ours plain")), next(iter(seqs), None))
        ref = seqs.get(ref_name) if ref_name else None
        mismatches = []
        for name, seq in seqs.items():
            if seq != ref:
                first = next((i for i, (a, b) in enumerate(zip(seq, ref)) if a != b), min(len(seq), len(ref)))
                mismatches.append({"system": name, "first_difference": first, "length": len(seq),
                                   "reference_length": len(ref)})
        out.append({"part": part, "kv": kv, "n_out": n_out, "compared": len(seqs), "reference": ref_name,
                    "by": "token ids" if part == "inproc" else "text", "identical": not mismatches,
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


# ================================================================================================
# part 3: cost structure at Gemma 4 shapes
# ================================================================================================

@dataclass(frozen=True)
class Shape:
    """Widths of the random target + assistant pair (``e2b``: the real E2B text widths)."""

    name: str
    vocab: int
    hidden: int          # target backbone width
    ffn: int
    n_head: int
    n_head_kv: int
    hd_swa: int
    hd_full: int
    window: int
    layers: tuple[bool, ...]
    a_hidden: int        # assistant width
    a_ffn: int
    a_n_head: int
    a_layers: tuple[bool, ...]
    n_centroids: int
    top_k: int


SHAPES = {
    # Gemma 4 E2B: text decoder 1536 wide (4 of its layers), assistant 256 wide with 4 layers
    # [S, S, S, F]; head_dim 256 (sliding) / 512 (global), one KV head, vocab 262144, centroid head
    # of 2048 centroids, top-32. The assistant's FFN width (2048) and query heads (4) are our
    # assumption; the per-step cost is dominated by the LM head (262144 x 256) either way.
    "e2b": Shape("e2b", 262144, 1536, 6144, 8, 1, 256, 512, 512, (True, True, True, False),
                 256, 2048, 4, (True, True, True, False), 2048, 32),
    # seconds-long smoke version
    "tiny": Shape("tiny", 4096, 128, 256, 2, 1, 32, 64, 64, (True, True, True, False),
                  64, 128, 2, (True, True, True, False), 64, 4),
}


def _gguf_module() -> Any:
    from .gguf_tools import _gguf

    return _gguf()


def _tokenizer_fields(gguf: Any, src: Path, vocab: int | None) -> list[tuple[str, Any, Any, Any]]:
    """``tokenizer.*`` key/values of ``src``, the vocabulary padded with unused tokens to ``vocab``."""
    reader = gguf.GGUFReader(src)
    out = []
    for key, fld in reader.fields.items():
        if not key.startswith("tokenizer."):
            continue
        value = fld.contents()
        vtype = fld.types[0]
        sub = fld.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        if vocab is not None and key in ("tokenizer.ggml.tokens", "tokenizer.ggml.scores", "tokenizer.ggml.token_type"):
            n_pad = vocab - len(value)
            if key == "tokenizer.ggml.tokens":
                value = list(value) + [f"<unused{i}>" for i in range(n_pad)]
            elif key == "tokenizer.ggml.scores":
                value = list(value) + [0.0] * n_pad
            else:
                value = list(value) + [int(gguf.TokenType.UNUSED)] * n_pad
        out.append((key, value, vtype, sub))
    return out


def _random_matrix(rng: np.random.Generator, shape: tuple[int, int]) -> np.ndarray:
    out = np.empty(shape, dtype=np.float16)
    std = 1.0 / math.sqrt(shape[1])
    step = max(1, (1 << 24) // shape[1])
    for r in range(0, shape[0], step):
        out[r:r + step] = rng.standard_normal((min(step, shape[0] - r), shape[1]), dtype=np.float32) * std
    return out


def _write_gguf(path: Path, arch: str, kv: list[tuple[str, str, Any]], tok: list[tuple[str, Any, Any, Any]],
                tensors: list[tuple[str, tuple[int, ...], Any, Callable[[], np.ndarray]]]) -> None:
    """Write a GGUF tensor by tensor (memory stays at one tensor). ``tensors``: (name, numpy shape,
    numpy dtype, make)."""
    gguf = _gguf_module()
    tmp = path.with_suffix(".tmp")
    w = gguf.GGUFWriter(tmp, arch)
    for kind, key, value in kv:
        getattr(w, f"add_{kind}")(key, value)
    for key, value, vtype, sub in tok:
        w.add_key_value(key, value, vtype, sub_type=sub)
    for name, shape, dtype, _ in tensors:
        raw_dtype = gguf.GGMLQuantizationType.I32 if np.dtype(dtype) == np.int32 else None
        w.add_tensor_info(name, shape, np.dtype(dtype), int(np.prod(shape)) * np.dtype(dtype).itemsize,
                          raw_dtype=raw_dtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    for _, _, _, make in tensors:
        w.write_tensor_data(make())
    w.close()
    tmp.rename(path)


def _common_kv(arch: str, hidden: int, ffn: int, n_head: int, n_head_kv: int, hd_swa: int, hd_full: int,
               window: int, layers: Sequence[bool]) -> list[tuple[str, str, Any]]:
    return [
        ("uint32", f"{arch}.block_count", len(layers)), ("uint32", f"{arch}.context_length", 4096),
        ("uint32", f"{arch}.embedding_length", hidden), ("uint32", f"{arch}.feed_forward_length", ffn),
        ("uint32", f"{arch}.attention.head_count", n_head), ("uint32", f"{arch}.attention.head_count_kv", n_head_kv),
        ("float32", f"{arch}.rope.freq_base", 1_000_000.0), ("float32", f"{arch}.rope.freq_base_swa", 10_000.0),
        ("float32", f"{arch}.attention.layer_norm_rms_epsilon", 1e-6),
        ("uint32", f"{arch}.attention.key_length", hd_full), ("uint32", f"{arch}.attention.value_length", hd_full),
        ("uint32", f"{arch}.attention.key_length_swa", hd_swa), ("uint32", f"{arch}.attention.value_length_swa", hd_swa),
        ("uint32", "general.file_type", 1), ("uint32", f"{arch}.attention.sliding_window", window),
        ("uint32", f"{arch}.embedding_length_per_layer_input", 0),
        ("array", f"{arch}.attention.sliding_window_pattern", list(layers)),
        ("uint32", f"{arch}.rope.dimension_count", hd_full), ("uint32", f"{arch}.rope.dimension_count_swa", hd_swa),
        ("uint32", "general.quantization_version", 2),
    ]


def _layer_tensors(rng: np.random.Generator, i: int, hidden: int, ffn: int, n_head: int, n_head_kv: int, hd: int,
                   with_kv: bool) -> list[tuple[str, tuple[int, ...], Any, Callable[[], np.ndarray]]]:
    def ones(n: int) -> Callable[[], np.ndarray]:
        return lambda: np.ones(n, dtype=np.float32)

    def mat(rows: int, cols: int) -> Callable[[], np.ndarray]:
        return lambda: _random_matrix(rng, (rows, cols))

    f16, f32 = np.float16, np.float32
    t = [
        (f"blk.{i}.attn_norm.weight", (hidden,), f32, ones(hidden)),
        (f"blk.{i}.layer_output_scale.weight", (1,), f32, ones(1)),
        (f"blk.{i}.ffn_down.weight", (hidden, ffn), f16, mat(hidden, ffn)),
        (f"blk.{i}.ffn_gate.weight", (ffn, hidden), f16, mat(ffn, hidden)),
        (f"blk.{i}.ffn_up.weight", (ffn, hidden), f16, mat(ffn, hidden)),
        (f"blk.{i}.post_attention_norm.weight", (hidden,), f32, ones(hidden)),
        (f"blk.{i}.post_ffw_norm.weight", (hidden,), f32, ones(hidden)),
        (f"blk.{i}.ffn_norm.weight", (hidden,), f32, ones(hidden)),
        (f"blk.{i}.attn_output.weight", (hidden, n_head * hd), f16, mat(hidden, n_head * hd)),
        (f"blk.{i}.attn_q_norm.weight", (hd,), f32, ones(hd)),
        (f"blk.{i}.attn_q.weight", (n_head * hd, hidden), f16, mat(n_head * hd, hidden)),
    ]
    if with_kv:
        t += [
            (f"blk.{i}.attn_k_norm.weight", (hd,), f32, ones(hd)),
            (f"blk.{i}.attn_k.weight", (n_head_kv * hd, hidden), f16, mat(n_head_kv * hd, hidden)),
            (f"blk.{i}.attn_v.weight", (n_head_kv * hd, hidden), f16, mat(n_head_kv * hd, hidden)),
        ]
    return t


def _rope_freqs(hd_full: int) -> Callable[[], np.ndarray]:
    n_rot = hd_full // 8  # proportional rope, partial_rotary_factor 0.25
    return lambda: np.array([1.0] * n_rot + [1e30] * (hd_full // 2 - n_rot), dtype=np.float32)


def write_target(path: Path, shape: Shape, tokenizer_src: Path, seed: int = 8) -> None:
    """A random Gemma 4 target of ``shape`` (f16 matrices, tied embeddings)."""
    gguf = _gguf_module()
    arch = "gemma4"
    rng = np.random.default_rng(seed)
    kv = _common_kv(arch, shape.hidden, shape.ffn, shape.n_head, shape.n_head_kv, shape.hd_swa, shape.hd_full,
                     shape.window, shape.layers)
    kv += [("float32", f"{arch}.final_logit_softcapping", 30.0), ("uint32", f"{arch}.attention.shared_kv_layers", 0)]
    tensors: list[Any] = [("rope_freqs.weight", (shape.hd_full // 2,), np.float32, _rope_freqs(shape.hd_full)),
                          ("token_embd.weight", (shape.vocab, shape.hidden), np.float16,
                           lambda: _random_matrix(rng, (shape.vocab, shape.hidden)))]
    for i, swa in enumerate(shape.layers):
        tensors += _layer_tensors(rng, i, shape.hidden, shape.ffn, shape.n_head, shape.n_head_kv,
                                  shape.hd_swa if swa else shape.hd_full, with_kv=True)
    tensors.append(("output_norm.weight", (shape.hidden,), np.float32, lambda: np.ones(shape.hidden, dtype=np.float32)))
    _write_gguf(path, arch, kv, _tokenizer_fields(gguf, tokenizer_src, shape.vocab), tensors)


def write_assistant(path: Path, shape: Shape, target: Path, centroid: bool, seed: int = 9) -> None:
    """A random Gemma 4 assistant of ``shape`` for ``target`` (its tokenizer copied), dense LM
    head or centroid head (``masked_embd_centroids`` + an I32 ``masked_embd_ordering``)."""
    gguf = _gguf_module()
    arch = "gemma4-assistant"
    rng = np.random.default_rng(seed)
    h, bb = shape.a_hidden, shape.hidden
    kv = _common_kv(arch, h, shape.a_ffn, shape.a_n_head, shape.n_head_kv, shape.hd_swa, shape.hd_full,
                    shape.window, shape.a_layers)
    kv += [("uint32", f"{arch}.attention.shared_kv_layers", len(shape.a_layers)),
           ("uint32", f"{arch}.embedding_length_out", bb), ("uint32", f"{arch}.nextn_predict_layers", len(shape.a_layers))]
    if centroid:
        kv += [("uint32", f"{arch}.num_centroids", shape.n_centroids),
               ("uint32", f"{arch}.centroid_intermediate_top_k", shape.top_k)]
    tensors: list[Any] = [("rope_freqs.weight", (shape.hd_full // 2,), np.float32, _rope_freqs(shape.hd_full)),
                          ("token_embd.weight", (shape.vocab, h), np.float16, lambda: _random_matrix(rng, (shape.vocab, h)))]
    for i, swa in enumerate(shape.a_layers):
        tensors += _layer_tensors(rng, i, h, shape.a_ffn, shape.a_n_head, shape.n_head_kv,
                                  shape.hd_swa if swa else shape.hd_full, with_kv=False)
    tensors += [("output_norm.weight", (h,), np.float32, lambda: np.ones(h, dtype=np.float32)),
                ("nextn.post_projection.weight", (bb, h), np.float16, lambda: _random_matrix(rng, (bb, h))),
                ("nextn.pre_projection.weight", (h, 2 * bb), np.float16, lambda: _random_matrix(rng, (h, 2 * bb)))]
    if centroid:
        tensors += [("masked_embd_centroids.weight", (shape.n_centroids, h), np.float16,
                     lambda: _random_matrix(rng, (shape.n_centroids, h))),
                    ("masked_embd_ordering", (shape.vocab,), np.int32,
                     lambda: rng.permutation(shape.vocab).astype(np.int32))]
    _write_gguf(path, arch, kv, _tokenizer_fields(gguf, target, None), tensors)


def _decode_scaling_module() -> Any | None:
    """``bench/decode_scaling.py`` of a source checkout (it builds the E2B-width target), if here."""
    for root in (Path.cwd(), PKG.parent):
        p = root / "bench" / "decode_scaling.py"
        if p.is_file():
            import importlib.util

            spec = importlib.util.spec_from_file_location("_mtp_decode_scaling", p)
            if spec is None or spec.loader is None:
                return None
            mod = importlib.util.module_from_spec(spec)
            try:
                spec.loader.exec_module(mod)
            except Exception as e:  # another engineer's tool: never let it break the benchmark
                log(f"cost: bench/decode_scaling.py not usable ({e}); writing the target here")
                return None
            return mod
    return None


def build_cost_models(cfg: BenchConfig) -> dict[str, Path]:
    """Target + dense assistant + centroid assistant of ``cfg.cost_shape``, cached in
    ``cfg.cost_cache`` (the E2B target is taken from ``bench/decode_scaling.py``'s cache when that
    tool is here: the same widths)."""
    shape = SHAPES[cfg.cost_shape]
    cache = cfg.cost_cache
    cache.mkdir(parents=True, exist_ok=True)
    target = cache / f"{shape.name}-target-f16.gguf"
    if shape.name == "e2b" and not target.is_file():
        ds = _decode_scaling_module()
        if ds is not None and (ds.HIDDEN, ds.VOCAB, tuple(ds.LAYERS)) == (shape.hidden, shape.vocab, shape.layers):
            try:
                log("cost: E2B-width target from bench/decode_scaling.py")
                src = Path(ds.build_models(Path(ds.DEFAULT_CACHE), ["f16"], cfg.threads)["f16"])
                with contextlib.suppress(OSError):
                    target.symlink_to(src.resolve())
            except Exception as e:
                log(f"cost: decode_scaling's build failed ({e}); writing the target here")
    if not target.is_file():
        log(f"cost: writing {target}")
        write_target(target, shape, BUNDLED / "trained-target.gguf")
    paths = {"target": target}
    for kind in ("dense", "centroid"):
        p = cache / f"{shape.name}-assistant-{kind}-f16.gguf"
        if not p.is_file():
            log(f"cost: writing {p}")
            write_assistant(p, shape, target, centroid=(kind == "centroid"))
        paths[kind] = p
    return paths


# --- the Python driver's own time -----------------------------------------------------------------

class _TimedLib:
    """Stands in for the cffi ``lib`` in the binding modules: every call is timed into ``acc``."""

    def __init__(self, lib: Any, acc: list[float]) -> None:
        object.__setattr__(self, "_lib", lib)
        object.__setattr__(self, "_acc", acc)

    def __getattr__(self, name: str) -> Any:
        fn = getattr(self._lib, name)
        if not callable(fn):
            return fn
        acc, pc = self._acc, time.perf_counter

        def timed(*args: Any) -> Any:
            t0 = pc()
            try:
                return fn(*args)
            finally:
                acc[0] += pc() - t0
                acc[1] += 1

        object.__setattr__(self, name, timed)
        return timed


@contextlib.contextmanager
def native_timer() -> Iterator[list[float]]:
    """Time every native (libllama) call the bindings make: yields ``[seconds, calls]``. Patches
    the ``lib`` the binding modules imported; contexts must be created inside (the MTP state
    caches its function pointers)."""
    from . import context as m_context
    from . import model as m_model
    from . import mtp as m_mtp

    acc = [0.0, 0]
    mods = (m_context, m_model, m_mtp)
    saved = [m.lib for m in mods]
    proxy = _TimedLib(saved[0], acc)
    for m in mods:
        m.lib = proxy
    try:
        yield acc
    finally:
        for m, lib in zip(mods, saved):
            m.lib = lib


def driver_overhead(model: Any, prompt_ids: list[int], *, threads: int, n_out: int, draft_ns: Sequence[int],
                    temps: Sequence[float], runs: int, bias: dict[int, float] | None = None,
                    n_ctx: int = 2048) -> list[dict[str, Any]]:
    """Round wall time minus time inside native calls, per round, for plain and MTP generation."""
    rows = []
    with native_timer() as acc:
        ctx = model.create_context(n_ctx=n_ctx, n_threads=threads, flash_attn="off", embeddings=model.has_assistant)
        try:
            model.generate(prompt_ids, context=ctx, max_tokens=8, draft_n_max=draft_ns[0] if draft_ns else 0)
            configs = [("plain", 0, True)] + [(f"mtp depth2 {'on' if d2 else 'off'}", n, d2)
                                              for n in draft_ns for d2 in (False, True)]
            for temp in temps:
                for name, n, d2 in configs:
                    per_round, native_share, rounds_all = [], [], []
                    for run in range(runs):
                        acc[0], acc[1] = 0.0, 0
                        r = model.generate(prompt_ids, context=ctx, max_tokens=n_out, temperature=temp, seed=7 + run,
                                           draft_n_max=n, depth2=d2, logit_bias=bias or None, skip_streak=0)
                        st = r.stats
                        native_s = acc[0]
                        # prompt decode is native too: wall of the generation = t_total
                        driver = max(st.t_total - native_s, 0.0)
                        rounds = max(st.n_rounds, 1)
                        per_round.append(driver / rounds)
                        native_share.append(native_s / st.t_total if st.t_total else 0.0)
                        rounds_all.append(rounds)
                    rows.append({"config": name, "draft_n": n, "temp": temp, "n_out": n_out,
                                 "driver_us_per_round": median(per_round) * 1e6,
                                 "driver_us_per_round_all": [x * 1e6 for x in per_round],
                                 "native_share": median(native_share), "rounds": median(rounds_all),
                                 "native_calls_per_round": acc[1] / max(rounds_all[-1], 1)})
        finally:
            ctx.close()
    return rows


def profile_driver(model: Any, prompt_ids: list[int], *, threads: int, n_out: int, draft_n: int, temp: float,
                   out_path: Path, top: int = 25) -> list[dict[str, Any]]:
    """Where the driver's own time goes: cProfile of MTP generation, top functions by self time
    (native calls show up as the cffi functions they are)."""
    import cProfile
    import pstats

    ctx = model.create_context(n_ctx=2048, n_threads=threads, flash_attn="off", embeddings=True)
    try:
        model.generate(prompt_ids, context=ctx, max_tokens=8, draft_n_max=draft_n)
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(3):
            model.generate(prompt_ids, context=ctx, max_tokens=n_out, temperature=temp, seed=3, draft_n_max=draft_n,
                           depth2=True)
        prof.disable()
    finally:
        ctx.close()
    st = pstats.Stats(prof)
    st.dump_stats(str(out_path))
    rows = []
    for (file, line, fn), (cc, nc, tt, ct, _) in sorted(st.stats.items(), key=lambda kv: -kv[1][2])[:top]:  # type: ignore[attr-defined]
        rows.append({"function": f"{Path(file).name}:{line}({fn})", "calls": nc, "self_ms": tt * 1e3,
                     "cumulative_ms": ct * 1e3})
    return rows


_PYSPY_SCRIPT = """
import sys, time
from mtp_bindings import Model
target, assistant, threads, n_out, draft_n, seconds, prompt, stats_path = sys.argv[1:9]
m = Model(target, assistant=assistant)
ctx = m.create_context(n_ctx=2048, n_threads=int(threads), flash_attn="off", embeddings=True)
ids = m.tokenize(prompt)
bias = {t: -100.0 for t in range(m.n_vocab) if m.is_eog(t)}
m.generate(ids, context=ctx, max_tokens=16, draft_n_max=int(draft_n))
t_end = time.perf_counter() + float(seconds)
rounds = 0
gen_s = 0.0
while time.perf_counter() < t_end:
    r = m.generate(ids, context=ctx, max_tokens=int(n_out), draft_n_max=int(draft_n), depth2=True, logit_bias=bias)
    rounds += r.stats.n_rounds
    gen_s += r.stats.t_total
import json
open(stats_path, "w").write(json.dumps({"rounds": rounds, "gen_s": gen_s}))
"""

_NATIVE_LINE = re.compile(r"\blib\.\w+\(|self\._(?:async|wait|sync)\(")


def py_spy_driver_profile(target: Path, assistant: Path, *, threads: int, n_out: int, draft_n: int, seconds: float,
                          prompt: str, out_dir: Path) -> dict[str, Any] | None:
    """Sample the generation loop with py-spy (when installed): the share of the Python thread's
    time inside native libllama calls, and where the rest -- the driver's own time -- goes (leaf
    source lines, the cffi call lines counted as native)."""
    import linecache

    exe = shutil.which("py-spy")
    if exe is None:
        return None
    script = out_dir / "_pyspy_driver.py"
    script.write_text(_PYSPY_SCRIPT)
    raw = out_dir / "driver_pyspy.txt"
    stats_path = out_dir / "_pyspy_stats.json"
    rate = 1000
    try:
        subprocess.run([exe, "record", "-r", str(rate), "-f", "raw", "-o", str(raw), "--", sys.executable, str(script),
                        str(target), str(assistant), str(threads), str(n_out), str(draft_n), str(seconds), prompt,
                        str(stats_path)],
                       check=True, timeout=seconds * 10 + 120, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                       cwd=tempfile.gettempdir())
    except (subprocess.SubprocessError, OSError) as e:
        log(f"py-spy failed: {e}")
        return None
    finally:
        script.unlink(missing_ok=True)
    frame_re = re.compile(r"^(.*) \((.*):(\d+)\)$")
    total = native = 0
    leaves: dict[str, int] = {}
    by_fn: dict[str, int] = {}
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        frames = stack.split(";")
        if not any(f.startswith("token_rounds ") or f.startswith("_pieces ") for f in frames):
            continue  # setup, imports, the warm-up outside the loop is still inside _pieces: fine
        n = int(count)
        total += n
        m = frame_re.match(frames[-1])
        src = ""
        if m:
            fname, lineno = m.group(2), int(m.group(3))
            path = next((str(Path(p) / fname) for p in sys.path if (Path(p) / fname).is_file()), fname)
            src = linecache.getline(path, lineno).strip()
        if _NATIVE_LINE.search(src):
            native += n
            continue
        key = f"{frames[-1]}: {src[:80]}"
        leaves[key] = leaves.get(key, 0) + n
        # the binding/driver function this Python time belongs to: the deepest mtp_bindings frame
        owner = next((f.split(" (")[0] for f in reversed(frames) if "mtp_bindings/" in f), "?")
        by_fn[owner] = by_fn.get(owner, 0) + n
    raw.unlink(missing_ok=True)
    try:
        st = json.loads(stats_path.read_text())
        stats_path.unlink()
    except (OSError, ValueError):
        st = {}
    if not total:
        return None
    rounds = st.get("rounds") or 0
    us_per_round = (lambda n: n / rate / rounds * 1e6) if rounds else (lambda n: None)
    top = sorted(leaves.items(), key=lambda kv: -kv[1])[:20]
    fns = sorted(by_fn.items(), key=lambda kv: -kv[1])[:15]
    return {"samples": total, "native_share": native / total, "python_share": 1 - native / total,
            "rounds": rounds, "python_us_per_round": us_per_round(total - native),
            "by_function": [{"function": k, "share_of_loop": v / total, "us_per_round": us_per_round(v)} for k, v in fns],
            "top_python_lines": [{"line": k, "share_of_loop": v / total} for k, v in top],
            "note": "py-spy samples of the Python thread inside the generation loop; native = a line calling "
                    "libllama through cffi (decode, MTP submit/wait, logits/embeddings reads, seq_rm, ...)"}


# --- cost measurements ---------------------------------------------------------------------------

def _timeit(fn: Callable[[], Any]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def measure_draft_steps(models: dict[str, Any], *, threads: int, n_prompt: int, steps: Sequence[int], rounds: int,
                        calls: int = 4, seed: int = 5) -> dict[str, Any]:
    """Time of one ``ctx.decode_mtp(n_steps)`` per assistant kind: each round times ``calls``
    calls in a row (their mean), kinds and step counts interleaved; ``ms`` is the best round (the
    machine is shared: the least disturbed round), ``ms_median`` the median round."""
    ctxs, args = {}, {}
    rng = np.random.default_rng(seed)
    for kind, model in models.items():
        ctx = model.create_context(n_ctx=max(1024, n_prompt + 64), n_threads=threads, flash_attn="off", embeddings=True)
        toks = rng.integers(10, min(model.n_vocab, 1000), size=n_prompt).tolist()
        ctx.decode(toks, pos=0)
        x = int(np.argmax(ctx.get_logits(-1)))
        h = ctx.get_embeddings(-1)
        ctxs[kind], args[kind] = ctx, dict(attn_pos=n_prompt - 1, last_token=x, h_prev=h)
        for _ in range(2):
            ctx.decode_mtp(n_steps=max(steps), **args[kind])
    times: dict[str, dict[int, list[float]]] = {k: {n: [] for n in steps} for k in models}
    jobs = [(k, n) for k in models for n in steps]
    order_rng = random.Random(seed)

    def block(k: str, n: int) -> float:
        t0 = time.perf_counter()
        for _ in range(calls):
            ctxs[k].decode_mtp(n_steps=n, **args[k])
        return (time.perf_counter() - t0) / calls

    for _ in range(rounds):
        for k, n in order_rng.sample(jobs, len(jobs)):
            times[k][n].append(block(k, n))
    from .mtp import graph_stats

    out: dict[str, Any] = {}
    for k, ctx in ctxs.items():
        best = {n: min(times[k][n]) for n in steps}
        slope = float(np.polyfit(list(steps), [best[n] for n in steps], 1)[0]) if len(steps) > 1 else best[steps[0]]
        out[k] = {"ms": {str(n): best[n] * 1e3 for n in steps},
                  "ms_median": {str(n): median(times[k][n]) * 1e3 for n in steps},
                  "ms_all": {str(n): [t * 1e3 for t in times[k][n]] for n in steps},
                  "ms_per_step_slope": slope * 1e3, "ms_per_step_at_max": best[max(steps)] / max(steps) * 1e3,
                  "graph_stats": graph_stats(ctx)}
        ctx.close()
    return out


def measure_verify(model: Any, *, threads: int, n_prompt: int, ns: Sequence[int], rounds: int, seed: int = 6) -> dict[str, Any]:
    """Median time of one target decode of n tokens (logits for all, embeddings on as MTP needs),
    and the same plus reading every logits row back (what the driver does)."""
    rng = np.random.default_rng(seed)
    ctx = model.create_context(n_ctx=max(1024, n_prompt + 64), n_threads=threads, flash_attn="off", embeddings=True)
    toks = rng.integers(10, min(model.n_vocab, 1000), size=n_prompt + max(ns)).tolist()
    ctx.decode(toks[:n_prompt], pos=0, logits="none")
    t_dec: dict[int, list[float]] = {n: [] for n in ns}
    t_read: dict[int, list[float]] = {n: [] for n in ns}

    def one(n: int, read: bool) -> float:
        ctx.seq_rm(0, n_prompt, -1)
        t0 = time.perf_counter()
        ctx.decode(toks[n_prompt:n_prompt + n], pos=n_prompt, logits="all")
        if read:
            ctx.get_logits_all()
            ctx.get_embeddings(0)
        return time.perf_counter() - t0

    for n in ns:
        one(n, True)
    order = random.Random(seed)
    jobs = [(n, r) for n in ns for r in (False, True)]
    for _ in range(rounds):
        for n, r in order.sample(jobs, len(jobs)):
            (t_read if r else t_dec)[n].append(one(n, r))
    ctx.close()
    best = {n: min(t_dec[n]) for n in ns}
    best_r = {n: min(t_read[n]) for n in ns}
    return {"ms": {str(n): best[n] * 1e3 for n in ns},
            "ms_with_readback": {str(n): best_r[n] * 1e3 for n in ns},
            "ms_median": {str(n): median(t_dec[n]) * 1e3 for n in ns},
            "ratio_to_1": {str(n): best[n] / best[ns[0]] for n in ns},
            "ratio_to_1_with_readback": {str(n): best_r[n] / best_r[ns[0]] for n in ns},
            "estimator": "best of the rounds (the machine is shared)"}


def measure_prompt_processing(target: Path, assistant: Path, *, threads: int, n_prompt: int, rounds: int,
                              seed: int = 4) -> dict[str, Any]:
    """Ours: prompt-processing tokens/s of an ``n_prompt``-token prompt, interleaved, as the driver
    does it (``GenerationStats.t_prompt`` of ``generate(max_tokens=1)``): the model without an
    assistant vs with the assistant attached and drafting on; and, for reference, one decode of the
    whole prompt with embeddings on (llama.cpp then outputs every prompt row, logits included:
    what the driver did before it decoded all but the last prompt token without embeddings)."""
    from .model import Model

    rng = np.random.default_rng(seed)
    plain = Model(target)
    mtp = Model(target, assistant=assistant)
    toks = rng.integers(10, min(plain.n_vocab, 1000), size=n_prompt).tolist()
    kw = dict(n_ctx=n_prompt + 64, n_batch=n_prompt, n_ubatch=n_prompt, n_threads=threads, flash_attn="off")
    ctxs = {"without assistant": plain.create_context(**kw),
            "with assistant": mtp.create_context(**kw, embeddings=True),
            "with assistant, embeddings on for the whole prompt": mtp.create_context(**kw, embeddings=True)}

    def one(k: str) -> float:
        ctx = ctxs[k]
        if k.endswith("whole prompt"):
            ctx.clear()
            t0 = time.perf_counter()
            ctx.decode(toks, pos=0)
            ctx.get_embeddings(-1)
            return time.perf_counter() - t0
        model = plain if k == "without assistant" else mtp
        r = model.generate(toks, context=ctx, max_tokens=1, draft_n_max=0 if model is plain else 2)
        return r.stats.t_prompt

    for k in ctxs:
        one(k)
    times: dict[str, list[float]] = {k: [] for k in ctxs}
    order = random.Random(seed)
    for _ in range(rounds):
        for k in order.sample(list(ctxs), len(ctxs)):
            times[k].append(one(k))
    for c in ctxs.values():
        c.close()
    plain.close()
    mtp.close()
    tps = {k: n_prompt / median(v) for k, v in times.items()}
    return {"n_prompt": n_prompt, "tokens_per_s": tps, "tokens_per_s_all": {k: [n_prompt / t for t in v] for k, v in times.items()},
            "ratio_with_vs_without": tps["with assistant"] / tps["without assistant"],
            "ratio_whole_prompt_embeddings_vs_without": tps["with assistant, embeddings on for the whole prompt"]
            / tps["without assistant"]}


_STATS_RE = re.compile(r"statistics\s+draft-mtp: #calls\(b,g,a\) =\s*(\d+)\s+(\d+)\s+(\d+), #gen drafts =\s*(\d+), "
                       r"#acc drafts =\s*(\d+), #gen tokens =\s*(\d+), #acc tokens =\s*(\d+).*?"
                       r"dur\(b,g,a\) = ([\d.]+), ([\d.]+), ([\d.]+) ms")
_BUF_RE = re.compile(r"(\w+):\s+(\S+)\s+((?:MTP )?(?:model|KV|compute|output|RS)) buffer size =\s+([\d.]+) MiB")


def _parse_spec_stats(log_text: str) -> list[list[float]]:
    return [[float(x) for x in m] for m in _STATS_RE.findall(log_text)]


def _buffers(log_text: str) -> list[dict[str, Any]]:
    """The buffer sizes llama.cpp logged (the 0-MiB lines of its memory-fitting dry run left out)."""
    return [{"where": a, "buffer": b, "kind": c, "mib": float(d)} for a, b, c, d in _BUF_RE.findall(log_text)
            if float(d) > 0.0]


def upstream_draft_times(cfg: BenchConfig, target: Path, assistant: Path, log_dir: Path, *, steps: Sequence[int],
                         prompt: list[int], extra: Sequence[str] = (), memory: dict[str, Any] | None = None) -> dict[str, Any]:
    """Upstream's draft time per call and per step from its own counters (``dur(b,g,a)`` with
    ``-v``): one server per n_max, one at a time; a warm-up request, then up to 3 timed requests,
    the best one kept. With random weights every draft is rejected, so each round drafts n
    tokens. ``memory``: filled with the buffers the last server logged."""
    out: dict[str, Any] = {}
    for n in steps:
        port = free_port()
        name = f"upstream-draft-{target.stem}-{n}{'-' + '_'.join(x.strip('-') for x in extra if x.startswith('--')) if extra else ''}"
        srv = ServerProcess(name, upstream_argv(target, port, threads=cfg.threads, n_ctx=1024, kv="f16",
                                                assistant=assistant, draft_n=n, verbose=True, extra=list(extra)),
                            port, log_dir)
        deltas = []
        try:
            srv.wait_ready()
            body = {"prompt": prompt, "n_predict": cfg.upstream_steps_tokens, "temperature": 0.0, "cache_prompt": False}
            srv.client.request("POST", "/completion", body)
            time.sleep(0.3)
            for _ in range(max(1, min(cfg.cost_rounds, 3))):
                before = _parse_spec_stats(srv.log_text())
                srv.client.request("POST", "/completion", body)
                time.sleep(0.3)
                after = _parse_spec_stats(srv.log_text())
                if after and len(after) > len(before):
                    prev = before[-1] if before else [0.0] * 10
                    deltas.append([c - p for c, p in zip(after[-1], prev)])
        finally:
            srv.stop()
        if memory is not None and n == max(steps):
            # the buffers llama.cpp logged (-v): the target's, then the draft model's and its context's
            text = srv.log_text()
            cut = text.find("loading draft model")
            memory["buffers_target"] = _buffers(text[:cut] if cut >= 0 else text)
            memory["buffers_draft"] = _buffers(text[cut:]) if cut >= 0 else []
        deltas = [d for d in deltas if d[1] > 0 and d[5] > 0]
        if not deltas:
            out[str(n)] = {"error": "no statistics line in llama-server's log"}
            continue
        d = min(deltas, key=lambda d: d[8] / d[1])  # best request (least disturbed), as for ours
        calls, gen_tokens, t_draft_ms = d[1], d[5], d[8]
        out[str(n)] = {"calls": calls, "gen_tokens": gen_tokens, "t_draft_ms": t_draft_ms,
                       "ms_per_call": t_draft_ms / calls, "ms_per_step": t_draft_ms / gen_tokens,
                       "ms_per_call_all": [x[8] / x[1] for x in deltas], "acceptance": d[6] / gen_tokens}
    return out


def upstream_costs(cfg: BenchConfig, paths: dict[str, Path], log_dir: Path, *, n_prompt: int) -> dict[str, Any]:
    """Upstream's draft-mtp on the dense assistant: draft time per step from its own counters
    (``dur(b,g,a)`` with ``-v``; one server per n_max and weight layout, one at a time), prompt
    processing with and without ``-md`` (interleaved), server RSS and its buffer sizes (the
    second context's included)."""
    from .model import Model

    with Model(paths["target"], vocab_only=True) as m:
        rng = np.random.default_rng(3)
        pp_prompt = rng.integers(10, min(m.n_vocab, 1000), size=n_prompt).tolist()
        gen_prompt = pp_prompt[:64]
    out: dict[str, Any] = {"pp": {}, "memory": {}}
    steps = (1, 2, 3, 4) if cfg.mode != "smoke" else (2,)
    batch = ["-ub", str(n_prompt), "-b", str(n_prompt)]
    layouts = [("draft", [])] + ([("draft_no_repack", ["--no-repack"])] if cfg.mode != "smoke" else [])
    for key, layout in layouts:
        out[key] = upstream_draft_times(cfg, paths["target"], paths["dense"], log_dir, steps=steps, prompt=gen_prompt,
                                        extra=batch + layout, memory=out["memory"] if key == "draft" else None)
    # prompt processing, plain vs draft-mtp (default layout), interleaved
    servers: dict[str, ServerProcess] = {}
    try:
        for k, assistant in (("without assistant", None), ("with assistant", paths["dense"])):
            port = free_port()
            servers[k] = ServerProcess(f"cost-upstream-pp-{k.split()[0]}", upstream_argv(
                paths["target"], port, threads=cfg.threads, n_ctx=1024, kv="f16", assistant=assistant,
                draft_n=max(steps), extra=batch), port, log_dir)
        for srv in servers.values():
            srv.wait_ready()
        body = {"prompt": pp_prompt, "n_predict": 1, "temperature": 0.0, "cache_prompt": False}
        for srv in servers.values():
            srv.client.request("POST", "/completion", body)
        pp: dict[str, list[float]] = {k: [] for k in servers}
        order = random.Random(1)
        for _ in range(max(cfg.cost_rounds, 3)):
            for k in order.sample(list(pp), 2):
                status, payload, _ = servers[k].client.request("POST", "/completion", body)
                pp[k].append(float(payload["timings"]["prompt_per_second"]))
        tps = {k: median(v) for k, v in pp.items()}
        out["pp"] = {"n_prompt": n_prompt, "tokens_per_s": tps, "tokens_per_s_all": pp,
                     "ratio_with_vs_without": tps["with assistant"] / tps["without assistant"]}
        for k, srv in servers.items():
            out["memory"][k] = {"rss_mib": rss_bytes(srv.pid) / 2**20}
    finally:
        for srv in servers.values():
            srv.stop()
    if "with assistant" in out["memory"] and "without assistant" in out["memory"]:
        out["memory"]["rss_delta_mib"] = (out["memory"]["with assistant"]["rss_mib"]
                                          - out["memory"]["without assistant"]["rss_mib"])
    return out


def _memory_worker(target: str, assistant: str, threads: int) -> dict[str, Any]:
    """Run in a fresh process: RSS before/after attaching the assistant and after its first
    draft, and the buffer sizes llama.cpp logs (ours: the MTP scheduler's compute buffer)."""
    import logging

    from .model import Model

    lines: list[str] = []

    class Grab(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append(record.getMessage())

    lg = logging.getLogger("mtp_bindings.native")
    lg.addHandler(Grab())
    lg.setLevel(logging.DEBUG)
    lg.propagate = False
    out: dict[str, Any] = {}
    model = Model(target, verbose=True)
    ctx = model.create_context(n_ctx=1024, n_threads=threads, flash_attn="off", embeddings=True)
    toks = list(range(10, 138))
    ctx.decode(toks, pos=0)
    ctx.decode([11], pos=len(toks))
    out["rss_target_mib"] = rss_bytes() / 2**20
    n0 = len(lines)
    model.attach_assistant(assistant)
    out["rss_attached_mib"] = rss_bytes() / 2**20
    h = ctx.get_embeddings(-1)
    ctx.decode_mtp(attn_pos=len(toks), last_token=12, h_prev=h, n_steps=4)
    out["rss_after_draft_mib"] = rss_bytes() / 2**20
    out["rss_delta_mib"] = out["rss_after_draft_mib"] - out["rss_target_mib"]
    out["assistant_file_mib"] = Path(assistant).stat().st_size / 2**20
    out["buffers_target"] = _buffers("\n".join(lines[:n0]))
    out["buffers_assistant"] = _buffers("\n".join(lines[n0:]))
    out["kv_buffers_added"] = [b for b in out["buffers_assistant"] if b["kind"] == "KV"]
    ctx.close()
    model.close()
    return out


def measure_memory_ours(target: Path, assistant: Path, threads: int) -> dict[str, Any]:
    code = ("import json,sys; from mtp_bindings.benchmark import _memory_worker; "
            "print('@@' + json.dumps(_memory_worker(sys.argv[1], sys.argv[2], int(sys.argv[3]))))")
    r = subprocess.run([sys.executable, "-c", code, str(target.resolve()), str(assistant.resolve()), str(threads)],
                       capture_output=True, text=True, timeout=900, cwd=tempfile.gettempdir())
    for line in r.stdout.splitlines():
        if line.startswith("@@"):
            return json.loads(line[2:])
    return {"error": f"memory worker failed ({r.returncode}): {r.stderr[-2000:]}"}


@contextlib.contextmanager
def weight_layout(repack: bool) -> Iterator[None]:
    """Load models with (llama.cpp's default) or without its extra weight buffer types -- the
    repacked CPU layouts, AMX where the CPU has it; ``llama-server --no-repack`` is the same
    switch. The bindings do not expose it, so ``llama_model_default_params`` is patched for the
    models (targets and assistants) loaded inside."""
    from . import model as m_model
    from . import mtp as m_mtp

    if repack:
        yield
        return
    mods = (m_model, m_mtp)
    saved = [m.lib for m in mods]

    class _Lib:
        def __getattr__(self, name: str) -> Any:
            if name == "llama_model_default_params":
                def params() -> Any:
                    p = saved[0].llama_model_default_params()
                    p.use_extra_bufts = False
                    return p
                return params
            return getattr(saved[0], name)

    for m in mods:
        m.lib = _Lib()
    try:
        yield
    finally:
        for m, lib in zip(mods, saved):
            m.lib = lib


def _try_draft_subprocess(target: Path, assistant: Path, threads: int) -> dict[str, Any]:
    """One MTP draft in a fresh process (a native abort must not take the benchmark down)."""
    code = ("import sys; from mtp_bindings import Model; m = Model(sys.argv[1], assistant=sys.argv[2]); "
            "c = m.create_context(n_ctx=512, n_threads=int(sys.argv[3]), flash_attn='off', embeddings=True); "
            "c.decode(list(range(10, 42)), pos=0); "
            "print('drafts', c.decode_mtp(attn_pos=31, last_token=12, h_prev=c.get_embeddings(-1), n_steps=2)[0])")
    try:
        r = subprocess.run([sys.executable, "-c", code, str(target), str(assistant), str(threads)], capture_output=True,
                           text=True, timeout=600, cwd=tempfile.gettempdir(), env={**os.environ, "GGML_NO_BACKTRACE": "1"})
    except subprocess.TimeoutExpired:
        return {"ok": False, "error": "timed out"}
    if r.returncode == 0 and "drafts" in r.stdout:
        return {"ok": True}
    why = next((line.strip() for line in r.stderr.splitlines() if "GGML_ASSERT" in line or "error" in line.lower()),
               r.stderr.strip().splitlines()[-1] if r.stderr.strip() else f"exit {r.returncode}")
    return {"ok": False, "returncode": r.returncode, "error": why}


def run_cost(cfg: BenchConfig, log_dir: Path, acceptance: dict[str, Any] | None) -> dict[str, Any]:
    """The cost part. Weight layouts: llama.cpp's default (``repack``: extra buffer types, AMX on
    this kind of CPU) and ``no-repack``; the centroid head runs only without repacking (with it,
    libllama aborts: reported in ``centroid_repack``)."""
    from .model import Model

    shape = SHAPES[cfg.cost_shape]
    paths = build_cost_models(cfg)
    res: dict[str, Any] = {"shape": asdict(shape), "files": {k: str(v) for k, v in paths.items()},
                           "file_mib": {k: v.stat().st_size / 2**20 for k, v in paths.items()}}
    meter = CpuMeter()
    meter.begin()
    steps = (1, 2, 3, 4)
    n_prompt = 128 if cfg.mode != "smoke" else 32
    rounds = cfg.cost_rounds if cfg.mode != "smoke" else 2

    log("cost: does the centroid head run with repacked weights? (subprocess)")
    res["centroid_repack"] = _try_draft_subprocess(paths["target"], paths["centroid"], cfg.threads)
    log("cost: our draft steps (dense vs centroid head; repack and no-repack)")
    models: dict[str, Any] = {}
    try:
        with weight_layout(True):
            models["dense"] = Model(paths["target"], assistant=paths["dense"])
            if res["centroid_repack"]["ok"]:
                models["centroid"] = Model(paths["target"], assistant=paths["centroid"])
        with weight_layout(False):
            models["dense no-repack"] = Model(paths["target"], assistant=paths["dense"])
            models["centroid no-repack"] = Model(paths["target"], assistant=paths["centroid"])
        res["draft_ours"] = measure_draft_steps(models, threads=cfg.threads, n_prompt=n_prompt, steps=steps,
                                                rounds=max(rounds, 3))
        log("cost: verify 1..5 tokens")
        res["verify"] = measure_verify(models["dense"], threads=cfg.threads, n_prompt=n_prompt, ns=(1, 2, 3, 4, 5),
                                       rounds=max(rounds, 3))
        res["verify_no_repack"] = measure_verify(models["dense no-repack"], threads=cfg.threads, n_prompt=n_prompt,
                                                 ns=(1, 2, 3, 4, 5), rounds=max(rounds, 3))
        log(f"cost: Python driver time per round ({shape.name} shape)")
        rng = np.random.default_rng(2)
        prompt = rng.integers(10, 1000, size=32).tolist()
        n_drv = 24 if cfg.mode != "smoke" else 8
        res["driver_e2b"] = {k: driver_overhead(models[k], prompt, threads=cfg.threads, n_out=n_drv, draft_ns=(2,),
                                                temps=(0.0,), runs=1 if cfg.mode != "full" else 2)
                             for k in ("dense", "centroid no-repack")}
    finally:
        for m in models.values():
            m.close()

    log("cost: prompt processing with/without the assistant (ours)")
    n_pp = 512 if cfg.mode != "smoke" else 64
    res["pp_ours"] = measure_prompt_processing(paths["target"], paths["dense"], threads=cfg.threads, n_prompt=n_pp,
                                               rounds=max(rounds, 3))
    log("cost: upstream draft-mtp (draft steps, prompt processing, memory)")
    try:
        res["upstream"] = upstream_costs(cfg, paths, log_dir, n_prompt=n_pp)
    except Exception as e:  # keep the rest of the results
        res["upstream"] = {"error": f"{type(e).__name__}: {e}"}
        log(f"cost: upstream part failed: {e}")
    log("cost: memory of attaching an assistant (ours)")
    res["memory_ours"] = measure_memory_ours(paths["target"], paths["dense"], cfg.threads)
    n_vocab, n_bb = shape.vocab, shape.hidden
    res["bytes_per_draft_step"] = {
        "ours": 4 + 4 * n_bb,
        "upstream_cpu_sampling": 4 * n_vocab + 4 * n_bb,
        "upstream_backend_topk10": 4 + 2 * 4 * 10 + 4 * n_bb,
        "note": "ours: the argmax token (4 B) and the next h (4*n_embd_backbone) per step (patch 0003); upstream "
                "reads the [n_vocab] logits row (4*n_vocab) and the h row per step, or with its default backend "
                "sampling (top-k 10 in the graph) the sampled token and 10 candidates/logits; computed from the "
                "code paths, not measured",
    }
    res["noise"] = meter.end()
    return res


# --- expected speedup ---------------------------------------------------------------------------

def leviathan_tokens_per_round(a: float, k: int) -> float:
    """Expected tokens per round with i.i.d. acceptance ``a`` and ``k`` drafts (Leviathan et al.)."""
    if a >= 1.0:
        return k + 1.0
    return (1.0 - a ** (k + 1)) / (1.0 - a)


def expected_speedup(a: float, k: int, t_draft_step: float, t_verify: dict[int, float], t_driver_round: float = 0.0,
                     t_driver_plain: float = 0.0, tokens_per_round: float | None = None) -> dict[str, float]:
    """Speedup over plain decoding:

    ``S(k) = E(k) * (T_v(1) + t_py,plain) / (k * t_d + T_v(k+1) + t_py,round)``

    with ``E(k) = (1 - a^(k+1)) / (1 - a)`` (or the measured tokens per round), ``t_d`` one draft
    step, ``T_v(n)`` one target decode of n tokens. Leviathan et al.'s own form takes
    ``T_v(k+1) = T_v(1)`` and no driver time: ``S = E(k) / (k c + 1)``, ``c = t_d / T_v(1)``.
    """
    e = tokens_per_round if tokens_per_round is not None else leviathan_tokens_per_round(a, k)
    v1 = t_verify[1]
    vk = t_verify.get(k + 1, v1)
    c = t_draft_step / v1
    return {"E_tokens_per_round": e, "c": c,
            "leviathan": e / (k * c + 1.0),
            "with_verify_and_driver": e * (v1 + t_driver_plain) / (k * t_draft_step + vk + t_driver_round)}


# ================================================================================================
# report
# ================================================================================================

def _fmt(x: Any, nd: int = 1) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    if isinstance(x, float):
        return f"{x:.{nd}f}"
    return str(x)


def matrix_table(rows: Sequence[dict[str, Any]], part: str) -> str:
    head = ("| KV | out | temp | system | tokens/s (median) | best | spread | tokens/CPU-s | acceptance | tokens/round | "
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


def targets(result: dict[str, Any]) -> list[dict[str, Any]]:
    """Issue 6's targets with the measured figures."""
    out: list[dict[str, Any]] = []
    for part in ("inproc", "http"):
        rows = result.get(part, {}).get("rows", [])
        cells = sorted({(r["kv"], r["n_out"]) for r in rows if r["temp"] == 0.0})
        where = "in process" if part == "inproc" else "over HTTP"
        for kv, n_out in cells:
            cell = [r for r in rows if (r["kv"], r["n_out"], r["temp"]) == (kv, n_out, 0.0)]
            figs = {}
            for stat in ("tokens_per_s", "tokens_per_s_best", "tokens_per_cpu_s"):
                ok = [r for r in cell if r.get(stat) is not None and not math.isnan(r[stat])]
                ours = max((r for r in ok if r["family"].startswith("ours MTP")), key=lambda r: r[stat], default=None)
                up = max((r for r in ok if r["family"] == "upstream draft-mtp"), key=lambda r: r[stat], default=None)
                plain = next((r for r in ok if r["family"] == "ours plain"), None)
                figs[stat] = (ours, up, plain)

            def ratio(stat: str, i: int) -> str:
                o, other = figs[stat][0], figs[stat][i]
                return f"{o[stat] / other[stat]:.2f}x ({o['system']})" if o and other else "-"

            om, um, pm = figs["tokens_per_s"]
            if om and um:
                x = om["tokens_per_s"] / um["tokens_per_s"]
                out.append({"target": f"{where}, temp 0, KV {kv}, {n_out} tokens: our best MTP >= 1.5x upstream's best draft-mtp",
                            "measured": f"median {x:.2f}x ({om['system']} {om['tokens_per_s']:.0f} vs {um['system']} "
                                        f"{um['tokens_per_s']:.0f} tokens/s); best-of-runs {ratio('tokens_per_s_best', 1)}; "
                                        f"per CPU-second {ratio('tokens_per_cpu_s', 1)}",
                            "met": x >= 1.5})
            if om and pm:
                x = om["tokens_per_s"] / pm["tokens_per_s"]
                out.append({"target": f"{where}, temp 0, KV {kv}, {n_out} tokens: our best MTP >= 1.0x our plain",
                            "measured": f"median {x:.2f}x ({om['system']} vs ours plain {pm['tokens_per_s']:.0f} tokens/s); "
                                        f"best-of-runs {ratio('tokens_per_s_best', 2)}; per CPU-second {ratio('tokens_per_cpu_s', 2)}",
                            "met": x >= 1.0})
    cost = result.get("cost")
    if cost:
        d = cost.get("draft_ours", {})
        for dk, ck, note in (("dense no-repack", "centroid no-repack", "no-repack"), ("dense", "centroid", "repack")):
            if dk in d and ck in d:
                x = d[ck]["ms_per_step_at_max"] / d[dk]["ms_per_step_at_max"]
                out.append({"target": f"centroid head draft step <= 0.4x dense head (E2B shape, {note} weights)",
                            "measured": f"{x:.2f}x ({d[ck]['ms_per_step_at_max']:.2f} vs {d[dk]['ms_per_step_at_max']:.2f} ms/step at 4 steps)",
                            "met": x <= 0.4})
        cr = cost.get("centroid_repack")
        if cr and not cr.get("ok"):
            out.append({"target": "centroid head draft step with llama.cpp's default (repacked/AMX) weights",
                        "measured": f"aborts: {cr.get('error')}", "met": False})
        ups = cost.get("upstream", {})
        for dk, uk, note in (("dense", "draft", "repack"), ("dense no-repack", "draft_no_repack", "no-repack")):
            u4 = ups.get(uk, {}).get("4", {})
            if dk in d and u4.get("ms_per_step"):
                x = d[dk]["ms_per_step_at_max"] / u4["ms_per_step"]
                out.append({"target": f"our dense draft step <= upstream's (same GGUF, {note} weights)",
                            "measured": f"{x:.2f}x ({d[dk]['ms_per_step_at_max']:.2f} vs {u4['ms_per_step']:.2f} ms/step at 4 steps)",
                            "met": x <= 1.0})
        drv = result.get("driver", {}).get("rows", [])
        mtp_rows = [r for r in drv if r["config"].startswith("mtp") and r["temp"] == 0.0]
        if mtp_rows:
            best = min(r["driver_us_per_round"] for r in mtp_rows)
            worst = max(r["driver_us_per_round"] for r in mtp_rows)
            out.append({"target": "Python driver time <= 30 us per round (trained pair, temp 0)",
                        "measured": f"{best:.0f}..{worst:.0f} us per round", "met": worst <= 30})
        pp = cost.get("pp_ours", {})
        if pp:
            wp = pp.get("ratio_whole_prompt_embeddings_vs_without")
            out.append({"target": "prompt processing with an assistant attached >= 0.95x without (ours, E2B shape)",
                        "measured": f"{pp['ratio_with_vs_without']:.3f}x through the driver"
                                    + (f" ({wp:.3f}x with the whole prompt decoded with embeddings on, the driver's way "
                                       "before 2e620ae)" if wp else ""),
                        "met": pp["ratio_with_vs_without"] >= 0.95})
        upp = cost.get("upstream", {}).get("pp", {})
        if upp:
            out.append({"target": "(reference) upstream prompt processing with -md draft-mtp vs without",
                        "measured": f"{upp['ratio_with_vs_without']:.3f}x", "met": None})
        mem = cost.get("memory_ours", {})
        if "rss_delta_mib" in mem:
            kv_added = mem.get("kv_buffers_added", [])
            out.append({"target": "attaching an assistant adds weights + compute buffers, no KV cache",
                        "measured": f"RSS +{mem['rss_delta_mib']:.0f} MiB (assistant file {mem['assistant_file_mib']:.0f} MiB); "
                                    f"KV buffers added: {len(kv_added)}",
                        "met": not kv_added})
    return out


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
    merged = result.get("merged_from_earlier_run")
    if merged:
        lines += [f"Kept from the run started {merged.get('started')}: " + ", ".join(f"`{k}`" for k in merged["keys"]) +
                  " (this run measured the other parts).", ""]
    tg = result.get("targets", [])
    if tg:
        lines += ["## Targets (issue 6)", "", "| target | measured | met |", "|---|---|---|"]
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
                status = "identical" if i["identical"] else "**differs**: " + ", ".join(
                    f"{m['system']} from token {m['first_difference']}" for m in i["mismatches"][:8])
                lines.append(f"* KV {i['kv']}, {i['n_out']} tokens ({i['compared']} outputs, by {i['by']}): {status}")
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
                  "| KV | out | temp | system | round | draft | verify | sample | other | tokens/round |",
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
              "upstream plain": "tab:red", "ours plain": "tab:blue"}
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
            for fam in ("upstream draft-mtp", "ours MTP depth2 off", "ours MTP depth2 on"):
                pts = sorted((r["draft_n"], r["tokens_per_s"]) for r in cr if r["family"] == fam)
                if pts:
                    ax.plot(*zip(*pts), marker="o", label=fam, color=colors[fam],
                            linestyle="--" if fam.endswith("off") else "-")
            for fam, ls in (("upstream plain", ":"), ("ours plain", "-.")):
                pl = [r["tokens_per_s"] for r in cr if r["family"] == fam]
                if pl:
                    ax.axhline(pl[0], color=colors[fam], linestyle=ls, label=fam)
            ax.set_title(f"KV {cell[0]}, {cell[1]} tokens, T={cell[2]}", fontsize=9)
            ax.set_xlabel("draft_n_max")
            ax.set_ylabel(ylabel)
            ax.set_ylim(bottom=0)
        for ax in list(axes.flat)[len(cells):]:
            ax.axis("off")
        axes.flat[0].legend(fontsize=7)
        fig.tight_layout()
        p = out_dir / f"{part}_tokens_per_s.png"
        fig.savefig(p, dpi=110)
        plt.close(fig)
        files.append(p.name)
    sec = result.get("inproc")
    if sec and sec["rows"]:
        fig, ax = plt.subplots(figsize=(5.5, 3.8))
        for fam in ("upstream draft-mtp", "ours MTP depth2 on"):
            for temp, ls in ((0.0, "-"), (0.7, "--")):
                pts: dict[int, list[float]] = {}
                for r in sec["rows"]:
                    if r["family"] == fam and r["temp"] == temp and r["acceptance"] is not None:
                        pts.setdefault(r["draft_n"], []).append(r["acceptance"])
                if pts:
                    xs = sorted(pts)
                    ax.plot(xs, [float(np.mean(pts[x])) for x in xs], marker="o", linestyle=ls, color=colors[fam],
                            label=f"{fam}, T={temp}")
        ax.set_xlabel("draft_n_max")
        ax.set_ylabel("acceptance (accepted / drafted)")
        ax.set_ylim(0, 1)
        ax.legend(fontsize=7)
        fig.tight_layout()
        p = out_dir / "acceptance.png"
        fig.savefig(p, dpi=110)
        plt.close(fig)
        files.append(p.name)
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
        fig.tight_layout()
        p = out_dir / "cost_structure.png"
        fig.savefig(p, dpi=110)
        plt.close(fig)
        files.append(p.name)
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
        fig.tight_layout()
        p = out_dir / "expected_speedup.png"
        fig.savefig(p, dpi=110)
        plt.close(fig)
        files.append(p.name)
    return files


# ================================================================================================
# the run
# ================================================================================================

_OMP_AB_SCRIPT = """
import json, sys, time
from mtp_bindings import Model
m = Model(sys.argv[1], assistant=sys.argv[2])
ctx = m.create_context(n_ctx=1024, n_threads=int(sys.argv[3]), flash_attn="off", embeddings=True)
ctx.decode(list(range(10, 42)), pos=0)
h = ctx.get_embeddings(-1)
def best(f, n=200):
    f()
    ts = []
    for _ in range(n):
        t0 = time.perf_counter(); f(); ts.append(time.perf_counter() - t0)
    ts.sort()
    return ts[0] * 1e3
def dec1():
    ctx.seq_rm(0, 32, -1); ctx.decode([11], pos=32)
def dec3():
    ctx.seq_rm(0, 32, -1); ctx.decode([11, 12, 13], pos=32, logits="all")
r = {"decode 1 token": best(dec1), "decode 3 tokens": best(dec3)}
ctx.seq_rm(0, 32, -1)
r["draft 1 step"] = best(lambda: ctx.decode_mtp(attn_pos=31, last_token=12, h_prev=h, n_steps=1))
r["draft 4 steps"] = best(lambda: ctx.decode_mtp(attn_pos=31, last_token=12, h_prev=h, n_steps=4))
print("@@" + json.dumps(r))
"""


def omp_policy_ab(target: Path, assistant: Path, threads: int) -> list[dict[str, Any]]:
    """Best-of-200 latency (ms) of small graphs under each OMP_WAIT_POLICY and 1 vs ``threads``
    threads: what the passive policy used for the matrix costs when nothing else runs."""
    rows = []
    for policy in ("active", "passive"):
        for nt in sorted({1, threads}):
            env = {**os.environ, "OMP_WAIT_POLICY": policy}
            try:
                r = subprocess.run([sys.executable, "-c", _OMP_AB_SCRIPT, str(target), str(assistant), str(nt)],
                                   capture_output=True, text=True, timeout=300, env=env, cwd=tempfile.gettempdir())
                line = next((x for x in r.stdout.splitlines() if x.startswith("@@")), None)
                rows.append({"policy": policy, "threads": nt, **(json.loads(line[2:]) if line else {"error": r.stderr[-300:]})})
            except subprocess.SubprocessError as e:
                rows.append({"policy": policy, "threads": nt, "error": str(e)})
    return rows


def _trained_costs(cfg: BenchConfig, log_dir: Path) -> dict[str, Any]:
    """Draft step and verify costs of the matrix's own pair (for its expected speedup), and
    upstream's draft time on it."""
    from .model import Model

    with Model(cfg.target, assistant=cfg.assistant) as m:
        d = measure_draft_steps({"dense": m}, threads=cfg.threads, n_prompt=32, steps=(1, 2, 3, 4),
                                rounds=max(cfg.cost_rounds, 5), calls=8)
        v = measure_verify(m, threads=cfg.threads, n_prompt=32, ns=(1, 2, 3, 4, 5), rounds=max(cfg.cost_rounds, 5))
        prompt = m.tokenize(cfg.prompt)
    out = {"draft": d["dense"], "verify": v}
    out["omp_policy"] = omp_policy_ab(cfg.target, cfg.assistant, cfg.threads)
    try:
        out["upstream_draft"] = upstream_draft_times(cfg, cfg.target, cfg.assistant, log_dir,
                                                     steps=cfg.draft_ns or (2,), prompt=prompt)
    except Exception as e:
        out["upstream_draft"] = {"error": f"{type(e).__name__}: {e}"}
    return out


def speedup_table(result: dict[str, Any], cfg: BenchConfig) -> dict[str, Any]:
    rows = result.get("inproc", {}).get("rows", [])
    drv = {(r["config"], r["draft_n"]): r["driver_us_per_round"] * 1e-6
           for r in result.get("driver", {}).get("rows", []) if r["temp"] == 0.0}
    out_rows = []
    kv, n_out = cfg.kv_types[0], max(cfg.outputs)

    def cell(fam: str, k: int) -> dict[str, Any] | None:
        return next((r for r in rows if r["family"] == fam and r["draft_n"] == k and r["kv"] == kv
                     and r["n_out"] == n_out and r["temp"] == 0.0), None)

    tc = result.get("trained_costs")
    cost = result.get("cost")
    for k in cfg.draft_ns:
        d2, sync = cell("ours MTP depth2 on", k), cell("ours MTP depth2 off", k)
        if not d2 or d2["acceptance"] is None:
            continue
        a = d2["acceptance"]
        models = []
        if tc:
            models.append(("matrix pair", tc["draft"]["ms_per_step_slope"] / 1e3,
                           {int(n): ms / 1e3 for n, ms in tc["verify"]["ms_with_readback"].items()}, True))
        dd = (cost or {}).get("draft_ours", {})
        for dk, vk, name in (("dense", "verify", "E2B dense head, repack"),
                             ("centroid", "verify", "E2B centroid head, repack"),
                             ("dense no-repack", "verify_no_repack", "E2B dense head, no-repack"),
                             ("centroid no-repack", "verify_no_repack", "E2B centroid head, no-repack")):
            if dk in dd and cost.get(vk):
                models.append((name, dd[dk]["ms_per_step_slope"] / 1e3,
                               {int(n): ms / 1e3 for n, ms in cost[vk]["ms_with_readback"].items()}, False))
        drv_e2b: dict[str, float] = {}
        for rr in (cost or {}).get("driver_e2b", {}).get("dense", []):
            drv_e2b[rr["config"]] = rr["driver_us_per_round"] * 1e-6
        for name, td, tv, measured in models:
            t_round = drv.get(("mtp depth2 on", k), 0.0) if measured else drv_e2b.get("mtp depth2 on", 0.0)
            t_plain = drv.get(("plain", 0), 0.0) if measured else drv_e2b.get("plain", 0.0)
            e = expected_speedup(a, k, max(td, 0.0), tv, t_driver_round=t_round, t_driver_plain=t_plain)
            em = expected_speedup(a, k, max(td, 0.0), tv, t_driver_round=t_round, t_driver_plain=t_plain,
                                  tokens_per_round=d2["mean_tokens_per_round"]) if d2["mean_tokens_per_round"] else None
            row = {"model": name, "k": k, "a": a, "E_iid": e["E_tokens_per_round"], "E_measured": d2["mean_tokens_per_round"],
                   "c": e["c"], "leviathan": e["leviathan"], "with_verify_and_driver": e["with_verify_and_driver"],
                   "with_measured_E": em["with_verify_and_driver"] if em else None}
            if measured:
                row["measured_d2"] = d2["vs_ours_plain"]
                row["measured_sync"] = sync["vs_ours_plain"] if sync else None
            out_rows.append(row)
    formula = ("Expected speedup over plain decoding S(k) = E(k) * (T_v(1) + t_py,plain) / (k * t_d + T_v(k+1) + t_py,round), "
               "with E(k) the expected tokens per round: Leviathan et al.'s E(k) = (1 - a^(k+1)) / (1 - a) for i.i.d. "
               "acceptance a (= accepted/drafted, measured at temperature 0, KV "
               f"{kv}, {n_out} tokens, depth2 on), or the measured tokens per round of that cell (acceptance here is "
               "far from i.i.d.: repetitive text is accepted in runs); t_d = one draft step (slope of draft time over "
               "n_steps, best rounds), T_v(n) = target decode of n tokens with the logits read back, t_py = the driver's "
               "own time per round (matrix pair: measured per k; E2B: the k=2 figure). 'Leviathan S' is their own form "
               "E(k) / (k c + 1), c = t_d / T_v(1) (verify cost flat in n, no driver). E2B rows use the matrix pair's "
               "acceptance. Measured S = our tokens/s / our plain tokens/s in the same cell (median of runs).")
    return {"formula": formula, "rows": out_rows}


def _git_head() -> str | None:
    """The commit of the source checkout in the working directory, if any (what was installed)."""
    try:
        r = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=10)
        return r.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def _sha1(path: Path) -> str | None:
    import hashlib

    try:
        return hashlib.sha1(Path(path).read_bytes()).hexdigest()[:12]
    except OSError:
        return None


def _sample_json(s: Sample) -> dict[str, Any]:
    """A sample for the JSON: token ids and text replaced by their length and a short hash."""
    import hashlib

    d = asdict(s)
    toks, text = d.pop("tokens"), d.pop("text")
    d["tokens_sha1"] = hashlib.sha1(json.dumps(toks).encode()).hexdigest()[:12] if toks is not None else None
    d["text_sha1"] = hashlib.sha1(text.encode()).hexdigest()[:12] if text is not None else None
    d["text_head"] = text[:40] if text is not None else None
    return d


def machine_info() -> dict[str, Any]:
    cpu = platform.processor() or platform.machine()
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    return {"cpu": cpu, "cores": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform()}


MATRIX_KEYS = ("inproc", "http", "samples", "driver", "trained_costs")


def rerender(out_dir: Path) -> dict[str, Any]:
    """Rewrite ``bench.md`` and the plots from ``bench.json`` (no measurement)."""
    result = json.loads((out_dir / "bench.json").read_text())
    c = result["config"]
    cfg = BenchConfig(**{k: (Path(v) if k in ("target", "assistant", "out_dir", "cost_cache") else
                             tuple(v) if isinstance(v, list) else v) for k, v in c.items() if k in BenchConfig.__dataclass_fields__})
    cfg.out_dir = out_dir
    result["speedup"] = speedup_table(result, cfg)
    result["targets"] = targets(result)
    if cfg.plots:
        result["plots"] = make_plots(result, out_dir)
    (out_dir / "bench.json").write_text(json.dumps(result, indent=1, default=str))
    write_report(result, out_dir)
    return result


def package_fingerprint() -> dict[str, Any]:
    """mtime + size of the installed package's native libraries and driver modules: the package
    is rebuilt by others while benchmarks run; a change mid-run is reported."""
    from . import low_level

    out = {}
    files = [*sorted(low_level.library_dir().glob("*.so")), llama_server_path(),
             *(Path(low_level.__file__).parent / f for f in ("speculative.py", "context.py", "mtp.py", "sampling.py"))]
    for f in files:
        with contextlib.suppress(OSError):
            st = f.stat()
            out[f.name] = [int(st.st_mtime), st.st_size]
    return out


def _finish(result: dict[str, Any], cfg: BenchConfig, t0: float) -> None:
    fp = package_fingerprint()
    if result.get("package_fingerprint") and fp != result["package_fingerprint"]:
        msg = "the installed package changed during this run (rebuilt by someone else): results mix two builds"
        if msg not in result["errors"]:
            result["errors"].append(msg)
            log(msg)
    result["speedup"] = speedup_table(result, cfg)
    result["targets"] = targets(result)
    result["wall_s"] = time.perf_counter() - t0
    if cfg.plots:
        result["plots"] = make_plots(result, cfg.out_dir)
    (cfg.out_dir / "bench.json").write_text(json.dumps(result, indent=1, default=str))
    write_report(result, cfg.out_dir)


def run(cfg: BenchConfig, command: str = "mtp-bindings bench") -> dict[str, Any]:
    """Run the benchmark parts of ``cfg``; writes ``bench.json``, ``bench.md`` and plots (after
    each part, so an interrupted run keeps what it measured). A run of only some parts keeps the
    other parts' results from an earlier ``bench.json`` in the same directory."""
    if not llama_server_path().is_file():
        raise FileNotFoundError(f"{llama_server_path()} is missing: build the package with MTP_BUILD_LLAMA_SERVER=ON")
    cfg.out_dir.mkdir(parents=True, exist_ok=True)
    log_dir = Path(tempfile.mkdtemp(prefix="mtp-bench-logs-"))
    if cfg.nice:
        os.nice(cfg.nice)  # inherited by every server started below
    result: dict[str, Any] = {}
    prev_path = cfg.out_dir / "bench.json"
    if not {"inproc", "http", "cost"} <= set(cfg.parts) and prev_path.is_file():
        with contextlib.suppress(ValueError, OSError):
            prev = json.loads(prev_path.read_text())
            keep = (MATRIX_KEYS if "inproc" not in cfg.parts else ()) + (("cost",) if "cost" not in cfg.parts else ())
            result.update({k: prev[k] for k in keep if k in prev})
            if result:
                result["merged_from_earlier_run"] = {"keys": sorted(result), "started": prev.get("started")}
    omp = os.environ.get("OMP_WAIT_POLICY")
    if cfg.omp_wait_policy != "default" and (omp or "").lower() != cfg.omp_wait_policy:
        log(f"note: OMP_WAIT_POLICY is {omp!r} in this process, not {cfg.omp_wait_policy!r} (set it before "
            "libgomp loads: `mtp-bindings bench` does)")
    result.update({"config": cfg.to_json(), "machine": machine_info(), "command": command,
                   "omp_wait_policy": omp,
                   "model_sha1": {k: _sha1(getattr(cfg, k)) for k in ("target", "assistant")},
                   "started": time.strftime("%Y-%m-%d %H:%M:%S"), "errors": [], "server_logs": str(log_dir),
                   "package_fingerprint": package_fingerprint(), "git_head": _git_head()})
    t0 = time.perf_counter()
    from .model import Model

    if "inproc" in cfg.parts or "http" in cfg.parts:
        runner = MatrixRunner(cfg, log_dir)
        info = runner.run()
        for part in ("inproc", "http"):
            result.pop(part, None)
            rows = aggregate(runner.samples, part)
            if not rows:
                continue
            result[part] = {"rows": rows, "identity": [i for i in identity_check(runner.samples) if i["part"] == part],
                            "noise": noise_summary(rows, info["noise"]), "prompt_ids": info["prompt_ids"]}
        result["samples"] = [_sample_json(s) for s in runner.samples]
        _finish(result, cfg, t0)
    if {"inproc", "http", "driver"} & set(cfg.parts):
        log("driver: Python time per round on the trained pair")
        with Model(cfg.target, assistant=cfg.assistant) as m:
            prompt_ids = m.tokenize(cfg.prompt)
            bias = eog_bias(m) if cfg.suppress_eog else {}
            result["driver"] = {"rows": driver_overhead(m, prompt_ids, threads=cfg.threads, n_out=max(cfg.outputs),
                                                        draft_ns=cfg.draft_ns, temps=cfg.temperatures,
                                                        runs=max(1, min(cfg.runs, 2)), bias=bias, n_ctx=cfg.n_ctx)}
            if cfg.mode != "smoke":
                result["driver"]["profile"] = profile_driver(m, prompt_ids, threads=cfg.threads, n_out=max(cfg.outputs),
                                                             draft_n=cfg.draft_ns[len(cfg.draft_ns) // 2] if cfg.draft_ns else 0,
                                                             temp=0.0, out_path=log_dir / "driver.prof")
        if cfg.pyspy_seconds > 0 and cfg.draft_ns:
            log("driver: py-spy profile of the generation loop")
            result["driver"]["pyspy"] = py_spy_driver_profile(
                cfg.target, cfg.assistant, threads=cfg.threads, n_out=max(cfg.outputs),
                draft_n=cfg.draft_ns[len(cfg.draft_ns) // 2], seconds=cfg.pyspy_seconds, prompt=cfg.prompt,
                out_dir=cfg.out_dir)
        log("costs of the matrix's pair (for its expected speedup)")
        result["trained_costs"] = _trained_costs(cfg, log_dir)
        _finish(result, cfg, t0)
    if "cost" in cfg.parts:
        try:
            result["cost"] = run_cost(cfg, log_dir, None)
        except Exception as e:
            result["errors"].append(f"cost part failed: {type(e).__name__}: {e}")
            log(f"cost part failed: {e}")
    _finish(result, cfg, t0)
    log(f"done in {result['wall_s']:.0f} s: {cfg.out_dir / 'bench.md'}")
    return result


# ================================================================================================
# command line
# ================================================================================================

def add_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_mutually_exclusive_group()
    g.add_argument("--full", dest="mode", action="store_const", const="full",
                   help="issue 6's matrix (default): 5 systems x draft_n 1..4 x KV f16/q8_0 x 128/512 tokens x T 0/0.7, 3 runs")
    g.add_argument("--quick", dest="mode", action="store_const", const="quick",
                   help="a few minutes: KV f16, 128 tokens, 2 runs")
    g.add_argument("--smoke", dest="mode", action="store_const", const="smoke", help="seconds (tests)")
    p.set_defaults(mode="full")
    p.add_argument("--parts", default=None, help="comma list of inproc,http,cost,driver (default: inproc,http,cost; "
                                                 "inproc and http include driver)")
    p.add_argument("-m", "--model", dest="target", type=Path, default=None, help="target GGUF (default: the bundled trained pair)")
    p.add_argument("-md", "--mtp-head", dest="assistant", type=Path, default=None, help="assistant GGUF")
    p.add_argument("-t", "--threads", type=int, default=None, help="threads per system (default 2)")
    p.add_argument("--runs", type=int, default=None, help="runs a cell (default 3)")
    p.add_argument("-o", "--out", dest="out_dir", type=Path, default=None, help="results directory (default bench/results)")
    p.add_argument("--cache", dest="cost_cache", type=Path, default=None, help="random-weight models (default bench/.models)")
    p.add_argument("--prompt", default=None)
    p.add_argument("--no-plots", dest="plots", action="store_false", default=None)
    p.add_argument("--report-only", action="store_true", help="rewrite bench.md and the plots from bench.json")
    p.add_argument("--omp-wait-policy", choices=["passive", "active", "default"], default="passive",
                   help="OMP_WAIT_POLICY for every system (default passive: on a shared 2-core machine libgomp's "
                        "spin-waiting turns any preemption into stalls of up to 50x; 'default' leaves it unset)")
    p.add_argument("--nice", type=int, default=None,
                   help="niceness increment for the benchmark and its servers (negative needs root: priority "
                        "over other work on a shared machine; default 0)")


def _reexec_with_omp_policy(policy: str) -> None:
    """libgomp reads ``OMP_WAIT_POLICY`` once, when it is loaded (importing the bindings loads it):
    set it and start this command again. Servers inherit it, so every system runs with it."""
    if policy == "default" or os.environ.get("OMP_WAIT_POLICY", "").lower() == policy:
        return
    if os.environ.get("_MTP_BENCH_REEXEC"):
        return  # never loop
    env = {**os.environ, "OMP_WAIT_POLICY": policy, "_MTP_BENCH_REEXEC": "1"}
    log(f"re-running with OMP_WAIT_POLICY={policy}")
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, [sys.executable, *sys.argv], env)


def main_args(args: argparse.Namespace, command: str) -> int:
    if args.report_only:
        out = args.out_dir or (Path("bench/results") / ("" if args.mode == "full" else args.mode))
        rerender(out.resolve())
        print((out / "bench.md").read_text())
        return 0
    if args.omp_wait_policy:
        _reexec_with_omp_policy(args.omp_wait_policy)
    parts = tuple(x.strip() for x in args.parts.split(",")) if args.parts else None
    if parts and not set(parts) <= {"inproc", "http", "cost", "driver"}:
        raise SystemExit(f"--parts: unknown part in {args.parts!r} (inproc, http, cost; driver: only the driver "
                         "time, its profiles and the matrix pair's costs)")
    out_dir = args.out_dir
    if out_dir is None:
        out_dir = Path("bench/results") if Path("bench").is_dir() else Path("bench-results")
        if args.mode != "full":
            out_dir = out_dir / args.mode
    cfg = config_for(args.mode, target=args.target, assistant=args.assistant, threads=args.threads, runs=args.runs,
                     out_dir=out_dir, cost_cache=args.cost_cache, prompt=args.prompt, plots=args.plots, parts=parts,
                     nice=args.nice, omp_wait_policy=args.omp_wait_policy)
    result = run(cfg, command=command)
    print((cfg.out_dir / "bench.md").read_text())
    return 0 if not result["errors"] else 1


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="mtp-bindings bench", description=__doc__.split("\n")[0])
    add_arguments(p)
    args = p.parse_args(argv)
    return main_args(args, "mtp-bindings bench " + " ".join(argv if argv is not None else sys.argv[1:]))


if __name__ == "__main__":
    sys.exit(main())
