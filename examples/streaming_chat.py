"""Streaming chat with the GGUF's chat template, sampled at temperature 0.7 (losslessly).

    python examples/streaming_chat.py
"""

from mtp_bindings import Model
from mtp_bindings.models import ASSISTANT, TARGET  # the bundled tiny pair: it writes gibberish

with Model(TARGET, assistant=ASSISTANT) as model:
    messages = [{"role": "user", "content": "Write a function that reverses a list."}]
    stats = None
    for piece in model.chat(messages, max_tokens=64, temperature=0.7, seed=42, stream=True):
        print(piece, end="", flush=True)
        stats = piece.stats or stats
    print(f"\n[{stats.n_generated} tokens, acceptance {stats.acceptance_rate:.0%}]")
