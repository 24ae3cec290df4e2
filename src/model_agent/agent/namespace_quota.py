"""Caps on what one namespace's models occupy on a node: its entries and labels, per state.

Role: every model shown on a node costs an entry in its ConfigMap (1 MiB for all models) and a label on its Node
object (etcd's limit for the whole object). Creating BaseModels is cheap, so one tenant with a few thousand of
them would fill both on every node they select — about 1,300 entries fill the ConfigMap, about 21,000 labels the
Node — and every other model's entry and label would then fail to be written. Two caps, each a
:class:`NamespaceQuota`, bound that per namespace and node:

* ``--max-models-per-namespace``: models shown ``Ready`` or ``Updating`` (a model over it is not fetched and
  shows ``Failed: ModelQuotaExceeded`` instead, which the next cap bounds in turn);
* ``--max-failed-per-namespace``: models shown ``Failed`` (a model over it has no label and no entry here, only its
  Warning Event).

:func:`admit` decides, per model, whether it may take a place:

* ``ClusterBaseModel``s (namespace ``""``) always may: they are the admin's;
* a model that already shows a state of the cap here keeps its place (no churn);
* otherwise while fewer than ``limit`` other models of its namespace hold one on this node;
* ``limit`` 0 turns the cap off.

A model refused a place is reported once per refusal, not on every reconcile (a Warning Event, a log line, the
cap's counter by namespace); it has no entry of the cap's states on this node; no serving pod is affected (a
refused model never becomes ``Ready`` here). When others of its namespace give their places up (fixed, deleted),
the next reconcile of a refused model admits it.

:class:`NamespaceQuota` is the one actor's bookkeeping: which keys of each namespace hold a place here, read once
from the ConfigMap at first use (so a restart starts from what the node shows) and kept by the reconciler's
decisions. A holder drops out at the next decision once its entry, seen in a state of the cap, says something else
or is gone, or when the reconciler releases it (:meth:`NamespaceQuota.release`: it shows another state now); an
admitted entry not seen written yet (writes are batched) keeps its place.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import structlog
from prometheus_client import CollectorRegistry, Counter

from model_agent.model.entry import ModelEntry
from model_agent.model.keys import ModelState, parse_configmap_key
from model_agent.model.resources import ModelRef

log = structlog.get_logger(__name__)

DEFAULT_FAILED_PER_NAMESPACE = 50
"""Failed models of one namespace shown on one node (``--max-failed-per-namespace``)."""
OVER_QUOTA = "FailedQuotaExceeded"
"""The reason of the Warning Event of a model refused a place (its failure reason is named in the message)."""
DEFAULT_MODELS_PER_NAMESPACE = 100
"""Models of one namespace shown Ready or Updating on one node (``--max-models-per-namespace``)."""
MODELS_OVER_QUOTA = "ModelQuotaExceeded"
"""The Failed reason of a model refused a place by ``--max-models-per-namespace``."""
SERVING_STATES = frozenset({ModelState.READY.value, ModelState.UPDATING.value})
FAILED_STATES = frozenset({ModelState.FAILED.value})


def admit(namespace: str, shown: bool, holders: int, limit: int) -> bool:
    """Whether a model may take a place of a cap here (a pure decision).

    ``shown``: it already shows a state of the cap on this node; ``holders``: how many *other* models of its
    namespace hold a place; ``limit``: the cap (0: none).
    """
    if not namespace or limit <= 0 or shown:
        return True
    return holders < limit


@dataclass(frozen=True)
class Admission:
    admitted: bool
    newly_refused: bool = False  # refused now and not at the previous decision: report it (Event, log, metric)


def _shows(value: str | None, states: frozenset[str]) -> bool:
    if not value:
        return False
    entry = ModelEntry.from_json(value)
    return entry is not None and entry.status in states


class NamespaceQuota:
    """One cap: at most ``limit`` models of a namespace show one of ``states`` on this node (see the module)."""

    def __init__(
        self,
        limit: int,
        states: frozenset[str],
        registry: CollectorRegistry | None = None,
        *,
        metric: str = "model_agent_failed_entries_refused",
        metric_help: str = "Failing models refused a ConfigMap entry and a Node label: the namespace's cap is reached",
    ) -> None:
        self.limit = limit
        self.states = states
        # namespace -> ConfigMap key holding a place here (or admitted to one) -> whether its entry was seen in a state
        self._holders: dict[str, dict[str, bool]] | None = None
        self._refused: set[str] = set()  # model keys refused at their last decision
        self.refusals = Counter(metric, metric_help, ("namespace",), registry=registry)

    def _index(self, data: Mapping[str, str]) -> dict[str, dict[str, bool]]:
        if self._holders is None:
            holders: dict[str, dict[str, bool]] = {}
            for key, value in data.items():
                parsed = parse_configmap_key(key)
                if parsed is not None and parsed.namespace and _shows(value, self.states):
                    holders.setdefault(parsed.namespace, {})[key] = True
            self._holders = holders
        return self._holders

    def _prune(self, holders: dict[str, bool], data: Mapping[str, str]) -> None:
        for key, seen in list(holders.items()):
            if _shows(data.get(key), self.states):
                holders[key] = True
            elif seen:  # its entry was written and says something else now, or is gone: the place is free
                del holders[key]
            # else: admitted, its write not seen yet (the entry may still show the state before, e.g. Updating)

    def decide(self, ref: ModelRef, label: str | None, data: Mapping[str, str]) -> Admission:
        """Decide for ``ref`` from this node's facts (its label value, the ConfigMap data) and keep the books."""
        if not ref.namespace or self.limit <= 0:
            return Admission(True)
        holders = self._index(data).setdefault(ref.namespace, {})
        self._prune(holders, data)
        mine = ref.configmap_key
        shown = label in self.states or _shows(data.get(mine), self.states)
        others = len(holders) - (mine in holders)
        if admit(ref.namespace, shown, others, self.limit):
            holders.setdefault(mine, _shows(data.get(mine), self.states))
            self._refused.discard(ref.key)
            return Admission(True)
        holders.pop(mine, None)
        newly = ref.key not in self._refused
        if newly:
            self._refused.add(ref.key)
            self.refusals.labels(ref.namespace).inc()
        return Admission(False, newly)

    def release(self, ref: ModelRef) -> None:
        """``ref`` gives its place up: the reconciler shows it in another state, or removes it, now."""
        if self._holders is not None and ref.namespace:
            self._holders.get(ref.namespace, {}).pop(ref.configmap_key, None)
        self._refused.discard(ref.key)


def failed_quota(
    limit: int = DEFAULT_FAILED_PER_NAMESPACE, registry: CollectorRegistry | None = None
) -> NamespaceQuota:
    """The cap on a namespace's ``Failed`` entries and labels (``--max-failed-per-namespace``)."""
    return NamespaceQuota(limit, FAILED_STATES, registry)


def models_quota(
    limit: int = DEFAULT_MODELS_PER_NAMESPACE, registry: CollectorRegistry | None = None
) -> NamespaceQuota:
    """The cap on a namespace's ``Ready`` and ``Updating`` models (``--max-models-per-namespace``)."""
    return NamespaceQuota(
        limit,
        SERVING_STATES,
        registry,
        metric="model_agent_models_refused",
        metric_help="Models not fetched on a node: their namespace's cap of Ready and Updating models was reached",
    )
