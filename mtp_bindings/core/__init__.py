"""The parts the core classes (:mod:`mtp_bindings.llama_model`, :mod:`mtp_bindings.llama_context`) are
built from, one concern a module: ``vocab`` (a model's tokenizer), ``outputs`` (a context's logits and
embeddings). Kept a docstring: importing one part loads nothing else."""
