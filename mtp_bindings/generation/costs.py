"""What rounds cost on one context, as :mod:`.controller`'s ``auto`` measures them: running estimates of
decode(rows), the wait for k drafts, sampling per row, the rest of a round, whole rounds by k and the plain
round after a drafting one (each the median of a window of measurements), and the acceptance earlier requests
saw, pooled by sampler settings.
Kept on the context across requests (a context's threads, weights and machine do not change between them).
Pure Python.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable
from dataclasses import dataclass, field

ACCEPT_PRIOR = 0.6        # conditional acceptance per position before anything was measured
COST_WINDOW = 15          # a cost's estimate is the median of its last this many measurements ...
COST_MAX_AGE = 48         # ... taken in the context's last this many rounds (the newest one is always kept)
VERIFY_SLOPE_PRIOR = 0.1  # decode(n) = decode(1) (1 + slope (n - 1)) until two sizes are measured
DRAFT_STEP_PRIOR = 0.1    # a draft step / decode(1), until a draft is measured
POOL_MAX = 256.0          # observations the context's pooled acceptance keeps per position
POOL_PRIOR_WEIGHT = 2.0   # drafts' worth of the position before it that a pooled position's estimate starts from
MONOTONE = ("verify", "draft", "total")  # costs that never fall as rows or drafts grow (see nondecreasing)
DRAFTING_SIZES = {"verify": 2, "draft": 1, "total": 1}  # the sizes of drafting rounds, by kind (see CostModel._add)


class _Window:
    """The last ``COST_WINDOW`` measurements of one cost, none older than ``COST_MAX_AGE`` rounds; its estimate is
    their median. A median, not a running mean: this kind of VM's rounds have heavy tails (one in ten 1.5-4x
    slow), and one such round moved a mean (and the choice) for many rounds; simulated with such noise, auto lost
    6-10 % to the best fixed count. An age limit: a cost measured only by a probe now and then (plain decoding
    while drafting pays) would otherwise be the median of measurements from another phase of the machine (a VM's
    speed moves by 20-100 % for seconds), and a probe could not correct it. Adding is O(1); the median is taken
    when an estimate is read (a plain round on the tiny pair takes 0.35 ms: sorting at every add cost 3 %)."""

    __slots__ = ("values",)

    def __init__(self) -> None:
        self.values: deque[tuple[int, float]] = deque()  # (round, seconds)

    def add(self, x: float, now: int) -> None:
        v = self.values
        v.append((now, x))
        while len(v) > COST_WINDOW or v[0][0] <= now - COST_MAX_AGE:  # the newest is never too old
            v.popleft()

    def median(self) -> float:
        ordered = sorted(x for _, x in self.values)
        n = len(ordered)
        return ordered[n // 2] if n % 2 else 0.5 * (ordered[n // 2 - 1] + ordered[n // 2])


def nondecreasing(values: dict[int, float], weights: dict[int, int]) -> dict[int, float]:
    """The nondecreasing fit of ``values`` by size closest to them in weighted least squares (pool adjacent
    violators, ``weights`` the measurements behind each): a decode of more rows, more drafts, a round with more
    of them never costs less, and on this kind of VM medians taken in different phases of the machine said so
    (verify(4) 101.6 ms, verify(5) 93.3 ms): a count looked cheaper than the one below it."""
    blocks: list[tuple[float, float, int]] = []  # (mean, weight, number of sizes)
    sizes = sorted(values)
    for size in sizes:
        blocks.append((values[size], float(max(weights.get(size, 1), 1)), 1))
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            m2, w2, n2 = blocks.pop()
            m1, w1, n1 = blocks[-1]
            blocks[-1] = ((m1 * w1 + m2 * w2) / (w1 + w2), w1 + w2, n1 + n2)
    out: dict[int, float] = {}
    i = 0
    for mean, _, n in blocks:
        for size in sizes[i:i + n]:
            out[size] = mean
        i += n
    return out


@dataclass
class RoundCost:
    """What one round took, seconds: ``draft`` the wait for its ``k`` drafts, ``verify`` the
    target's decode, ``sample`` the sampler over its rows."""

    k: int
    draft: float
    verify: float
    sample: float


