"""Well-formed JSON of the wrong shape, shared by the readers' tests: each reader must treat it as its contract says
(absent, untrusted, or its documented error), never raise something else."""

from __future__ import annotations

# A document that is JSON but not an object.
NOT_OBJECTS = ("[]", "1", '"x"', "null")

# Well-formed JSON nested past any recursion limit: json.loads raises RecursionError, which is not a ValueError.
DEEP = "[" * 100_000 + "]" * 100_000
