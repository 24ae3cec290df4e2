"""A cap on what one namespace's failing models occupy on a node: its Failed entries and labels.

Role: a model that cannot work still costs the node an entry in its ConfigMap (1 MiB for all models) and a label
on its Node object (etcd's limit for the whole object). Creating BaseModels is cheap, so one tenant with a few
thousand invalid ones would fill both on every node they select — about 1,300 failing models fill the
ConfigMap, about 21,000 labels the Node — and every other model's entry and label would then fail to be
written. :func:`admit` decides, per model, whether its ``Failed`` state may be shown:

* ``ClusterBaseModel``s (namespace ``""``) always are: they are the admin's;
* a model that already shows ``Failed`` here keeps showing it (it holds its place; no churn);
* otherwise while fewer than ``limit`` other models of its namespace show ``Failed`` on this node;
* ``limit`` 0 turns the cap off.

A model refused a place still gets its Warning Event and a ``model failed`` log line (once per refusal, not
on every reconcile), is counted in ``model_agent_failed_entries_refused_total{namespace}``, and has no label
and no entry on this node — one it had for an earlier state (``Updating``) is removed, since that is the
space the cap bounds; no serving pod is affected (only ``Ready`` sends pods to a node). When others of its
namespace stop showing ``Failed`` (fixed, deleted), the next reconcile of a refused model admits it.

:class:`FailedQuota` is the one actor's bookkeeping: which keys of each namespace show ``Failed`` here, read
once from the ConfigMap at first use (so a restart starts from what the node shows) and kept by the
reconciler's decisions. A holder drops out at the next decision once its Failed entry, seen written, says
something else or is gone; an admitted entry not seen written yet (writes are batched) keeps its place.
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


def admit(namespace: str, shown: bool, holders: int, limit: int) -> bool:
    """Whether a failing model may show ``Failed`` here (a pure decision).

    ``shown``: it already shows ``Failed`` on this node; ``holders``: how many *other* models of its namespace
    do; ``limit``: the cap (0: none).
    """
    if not namespace or limit <= 0 or shown:
        return True
    return holders < limit


@dataclass(frozen=True)
class Admission:
    admitted: bool
    newly_refused: bool = False  # refused now and not at the previous decision: report it (Event, log, metric)


def _shows_failed(value: str | None) -> bool:
    if not value:
        return False
    entry = ModelEntry.from_json(value)
    return entry is not None and entry.status == ModelState.FAILED.value


class FailedQuota:
    def __init__(self, limit: int = DEFAULT_FAILED_PER_NAMESPACE, registry: CollectorRegistry | None = None) -> None:
        self.limit = limit
        # namespace -> ConfigMap key showing Failed here (or admitted to) -> whether its Failed entry was seen written
        self._holders: dict[str, dict[str, bool]] | None = None
        self._refused: set[str] = set()  # model keys refused at their last decision
        self.refusals = Counter(
            "model_agent_failed_entries_refused",
            "Failing models refused a ConfigMap entry and a Node label: their namespace's cap was reached",
            ("namespace",),
            registry=registry,
        )

    def _index(self, data: Mapping[str, str]) -> dict[str, dict[str, bool]]:
        if self._holders is None:
            holders: dict[str, dict[str, bool]] = {}
            for key, value in data.items():
                parsed = parse_configmap_key(key)
                if parsed is not None and parsed.namespace and _shows_failed(value):
                    holders.setdefault(parsed.namespace, {})[key] = True
            self._holders = holders
        return self._holders

    @staticmethod
    def _prune(holders: dict[str, bool], data: Mapping[str, str]) -> None:
        for key, seen in list(holders.items()):
            if _shows_failed(data.get(key)):
                holders[key] = True
            elif seen:  # its Failed entry was written and says something else now, or is gone: the place is free
                del holders[key]
            # else: admitted, its write not seen yet (the entry may still show the state before, e.g. Updating)

    def decide(self, ref: ModelRef, label: str | None, data: Mapping[str, str]) -> Admission:
        """Decide for ``ref`` from this node's facts (its label value, the ConfigMap data) and keep the books."""
        if not ref.namespace or self.limit <= 0:
            return Admission(True)
        holders = self._index(data).setdefault(ref.namespace, {})
        self._prune(holders, data)
        mine = ref.configmap_key
        shown = label == ModelState.FAILED.value or _shows_failed(data.get(mine))
        others = len(holders) - (mine in holders)
        if admit(ref.namespace, shown, others, self.limit):
            holders.setdefault(mine, _shows_failed(data.get(mine)))
            self._refused.discard(ref.key)
            return Admission(True)
        holders.pop(mine, None)
        newly = ref.key not in self._refused
        if newly:
            self._refused.add(ref.key)
            self.refusals.labels(ref.namespace).inc()
        return Admission(False, newly)
