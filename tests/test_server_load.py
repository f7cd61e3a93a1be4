"""The server under bounded load on loopback: 8 clients x 25 requests, mixing plain, streaming,
mid-stream disconnects and invalid requests. Every valid request that was not cancelled gets the
same output as when run alone; nothing answers 5xx; the server's RSS, threads and open files
return to their baseline (thread pools may reach a new peak of concurrency once). """

from __future__ import annotations

import json
import random
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

from test_server import KEY, Server, parse_metrics, server  # noqa: F401 (the fixture)

PROMPTS = ["def parse_args(argv):\n", "import os\nimport sys\n", "class Queue:\n", "for i in range(10):\n"]
N_CLIENTS, N_REQUESTS, MAX_TOKENS = 8, 25, 24
# Threads the server's pools may add in round 2 by reaching a new peak of concurrency: at most one per
# client, since no more than N_CLIENTS requests are ever in flight (CI measured 8 -> 11 once: anyio prunes
# idle workers only when new work arrives, so the count after a round depends on timing). A leak keeps
# something per request: ~180 a round.
POOL_GROWTH = N_CLIENTS


def proc_stats(pid: int) -> dict[str, int]:
    status = Path(f"/proc/{pid}/status").read_text()
    fields = dict(line.split(":", 1) for line in status.splitlines())
    return {"rss_kb": int(fields["VmRSS"].split()[0]), "threads": int(fields["Threads"]),
            "fds": len(list(Path(f"/proc/{pid}/fd").iterdir()))}


def complete(c: httpx.Client, prompt: str) -> str:
    r = c.post("/v1/completions", json={"prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0})
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["text"]


def complete_streamed(c: httpx.Client, prompt: str) -> str:
    text = []
    with c.stream("POST", "/v1/completions", json={"prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0,
                                                   "stream": True}) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                text.append(json.loads(line[6:])["choices"][0]["text"])
    return "".join(text)


def disconnect_mid_stream(c: httpx.Client, prompt: str) -> None:
    with c.stream("POST", "/v1/completions", json={"prompt": prompt, "max_tokens": 400, "temperature": 0,
                                                   "stream": True, "logit_bias": {"1": -100, "106": -100}}) as r:
        assert r.status_code == 200
        for i, _ in enumerate(r.iter_lines()):
            if i == 3:
                break  # closing the response drops the connection


def invalid(c: httpx.Client, rng: random.Random) -> int:
    body = rng.choice([{"prompt": 3}, {"prompt": "x", "temperature": "hot"}, {"prompt": "x", "max_tokens": -2},
                       {"prompt": "x", "n": 2}])
    return c.post("/v1/completions", json=body).status_code


def run_load(server: Server, solo: dict[str, str], seed: int) -> tuple[list[int], list[tuple[str, str, str]]]:
    statuses: list[int] = []
    mismatches: list[tuple[str, str, str]] = []

    def client(i: int) -> None:
        rng = random.Random(seed * 1000 + i)
        with httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {KEY}"}, timeout=120) as c:
            for _ in range(N_REQUESTS):
                prompt = rng.choice(PROMPTS)
                kind = rng.random()
                if kind < 0.1:
                    statuses.append(invalid(c, rng))
                elif kind < 0.2:
                    disconnect_mid_stream(c, prompt)
                else:
                    got = complete_streamed(c, prompt) if kind < 0.55 else complete(c, prompt)
                    statuses.append(200)
                    if got != solo[prompt]:
                        mismatches.append((prompt, got, solo[prompt]))

    with ThreadPoolExecutor(N_CLIENTS) as pool:
        list(pool.map(client, range(N_CLIENTS)))
    return statuses, mismatches


def test_concurrent_mixed_load_gives_solo_outputs_and_no_5xx(server: Server):  # noqa: F811
    with server.client() as c:
        solo = {p: complete(c, p) for p in PROMPTS}
    # round 1 warms every pool up (slots' MTP workers, the server's thread pools); round 2 must then
    # leave the process exactly where round 1 left it: nothing per request is kept
    rounds = []
    for seed in (1, 2):
        statuses, mismatches = run_load(server, solo, seed)
        assert not mismatches, mismatches[:2]
        assert all(s < 500 for s in statuses) and statuses.count(400) > 0
        with server.client() as c:  # settled: the same answer as before the load
            assert complete(c, PROMPTS[1]) == solo[PROMPTS[1]]
            metrics = parse_metrics(c.get("/metrics").text)
        assert metrics["mtp_requests_processing"] == 0 and metrics["mtp_requests_queued"] == 0
        rounds.append(proc_stats(server.proc.pid))
    first, second = rounds
    # Thread pools grow to the highest concurrency they have seen, and round 2 can reach a peak round 1
    # did not (measured: 10 threads after round 1, 11 after round 2; once 8 then 11). Something kept per
    # request would add a thread or a file per request. A socket the last client just closed may still
    # be open on the server's side for a moment (the full suite once saw 7 -> 8 files): wait for both.
    deadline = time.monotonic() + 20
    while ((second["threads"] > first["threads"] + POOL_GROWTH or second["fds"] > first["fds"])
           and time.monotonic() < deadline):
        time.sleep(0.5)  # idle worker threads of the server's thread pool (anyio) expire, sockets close
        second = proc_stats(server.proc.pid)
    assert second["threads"] <= first["threads"] + POOL_GROWTH and second["fds"] <= first["fds"], (first, second)
    assert second["rss_kb"] - first["rss_kb"] < 16 * 1024, rounds
