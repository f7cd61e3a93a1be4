"""Expected speedup from measured costs and acceptance (Leviathan et al.)."""

from __future__ import annotations



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
