"""The wiring a collaborator acts through, bound after both were built.

Role: :class:`~model_agent.agent.wiring.Wiring` builds some collaborators before the others they act through
exist (the API client's and the breaker's observers, the reflectors' handlers); such a collaborator gets the
wiring later, in its ``attach``, and reads it as ``w``. Using it before then is a programming error.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from model_agent.agent.wiring import Wiring


class LateWiring:
    """The :class:`Wiring` a collaborator is given after it was built (its ``attach`` sets ``_w``)."""

    _w: Wiring | None = None

    @property
    def w(self) -> Wiring:
        """The collaborators (attached before first use)."""
        assert self._w is not None, f"{type(self).__name__} used before attach()"
        return self._w
