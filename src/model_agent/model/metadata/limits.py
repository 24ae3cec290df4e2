"""Limits every parsed value is held to, whatever a model's files say (docs/security.md R2, R3).

Role: the numbers the pure rules cut and refuse by, in one place, so the bounds are reviewable at a glance.
Constants only; no I/O. (The limits on what is *read* from disk live with the reading, in
``model_agent.local.metadata_files``.)
"""

from __future__ import annotations

from typing import Final

# Values one JSON document may hold (objects, arrays and scalars, counted from the delimiters before
# decoding). The largest real shard index (~100k tensors) uses about a tenth of it; at the limit the
# decoded objects stay near 100 MiB.
MAX_JSON_ELEMENTS: Final = 1_000_000
# Characters kept of a string that a model's files put in the entry (model type, architecture, dtype...).
MAX_METADATA_STRING: Final = 256
# Extra components (beyond the five named ones) kept of a diffusers pipeline index.
MAX_PIPELINE_COMPONENTS: Final = 32

INT32_MAX: Final = 2**31 - 1
"""Largest context length written (Go's int32 field); anything above is treated as unknown."""
INT64_MAX: Final = 2**63 - 1
"""Largest parameter count or byte size written (Go's int64); larger values are unknown, never wrapped."""
