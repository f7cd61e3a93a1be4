"""How many tokens to draft each round: a fixed count, or ``auto``, chosen from what this context
measures as it runs (the place of transformers' ``update_candidate_strategy``).

``auto`` picks, before each round, the ``k`` in ``0..k_max`` with the most expected tokens per
second, ``E(k) / T(k)``:

* ``E(k) = 1 + a_1 + a_1 a_2 + ... + a_1 .. a_k``, with ``a_i`` the running estimate of the chance
  that draft ``i`` is accepted once drafts ``1..i-1`` were (exponentially forgetting, so it follows
  the text; it starts from what earlier requests on this context measured, else a prior);
* ``T(k)``: a running estimate of what whole rounds with ``k`` drafts took on this context, end to
  end (the caller's own time between rounds included, and what drafting beside it costs: on a
  host-bound pair that is most of it); for a ``k`` not yet seen, the nearest seen one's, moved by
  its parts ``V(k + 1) + D(k) + S (k + 1) + H``: the target's decode of ``k + 1`` rows, the wait
  for ``k`` drafts, sampling per row and the rest, each a running estimate too (:class:`.costs.CostModel`,
  kept on the context across requests). Parts never measured come from the nearest measured ones; costs by
size are fitted nondecreasing (:func:`.costs.nondecreasing`).
Each running cost is the median of its last ``COST_WINDOW`` measurements of the last ``COST_MAX_AGE``
rounds (robust to this kind of VM's heavy-tailed rounds, and to its phases for a cost only probes measure).

``k = 0`` is a plain decode: no drafting graph, no verify rows. While the choice is below ``k_max``
it drafts one more token now and then, and one fewer (every ``PROBE_MIN``..``PROBE_MAX`` rounds, backing
off while the probes change nothing; every other way down is plain decoding itself, two rounds), so an
estimate that has gone stale can recover. A cold context measures plain decoding right after its first
drafting round. A plain round right after a drafting one does not stand for T(0) (drafting winding down shares
its CPU, the one-row graph is built again): it counts in what a probe up from plain decoding costs. Between
probes a choice of 0 stands without being computed again (plain rounds teach nothing about acceptance): the
loop runs ``PLAIN_SAMPLE`` plain rounds on one call (a lease) and the last of them is measured. The wait for a
probe counts the context's rounds across its requests. Acceptance is pooled across the requests on a context by
their sampler settings (the same pair accepts far less at temperature 1.5 than at 0). It only changes how much
is drafted, so the output stays what plain decoding gives. Pure Python.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Hashable
from typing import Any, Protocol

from .costs import ACCEPT_PRIOR, CostModel, RoundCost

# Every constant of the policy, in one place (the cost model's in .costs).
ACCEPT_PRIOR_WEIGHT = 4.0  # rounds of evidence a request's starting estimate is worth
ACCEPT_DECAY = 0.97       # weight kept by past observations at each new one (a ~30-round memory)
ACCEPT_BONUS = 0.5        # standard errors added to each estimate when choosing (see Acceptance.optimistic)
PROBE_MIN = 8             # rounds between probes of one more draft, at first ...
PROBE_MAX = 32            # ... and at most, after probes that changed nothing,
PROBE_BUDGET = 0.01       # ... unless a probe costs more than this share of the time between probes
PLAIN_SAMPLE = 8          # while a choice of 0 stands, plain rounds are measured this many at a time


class Acceptance:
    """Running conditional acceptance per draft position for one request, forgetting old rounds."""

    def __init__(self, prior: list[float]) -> None:
        self.tried = [ACCEPT_PRIOR_WEIGHT] * len(prior)
        self.accepted = [p * ACCEPT_PRIOR_WEIGHT for p in prior]

    def observe(self, k: int, n_accepted: int) -> None:
        # position i (0-based) was reached when every draft before it was accepted
        for i in range(min(k, n_accepted + 1, len(self.tried))):
            self.tried[i] = ACCEPT_DECAY * self.tried[i] + 1.0
            self.accepted[i] = ACCEPT_DECAY * self.accepted[i] + (1.0 if i < n_accepted else 0.0)

    def rates(self) -> list[float]:
        return [a / t for a, t in zip(self.accepted, self.tried)]

    def optimistic(self) -> list[float]:
        """The rates plus ``ACCEPT_BONUS`` standard errors: a position seen little is tried again rather
        than written off after an unlucky round or two."""
        out = []
        for a, t in zip(self.accepted, self.tried):
            p = a / t
            out.append(min(1.0, p + ACCEPT_BONUS * math.sqrt(p * (1.0 - p) / t)))
        return out

    def expected(self, k_max: int, optimistic: bool = False) -> list[float]:
        """E(k) for k in ``0..k_max``: tokens a round with ``k`` drafts yields (the sampled one included)."""
        out, run = [1.0], 1.0
        for p in (self.optimistic() if optimistic else self.rates())[:k_max]:
            run *= p
            out.append(out[-1] + run)
        return out

    def expected_tokens(self, k: int) -> float:
        """E(k) of one ``k``."""
        return self.expected(k)[k]


class DraftCount(Protocol):
    """What the loop asks of a draft-count policy: at most one call per round, none during a ``lease`` (on a
    pair whose plain round takes 0.2 ms, each call after a decode cost 1.5-3 us, caches cold: three a round
    were 3 % of it)."""

    lease: int
    """Rounds after the last choice that repeat it without a call to :meth:`after`; the next call
    reports the last of them (and counts them all: the clock of the costs' age)."""

    def first(self) -> int:
        """The drafts of a request's first round (before the loop's limits)."""

    def after(self, k: int, n_accepted: int, draft: float, verify: float, sample: float, seconds: float) -> int:
        """A round with ``k`` drafts kept ``n_accepted``; what its parts took (seconds: the wait for the
        drafts, the target's decode, the sampler) and what the whole round took, from the end of the round
        before to its own (the caller's time between them included). Returns the drafts wanted next."""

    def finish(self) -> dict[str, Any] | None:
        """End of the request: what the policy estimated (for the stats), or None."""


class FixedCount:
    """Always the same count (``draft_n_max``, or 0 for plain decoding)."""

    def __init__(self, k: int) -> None:
        self.k = k
        self.lease = sys.maxsize  # nothing to learn: never asked again

    def first(self) -> int:
        return self.k

    def after(self, k: int, n_accepted: int, draft: float, verify: float, sample: float, seconds: float) -> int:
        return self.k

    def finish(self) -> dict[str, Any] | None:
        return None


class AutoCount:
    """``auto``: the count with the most expected tokens per second (see the module's docstring)."""

    def __init__(self, costs: CostModel, k_max: int, pool_key: Hashable = None) -> None:
        self.costs = costs
        self.k_max = k_max
        self.pool_key = pool_key
        self.acceptance = Acceptance(costs.acceptance_prior(k_max, pool_key))
        self.drafted = True  # a round with drafts was observed since the last full choice
        self.tried = [0] * k_max
        self.accepted = [0] * k_max
        self.best = 0
        # rounds since the context's last probe: requests are often shorter than an expensive probe's wait, and one
        # bad early estimate of drafting (a slow phase) then kept every later request of the context from drafting
        self.since_probe = costs.rounds - costs.last_probe
        self.probe_every = PROBE_MIN
        self.probe_wait = 0  # rounds an expensive probe waits for, to stay inside the budget
        self.probes = 0
        self.probe_up = True  # probes alternate: one draft more, one fewer (a cost never measured is a guess)
        self.prev_k: int | None = None  # the drafts of the round observed last
        self.down_to_plain = True  # the next probe down goes to plain decoding (they alternate with one fewer draft)
        self.plain_wanted = False  # plain rounds until one is measured (a cold start, a probe down to plain)
        self.lease = 0
        self.last_rates: list[float] | None = None  # of the last full choice (for the stats)

    def costs_and_rates(self) -> tuple[list[float], list[float]]:
        """T(k) and expected tokens per second for each k in ``0..k_max``."""
        costs = self.costs.round_costs(self.k_max)
        expected = self.acceptance.expected(self.k_max, optimistic=True)
        return costs, [e / t for e, t in zip(expected, costs)]

    def rates(self) -> list[float]:
        """Expected tokens per second for each k in ``0..k_max``."""
        return self.costs_and_rates()[1]

    def choose(self) -> int:
        rounds_seen = self.costs.measured("total")  # not .total: that takes the medians, this is every round
        plain_seen = 0 in rounds_seen
        if self.plain_wanted or (not plain_seen and (rounds_seen or self.tried[0])):
            # Plain rounds until one is measured: asked by a probe down to plain decoding, or because drafting has
            # begun on this context and no plain round was ever measured (T(0) would be T(k) less the parts'
            # difference, carrying whatever every drafting round pays unseen: most of a round on a host-bound
            # pair, where a cold start then drafted for many rounds). The first, right after drafting, is not
            # measured (see observe).
            self.plain_wanted = True
            return 0
        if not self.drafted and self.since_probe + 1 < max(self.probe_every, self.probe_wait):
            # Plain rounds teach nothing about acceptance and only refine T(0): the choice stands until the
            # next probe is due (on a pair whose decode takes 0.5 ms the full choice was 2-3 % of a round).
            self.since_probe += 1
            return self.best
        self.drafted = False
        costs, rates = self.costs_and_rates()
        self.last_rates = rates
        best = max(range(len(rates)), key=lambda k: (rates[k], -k))
        if best != self.best:
            self.probe_every = PROBE_MIN  # the choice moved: look around again soon
        self.best = best
        self.since_probe += 1
        if self.since_probe < self.probe_every:
            return best
        up = best + 1 if best < self.k_max else None
        # every other way down goes to plain decoding itself (two rounds): T(0) is what auto must never lose to, and
        # a measurement that is never refreshed while drafting goes on (one slow plain round) would stand forever
        down = (0 if self.down_to_plain else best - 1) if best > 0 else None
        probe = (up if up is not None else down) if self.probe_up else (down if down is not None else up)
        if probe is None:
            return best
        # an expensive probe (drafting on a host-bound pair) waits longer, to cost at most PROBE_BUDGET; one up from
        # plain decoding also slows the plain round after it, which no T(k) holds (tiny pair, T 1.5: a plain round
        # 0.3 ms, the one after a probe 0.5-0.7 ms; left out, probes cost 2-3 % of the time [AMD EPYC; avx2])
        extra = max(costs[probe] - costs[best], 0.0)
        after = self.costs.after_drafting if best == 0 else None
        if after is not None:
            extra += max(after - costs[0], 0.0)
        self.probe_wait = math.ceil(extra / (PROBE_BUDGET * costs[best]))
        if self.since_probe < self.probe_wait:
            return best
        self.since_probe = 0
        self.costs.last_probe = self.costs.rounds
        self.probe_every = min(2 * self.probe_every, PROBE_MAX)
        if probe == down:
            self.down_to_plain = not self.down_to_plain
            self.plain_wanted = probe == 0
        self.probe_up = not self.probe_up
        self.probes += 1
        return probe

    def first(self) -> int:
        return self.choose()

    def after(self, k: int, n_accepted: int, draft: float, verify: float, sample: float, seconds: float) -> int:
        leased, self.lease = self.lease, 0
        if not k and not self.prev_k and not self.drafted and not self.plain_wanted:
            # While plain decoding stands (checked first: it is most rounds where drafting cannot pay), the choice
            # stands until the next probe is due (see choose), and the loop runs up to PLAIN_SAMPLE plain rounds on
            # one call: the last of them is measured (a round, not their mean: the other costs are medians of
            # rounds, and a mean carries this kind of VM's slow rounds), and the windows' age clock runs for each.
            # Measuring every round only refined T(0), and on a pair whose decode takes 0.2 ms the calls were 2-3 %
            # of a round. A plain round teaches no acceptance.
            self.since_probe += leased  # the choices the lease made
            if leased:
                c = RoundCost(0, draft, verify, sample)
                self.costs.tick(leased)
                self.costs.observe(c)
                self.costs.observe_round(c, seconds)
            else:
                self.costs.tick()
            limit = max(self.probe_every, self.probe_wait)
            if self.since_probe + 1 < limit:
                self.since_probe += 1
                self.lease = min(PLAIN_SAMPLE - 1, limit - self.since_probe - 1)
                return self.best
            return self.choose()
        self._observe(RoundCost(k, draft, verify, sample), n_accepted, seconds)
        return self.choose()

    def _observe(self, cost: RoundCost, n_accepted: int, seconds: float) -> None:
        """A round outside standing plain decoding: its parts and whole time (unless it followed drafting), its
        acceptance."""
        after_drafting = cost.k == 0 and bool(self.prev_k)
        self.prev_k = cost.k
        if after_drafting:
            # A plain round right after a drafting one shares the CPU with the drafting that winds down (on a
            # 2-core machine it measured 5-7 ms where plain rounds take 0.5): it does not stand for plain decoding,
            # but for part of what the probe before it cost.
            self.costs.observe_after_drafting(seconds)
        else:
            self.costs.observe(cost)
            self.costs.observe_round(cost, seconds)
            if cost.k == 0 and self.plain_wanted:
                self.plain_wanted = False
                self.drafted = True  # the next choice is computed again, with what this round measured
        self.acceptance.observe(cost.k, n_accepted)
        self.drafted = self.drafted or cost.k > 0
        for i in range(min(cost.k, n_accepted + 1)):
            self.tried[i] += 1
            self.accepted[i] += i < n_accepted

    def finish(self) -> dict[str, Any]:
        self.costs.pool(self.tried, self.accepted, self.pool_key)
        c = self.costs
        ms = 1e3
        return {
            "policy": "auto", "k_max": self.k_max, "probes": self.probes,
            "verify_ms": {n: round(v * ms, 3) for n, v in sorted(c.verify.items())},
            "draft_ms": {k: round(v * ms, 3) for k, v in sorted(c.draft.items())},
            "sample_ms_per_row": round((c.sample_row or 0.0) * ms, 4),
            "host_ms": round((c.host or 0.0) * ms, 3),
            "round_ms": {k: round(v * ms, 3) for k, v in sorted(c.total.items())},
            "acceptance": [round(p, 4) for p in self.acceptance.rates()],
            "expected_tokens_per_s": [round(r, 2) for r in (self.last_rates or self.rates())],
        }


COSTS_KEY = "draft_costs"


def make_draft_count(ctx: Any, drafting: bool, k_max: int, auto: bool, pool_key: Hashable = None) -> DraftCount:
    """The policy of one generation on ``ctx``: ``auto`` up to ``k_max`` with the context's
    :class:`CostModel` (acceptance pooled across requests with the same ``pool_key``: their sampler
    settings), else ``k_max`` every round (0 when not drafting)."""
    if not drafting:
        return FixedCount(0)
    if not auto:
        return FixedCount(k_max)
    costs = ctx.extension(COSTS_KEY, lambda _ctx: CostModel())
    return AutoCount(costs, k_max, pool_key=pool_key)
