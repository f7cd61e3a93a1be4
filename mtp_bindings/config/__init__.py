"""Configuration, without native code: every default and bound (:mod:`.params`), the generation
limits (:mod:`.limits`), the drafting presets (:mod:`.presets`), the environment variables the
library honours (:mod:`.env`) and the thread budget (:mod:`.threads`)."""
