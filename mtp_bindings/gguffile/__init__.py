"""GGUF files without native code: inspecting and checking them (:mod:`.tools`) and converting a
Hugging Face checkpoint with the bundled converter (:mod:`.convert`)."""