@dataclass
class CostModel:
    """Running estimates of what rounds cost on one context (kept there across requests: a context's
    threads, weights and machine do not change between them), and the acceptance it has seen."""

    # acceptance of earlier requests by sampler settings (what is accepted at temperature 0 says little
    # about 1.5): per position, drafts reached and drafts accepted
    pools: dict[Hashable, tuple[list[float], list[float]]] = field(default_factory=dict)
    rounds: int = 0  # rounds on this context, measured or not (the clock of the windows' age limit)
    last_probe: int = 0  # ``rounds`` at the context's last probe (see AutoCount.choose)
    # the measurements behind each estimate, by kind and size; the estimates, refreshed when read
    windows: dict[str, dict[int, _Window]] = field(default_factory=dict, repr=False)
    _estimates: dict[str, dict[int, float]] = field(default_factory=dict, repr=False)
    _medians: dict[str, dict[int, float]] = field(default_factory=dict, repr=False)
    _stale: set[tuple[str, int]] = field(default_factory=set, repr=False)
    _warm: set[tuple[str, int]] = field(default_factory=set, repr=False)  # drafting sizes seen once (see _add)

    def _add(self, kind: str, size: int, x: float) -> None:
        if kind in DRAFTING_SIZES and size >= DRAFTING_SIZES[kind] and (kind, size) not in self._warm:
            # The first round with a draft count on a context is not a measurement of that count: it pays once for
            # a graph shape the context had not computed (its compute buffers paged in, the drafting graph built).
            # The E2B-sized pair's first round with 3 drafts took 240 ms against 50-55 later, and auto then decoded
            # plain for 120 rounds [AMD EPYC; avx2].
            self._warm.add((kind, size))
            return
        window = self.windows.setdefault(kind, {}).get(size)
        if window is None:
            window = self.windows[kind][size] = _Window()
        window.add(x, self.rounds)
        self._stale.add((kind, size))

    def _estimate(self, kind: str) -> dict[int, float]:
        if self._stale:
            # only the windows that took a measurement take their median again (a full choice read each cost
            # ~70 times, and refreshing every window of a kind made it 80 us in cache, 130-185 after a decode)
            kinds: set[str] = set()
            for k, size in self._stale:
                self._medians.setdefault(k, {})[size] = self.windows[k][size].median()
                kinds.add(k)
            self._stale.clear()
            for k in kinds:
                medians = self._medians[k]
                weights = {size: len(w.values) for size, w in self.windows[k].items()}
                self._estimates[k] = nondecreasing(medians, weights) if k in MONOTONE else dict(medians)
        return self._estimates.get(kind, {})

    def measured(self, kind: str) -> dict[int, _Window]:
        """The sizes of ``kind`` measured so far (keys), without taking any median."""
        return self.windows.get(kind, {})

    @property
    def verify(self) -> dict[int, float]:
        """decode(rows), seconds, by rows measured."""
        return self._estimate("verify")

    @property
    def draft(self) -> dict[int, float]:
        """The wait for k drafts, seconds, by k measured."""
        return self._estimate("draft")

    @property
    def total(self) -> dict[int, float]:
        """Whole rounds by k, end to end: what the parts miss (drafting beside the host's work, contention)."""
        return self._estimate("total")

    @property
    def after_drafting(self) -> float | None:
        """A plain round right after a drafting one, whole: it pays for the drafting before it (the one-row graph
        built again, drafting winding down), so it is not T(0), but it is part of what a probe from plain decoding
        costs."""
        return self._estimate("after_drafting").get(0)

    @property
    def sample_row(self) -> float | None:
        return self._estimate("sample").get(0)

    @property
    def host(self) -> float | None:
        return self._estimate("host").get(0)

    def observe(self, c: RoundCost) -> None:
        self.rounds += 1
        rows = c.k + 1
        self._add("verify", rows, c.verify)
        if c.k:
            self._add("draft", c.k, c.draft)
        self._add("sample", 0, c.sample / rows)

    def tick(self, rounds: int = 1) -> None:
        """Rounds passed that are not measured (the clock of the windows' age limit runs on)."""
        self.rounds += rounds

    def observe_round(self, c: RoundCost, seconds: float) -> None:
        """A whole round with its parts ``c`` took ``seconds``, from the end of the round before to its own."""
        self._add("host", 0, max(seconds - c.draft - c.verify - c.sample, 0.0))
        self._add("total", c.k, seconds)

    def observe_after_drafting(self, seconds: float) -> None:
        """A plain round right after a drafting one took ``seconds`` (see :attr:`after_drafting`)."""
        self.rounds += 1
        self._add("after_drafting", 0, seconds)

    def verify_cost(self, rows: int) -> float:
        """decode(rows): measured, else interpolated between the nearest measured sizes, else
        extrapolated with the measured slope (the prior's where fewer than two sizes were seen)."""
        return _verify_cost(self.verify, rows)

    def draft_cost(self, k: int) -> float:
        """The wait for ``k`` drafts: measured, else ``k`` times the measured cost per draft."""
        return _draft_cost(self.draft, k, self.verify)

    def _snapshot(self) -> tuple[dict[int, float], dict[int, float], float, float]:
        # each estimate read once per choice (read per use, a full choice read them ~70 times: 80 us in cache)
        return self.verify, self.draft, self.sample_row or 0.0, self.host or 0.0

    def round_costs(self, k_max: int) -> list[float]:
        """T(k) for k in ``0..k_max``: what whole rounds with ``k`` drafts took, else the nearest measured
        count's, moved by what the parts say the difference costs."""
        snap = self._snapshot()
        parts = [_parts_cost(snap, k) for k in range(k_max + 1)]
        total = self.total
        if not total:
            return parts
        out = []
        for k, part in enumerate(parts):
            if k in total:
                out.append(total[k])
                continue
            # a drafting count from a measured drafting count where there is one: drafting rounds pay what plain
            # ones do not (the drafting graph, the hidden state), and no part shows all of it
            seen = [n for n in total if n] if k and any(total) else list(total)
            near = min(seen, key=lambda n: (abs(n - k), n))
            near_part = parts[near] if near <= k_max else _parts_cost(snap, near)
            out.append(max(total[near] + part - near_part, 0.1 * part))
        return out

    def acceptance_prior(self, k_max: int, key: Hashable = None) -> list[float]:
        """Per position, what earlier requests with sampler settings ``key`` accepted on this context, with
        ``POOL_PRIOR_WEIGHT`` drafts' worth of the position before it (the first: ``ACCEPT_PRIOR``) added: a
        position reached a few times and never accepted is unlikely, not impossible (as a bare ratio it was 0,
        and an estimate of 0 has no standard error for the choice's optimism to add: on the E2B-sized pair at
        temperature 0.7, drafts past the first were written off for every later request after the first)."""
        tried, accepted = self.pools.get(key, ([], []))
        out: list[float] = []
        for i in range(k_max):
            before = out[-1] if out else ACCEPT_PRIOR
            t, a = (tried[i], accepted[i]) if i < len(tried) else (0.0, 0.0)
            out.append((a + POOL_PRIOR_WEIGHT * before) / (t + POOL_PRIOR_WEIGHT))
        return out

    def pool(self, tried: list[int], accepted: list[int], key: Hashable = None) -> None:
        """Add a finished request's counts per position to ``key``'s pool (old ones fade past ``POOL_MAX``)."""
        pooled_tried, pooled_accepted = self.pools.setdefault(key, ([], []))
        for i, (t, a) in enumerate(zip(tried, accepted)):
            if i >= len(pooled_tried):
                pooled_tried.append(0.0)
                pooled_accepted.append(0.0)
            scale = min(1.0, POOL_MAX / (pooled_tried[i] + t)) if t else 1.0
            pooled_tried[i] = (pooled_tried[i] + t) * scale
            pooled_accepted[i] = (pooled_accepted[i] + a) * scale


