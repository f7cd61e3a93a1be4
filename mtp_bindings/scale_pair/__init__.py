"""``mtp-bindings scale-pair``: a Gemma 4 E2B-shaped pair that computes what the bundled trained pair
computes. :mod:`.build` writes and caches it, :mod:`.tensors` holds the construction,
:mod:`.writer` reads and writes the GGUF files and quantizes, :mod:`.check` compares the two pairs."""
