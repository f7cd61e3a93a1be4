"""Generation: plain or MTP-speculative decoding, lossless at any temperature.

One module per job, each importing only downward (see ARCHITECTURE.md):

* :mod:`.stats` -- what a generation did (shared with the server's metrics);
  :mod:`.results` -- the result and streamed-piece types;
* :mod:`.chain` -- llama.cpp's own sampler chain in llama-server's order; :mod:`.sampling` -- the
  sampler (the chain's candidates as the next-token distribution, and the draw); :mod:`.rejection` --
  exact speculative sampling over drafted tokens (as vLLM's ``RejectionSampler``);
* :mod:`.drafter` -- drafters that propose tokens and take feedback (as transformers'
  ``CandidateGenerator``), and the skip-streak policy that wraps one;
* :mod:`.verifier` -- the verify decode, the KV rollback and the hidden state to draft from;
* :mod:`.logprobs` -- the emitted tokens' log-probabilities, from the rows verification has;
* :mod:`.constraint` -- structured output: a grammar (JSON schema, GBNF) every token follows;
* :mod:`.prefill` -- the prompt; :mod:`.prompt_cache` -- what a context's KV holds, to reuse a
  prompt's common prefix; :mod:`.state` -- a sequence saved to a file and restored, drafting
  drained first and the prompt cache told; :mod:`.loop` -- the round loop, which only orchestrates;
* :mod:`.controller` -- how many tokens each round drafts (a fixed count, or ``auto``);
* :mod:`.agreement` -- when two computations' greedy tokens agree (the near-tie rule), teacher-forced rows;
* :mod:`.text` -- tokens to text pieces; :mod:`.trace` -- the NDJSON acceptance trace;
* :mod:`.driver` -- the entry point ``generate``; :mod:`.chat` -- ``chat``, on top of it;
  :mod:`.pieces` -- one generation's rounds turned into text pieces (the context's lock per round).

The names below are imported on first access, so that the pure modules (``sampling``,
``rejection``, ``stats``, ``text``) load without the compiled extension.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._lazy import lazy_getattr

if TYPE_CHECKING:
    from .chat import chat
    from .driver import generate
    from .constraint import Grammar
    from .logprobs import TokenLogprob
    from .results import GenerationResult, TextPiece
    from .stats import GenerationStats

_LAZY = {"generate": ".driver", "chat": ".chat", "GenerationResult": ".results", "TextPiece": ".results",
         "GenerationStats": ".stats", "TokenLogprob": ".logprobs", "Grammar": ".constraint"}


__getattr__ = lazy_getattr(__name__, _LAZY)


__all__ = ["generate", "chat", "GenerationResult", "GenerationStats", "TextPiece", "TokenLogprob", "Grammar"]