def _decode1(verify: dict[int, float]) -> float:
    """decode(1), seconds (1.0, a unit, before anything was measured)."""
    if 1 in verify:
        return verify[1]
    if not verify:
        return 1.0
    n = min(verify)
    return verify[n] / (1.0 + VERIFY_SLOPE_PRIOR * (n - 1))


def _verify_cost(verify: dict[int, float], rows: int) -> float:
    if rows in verify:
        return verify[rows]
    v1 = _decode1(verify)
    seen = sorted(verify)
    lo = [n for n in seen if n < rows]
    hi = [n for n in seen if n > rows]
    if lo and hi:
        a, b = lo[-1], hi[0]
        return verify[a] + (verify[b] - verify[a]) * (rows - a) / (b - a)
    slope = VERIFY_SLOPE_PRIOR * v1
    if len(seen) >= 2:
        a, b = (seen[-2], seen[-1]) if lo else (seen[0], seen[1])
        slope = max((verify[b] - verify[a]) / (b - a), 0.0)
    if lo:
        return verify[lo[-1]] + slope * (rows - lo[-1])
    if hi:
        return max(verify[hi[0]] - slope * (hi[0] - rows), 0.5 * v1)
    return v1 * (1.0 + VERIFY_SLOPE_PRIOR * (rows - 1))


def _draft_cost(draft: dict[int, float], k: int, verify: dict[int, float]) -> float:
    if k == 0:
        return 0.0
    if k in draft:
        return draft[k]
    if draft:
        return k * sum(v / n for n, v in draft.items()) / len(draft)
    return k * DRAFT_STEP_PRIOR * _decode1(verify)


def _parts_cost(snap: tuple[dict[int, float], dict[int, float], float, float], k: int) -> float:
    """T(k) from the parts: decode, drafts, sampling, the rest."""
    verify, draft, sample_row, host = snap
    return _verify_cost(verify, k + 1) + _draft_cost(draft, k, verify) + sample_row * (k + 1) + host
