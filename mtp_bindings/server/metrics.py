"""What ``GET /metrics`` reports: the server's counters, exposed through ``prometheus_client``.

One job: count (requests, queue, slots, tokens, drafts) and render the counts in Prometheus's
text format. :class:`ServerMetrics` keeps plain numbers under a lock (the event loop and the slot
workers update them alike); a collector on a per-app ``CollectorRegistry`` turns them into metric
families at scrape time, so two apps in one process never share a series and no global registry
is touched.

Our own names (``mtp_*``, stable: dashboards and tests use them):

* ``mtp_http_requests_total{endpoint, status}``, ``mtp_slots``, ``mtp_requests_processing``,
  ``mtp_requests_queued``, ``mtp_generations_total``, ``mtp_generations_cancelled_total``,
  ``mtp_prompt_tokens_total`` (every prompt token, cached or not), ``mtp_prompt_tokens_cached_total``
  (those whose KV a slot's prompt cache kept), ``mtp_generated_tokens_total``, ``mtp_draft_tokens_total``,
  ``mtp_draft_accepted_tokens_total``, ``mtp_draft_position_{drafted,accepted}_total{position}``
  and ``mtp_draft_position_acceptance_ratio{position}`` (positions 1-based),
  ``mtp_draft_rounds_total{k}`` (verify rounds by the drafts they verified: what the ``auto`` draft
  count chose; ``k="0"`` a plain decode), and the histogram ``mtp_request_acceptance_rate``.

Aliases, for dashboards built for other servers, only where the meaning is the same:

* llama-server (``--metrics``): ``llamacpp:prompt_tokens_total``, ``llamacpp:prompt_seconds_total``,
  ``llamacpp:tokens_predicted_total``, ``llamacpp:tokens_predicted_seconds_total``,
  ``llamacpp:requests_processing``, ``llamacpp:requests_deferred`` (= queued),
  ``llamacpp:spec_decode_num_draft_tokens_total``, ``llamacpp:spec_decode_num_accepted_tokens_total``,
  ``llamacpp:spec_decode_num_drafts_total`` (verification steps: rounds that drafted) and
  ``llamacpp:spec_decode_num_accepted_tokens_per_pos_total{position}`` (0-based, as llama-server's).
  Not mapped: ``n_decode_total``, ``n_busy_slots_per_decode``, ``n_tokens_max`` and the windowed
  throughput gauges (no equivalent counted here).
* vLLM (labelled ``model_name``): ``vllm:num_requests_running``, ``vllm:num_requests_waiting``,
  ``vllm:prompt_tokens_total``, ``vllm:generation_tokens_total``, ``vllm:spec_decode_num_drafts_total``,
  ``vllm:spec_decode_num_draft_tokens_total``, ``vllm:spec_decode_num_accepted_tokens_total`` and
  ``vllm:spec_decode_num_accepted_tokens_per_pos_total{position}`` (0-based, as vLLM's).
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import generate_latest
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.utils import floatToGoString

from ..generation.stats import GenerationStats, add_per_position

ACCEPTANCE_BUCKETS = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0)
# the text format generate_latest writes (spelled out: prometheus_client < 0.21 has no constant for it)
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class ServerMetrics:
    """Counters for ``/metrics``, updated from the event loop and the slot workers alike (hence
    the lock), rendered through :attr:`registry`."""

    def __init__(self, n_slots: int, model_name: str = "") -> None:
        self._lock = threading.Lock()
        self.n_slots = n_slots
        self.model_name = model_name
        self.requests: dict[tuple[str, int], int] = {}
        self.queued = 0
        self.processing = 0
        self.prompt_tokens = 0
        self.prompt_tokens_cached = 0
        self.generated_tokens = 0
        self.prompt_seconds = 0.0
        self.generation_seconds = 0.0
        self.generations = 0
        self.cancelled = 0
        self.drafted = 0
        self.accepted = 0
        self.drafted_pos: list[int] = []
        self.accepted_pos: list[int] = []
        self.rounds_per_k: list[int] = []
        self.hist_counts = [0] * len(ACCEPTANCE_BUCKETS)
        self.hist_sum = 0.0
        self.hist_n = 0
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(_Collector(self))

    def count_request(self, endpoint: str, status: int) -> None:
        with self._lock:
            key = (endpoint, status)
            self.requests[key] = self.requests.get(key, 0) + 1

    def job_queued(self) -> None:
        with self._lock:
            self.queued += 1

    def job_started(self) -> None:
        with self._lock:
            self.queued -= 1
            self.processing += 1

    def job_skipped(self) -> None:
        """A request cancelled while still queued."""
        with self._lock:
            self.queued -= 1
            self.cancelled += 1

    def job_finished(self) -> None:
        with self._lock:
            self.processing -= 1

    def record_generation(self, stats: GenerationStats, finish_reason: str) -> None:
        with self._lock:
            self.generations += 1
            self.cancelled += finish_reason == "cancelled"
            self.prompt_tokens += stats.n_prompt
            self.prompt_tokens_cached += stats.n_prompt_cached
            self.generated_tokens += stats.n_generated
            self.prompt_seconds += stats.t_prompt
            self.generation_seconds += stats.t_generate
            self.drafted += stats.n_drafted
            self.accepted += stats.n_accepted
            add_per_position(self.drafted_pos, stats.drafted_per_position)
            add_per_position(self.accepted_pos, stats.accepted_per_position)
            add_per_position(self.rounds_per_k, stats.rounds_per_k)
            if stats.n_drafted:
                rate = stats.acceptance_rate
                self.hist_sum += rate
                self.hist_n += 1
                for i, le in enumerate(ACCEPTANCE_BUCKETS):
                    if rate <= le:
                        self.hist_counts[i] += 1

    def render(self) -> bytes:
        """The Prometheus text exposition of every family (ours and the aliases)."""
        return generate_latest(self.registry)


class _Collector:
    """Reads :class:`ServerMetrics` at scrape time into metric families (one consistent snapshot,
    taken under its lock)."""

    def __init__(self, metrics: ServerMetrics) -> None:
        self.m = metrics

    def collect(self) -> Iterator[Metric]:
        with self.m._lock:
            families = [*self._ours(), *self._llamacpp(), *self._vllm()]
        return iter(families)

    def _ours(self) -> Iterable[Metric]:
        m = self.m
        requests = CounterMetricFamily("mtp_http_requests_total", "HTTP requests by endpoint and status code.",
                                       labels=["endpoint", "status"])
        for (endpoint, status), n in sorted(m.requests.items()):
            requests.add_metric([endpoint, str(status)], n)
        yield requests
        yield GaugeMetricFamily("mtp_slots", "Generation slots (contexts).", value=m.n_slots)
        yield GaugeMetricFamily("mtp_requests_processing", "Generations running in a slot.", value=m.processing)
        yield GaugeMetricFamily("mtp_requests_queued", "Generation requests waiting for a slot.", value=m.queued)
        for name, help_, value in (
            ("mtp_generations_total", "Generations run (finished or cancelled).", m.generations),
            ("mtp_generations_cancelled_total", "Generations cancelled by a client disconnect.", m.cancelled),
            ("mtp_prompt_tokens_total", "Prompt tokens processed.", m.prompt_tokens),
            ("mtp_prompt_tokens_cached_total", "Prompt tokens whose KV the prompt cache kept.", m.prompt_tokens_cached),
            ("mtp_generated_tokens_total", "Tokens generated.", m.generated_tokens),
            ("mtp_draft_tokens_total", "Tokens drafted by the MTP assistant.", m.drafted),
            ("mtp_draft_accepted_tokens_total", "Drafted tokens the target accepted.", m.accepted),
        ):
            yield CounterMetricFamily(name, help_, value=value)
        yield _per_position(CounterMetricFamily, "mtp_draft_position_drafted_total",
                            "Drafted tokens by draft position (1-based).", m.drafted_pos, first=1)
        yield _per_position(CounterMetricFamily, "mtp_draft_position_accepted_total",
                            "Accepted drafts by draft position (1-based).", m.accepted_pos, first=1)
        ratios = [a / d if d else 0.0 for a, d in zip(m.accepted_pos, m.drafted_pos)]
        yield _per_position(GaugeMetricFamily, "mtp_draft_position_acceptance_ratio",
                            "Accepted / drafted by draft position.", ratios, first=1)
        yield _per_position(CounterMetricFamily, "mtp_draft_rounds_total",
                            "Verify rounds by the drafts they verified (0: a plain decode).", m.rounds_per_k,
                            first=0, label="k")
        buckets = [(floatToGoString(le), n) for le, n in zip(ACCEPTANCE_BUCKETS, m.hist_counts)]
        yield HistogramMetricFamily("mtp_request_acceptance_rate",
                                    "Per-request draft acceptance rate (requests that drafted).",
                                    buckets=[*buckets, ("+Inf", m.hist_n)], sum_value=m.hist_sum)

    def _llamacpp(self) -> Iterable[Metric]:
        m = self.m
        for name, help_, value in (
            ("prompt_tokens_total", "Number of prompt tokens processed.", m.prompt_tokens),
            ("prompt_seconds_total", "Total time spent processing prompts.", m.prompt_seconds),
            ("tokens_predicted_total", "Number of generation tokens processed.", m.generated_tokens),
            ("tokens_predicted_seconds_total", "Total time spent generating tokens.", m.generation_seconds),
            ("spec_decode_num_draft_tokens_total", "Speculative: Total draft tokens generated.", m.drafted),
            ("spec_decode_num_accepted_tokens_total", "Speculative: Total draft tokens accepted by the target model.",
             m.accepted),
            ("spec_decode_num_drafts_total", "Speculative: Total speculative decoding verification steps.",
             _verification_steps(m)),
        ):
            yield CounterMetricFamily(f"llamacpp:{name}", help_, value=value)
        yield GaugeMetricFamily("llamacpp:requests_processing", "Number of requests processing.", value=m.processing)
        yield GaugeMetricFamily("llamacpp:requests_deferred", "Number of requests deferred.", value=m.queued)
        yield _per_position(CounterMetricFamily, "llamacpp:spec_decode_num_accepted_tokens_per_pos_total",
                            "Accepted tokens per draft position.", m.accepted_pos, first=0)

    def _vllm(self) -> Iterable[Metric]:
        m = self.m
        model = [m.model_name]
        for kind, name, help_, value in (
            (GaugeMetricFamily, "vllm:num_requests_running", "Number of requests in model execution batches.",
             m.processing),
            (GaugeMetricFamily, "vllm:num_requests_waiting", "Number of requests waiting to be processed.", m.queued),
            (CounterMetricFamily, "vllm:prompt_tokens_total", "Number of prefill tokens processed.", m.prompt_tokens),
            (CounterMetricFamily, "vllm:generation_tokens_total", "Number of generation tokens processed.",
             m.generated_tokens),
            (CounterMetricFamily, "vllm:spec_decode_num_drafts_total", "Number of spec decoding drafts.",
             _verification_steps(m)),
            (CounterMetricFamily, "vllm:spec_decode_num_draft_tokens_total", "Number of draft tokens.", m.drafted),
            (CounterMetricFamily, "vllm:spec_decode_num_accepted_tokens_total", "Number of accepted tokens.",
             m.accepted),
        ):
            family = kind(name, help_, labels=["model_name"])
            family.add_metric(model, value)
            yield family
        per_pos = CounterMetricFamily("vllm:spec_decode_num_accepted_tokens_per_pos_total",
                                      "Accepted tokens per draft position.", labels=["model_name", "position"])
        for i, n in enumerate(m.accepted_pos):
            per_pos.add_metric([m.model_name, str(i)], n)
        yield per_pos


def _verification_steps(m: ServerMetrics) -> int:
    """Rounds that drafted at least one token (each is one verification decode)."""
    return m.drafted_pos[0] if m.drafted_pos else 0


def _per_position(kind: Any, name: str, help_: str, values: list[Any], *, first: int,
                  label: str = "position") -> Metric:
    """A family with one sample per draft position (or count: ``label``), numbered from ``first``."""
    family = kind(name, help_, labels=[label])
    for i, v in enumerate(values):
        family.add_metric([str(i + first)], v)
    return family


class RequestCounter:
    """ASGI middleware counting every HTTP response by endpoint (``routes``, else ``other``, to
    bound the label set) and status code."""

    def __init__(self, app: Any, metrics: ServerMetrics, routes: Iterable[str]) -> None:
        self.app = app
        self.metrics = metrics
        self.routes = frozenset(routes)

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        status = [500]

        async def capture(message: Any) -> None:
            if message["type"] == "http.response.start":
                status[0] = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, capture)
        finally:
            path = scope.get("path", "")
            self.metrics.count_request(path if path in self.routes else "other", status[0])
