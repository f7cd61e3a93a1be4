"""Small utilities of the benchmark: statistics, CPU/noise accounting, processes, an HTTP client."""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..config.params import resolve_flash_attn
from .config import llama_server_path



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
        self.retired_j = 0  # CPU of our processes that have exited (read just before they stopped)

    def add(self, pid: int) -> None:
        self.pids.add(pid)
        self.start_pid_j.setdefault(pid, _proc_jiffies(pid))

    def retire(self, pid: int) -> None:
        """Count ``pid``'s CPU now, before it exits: afterwards /proc has nothing to read, and its
        time would be taken for other work's."""
        if pid in self.pids:
            self.retired_j += max(_proc_jiffies(pid) - self.start_pid_j.get(pid, 0), 0)
            self.pids.discard(pid)

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
        ours = self.retired_j + sum(max(_proc_jiffies(p) - self.start_pid_j.get(p, 0), 0) for p in self.pids)
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
    fa = resolve_flash_attn("auto", kv)  # what ours resolves "auto" to (llama.cpp's auto for an unquantized cache)
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
    fa = resolve_flash_attn("auto", kv)
    argv = [sys.executable, "-m", "mtp_bindings.cli", "serve", "-m", str(target), "--port", str(port),
            "-c", str(n_ctx), "-t", str(threads), "-ctk", kv, "-ctv", kv, "-fa", fa]
    if assistant is None:
        argv += ["--no-mtp"]
    else:
        argv += ["-md", str(assistant)]
        if not depth2:
            argv += ["--no-depth2"]
    return argv
