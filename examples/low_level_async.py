"""The async MTP draft API: submit a draft request, do other work, wait for the drafts.

    python examples/low_level_async.py
"""

import numpy as np

from mtp_bindings import Model
from mtp_bindings.models import ASSISTANT, TARGET  # the bundled tiny pair: it writes gibberish

with Model(TARGET, assistant=ASSISTANT) as model:
    with model.create_context(n_ctx=512, embeddings=True) as ctx:
        prompt = model.tokenize("import os\nimport sys\n")
        ctx.decode(prompt)                              # target pass over the prompt
        token = int(np.argmax(ctx.get_logits(-1)))      # the next token (greedy)
        h = ctx.get_embeddings(-1)                      # its h_prev: hidden state of the last row
        handle = ctx.decode_mtp_async(seq_id=0, attn_pos=ctx.seq_pos_max(0), last_token=token,
                                      h_prev=h, n_steps=3)
        # ... the target may append past attn_pos while the drafter runs ...
        drafts, h_last = handle.wait()
        print("next token:", model.detokenize([token]), "| drafts:", repr(model.detokenize(drafts.tolist())))
