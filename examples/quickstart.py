"""Quick start: generate with the bundled trained Gemma 4 pair, with and without MTP.

    python examples/quickstart.py
"""

from mtp_bindings import Model
from mtp_bindings.models import ASSISTANT, TARGET  # the bundled tiny pair: it writes gibberish

with Model(TARGET, assistant=ASSISTANT) as model:
    # draft_n_max=0: plain decoding; None: MTP's default, the auto draft count (chosen each round);
    # temperature=0: greedy (the default samples as llama-server does, at 0.8), so both write the same text
    for draft_n_max in (0, None):
        result = model.generate("def read_config(path):\n", max_tokens=64, draft_n_max=draft_n_max, temperature=0)
        s = result.stats
        print(f"draft_n_max={draft_n_max}: {s.tokens_per_second:.0f} tokens/s, acceptance {s.acceptance_rate:.0%}, "
              f"rounds by drafts {s.rounds_per_k}")
    print(result.text)
