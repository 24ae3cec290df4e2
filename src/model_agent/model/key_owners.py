"""Which model a node label or a ConfigMap key belongs to, read back through what is known to be real.

Role: the reverse of :func:`~model_agent.model.keys.node_label_key` and
:func:`~model_agent.model.keys.configmap_key` for the agent's own labels and entries, when the runtime
gathers the models to look at (a label or entry with no model behind it is a removal candidate). Those key
functions truncate long names to ``hash8-tail``, and a truncated key parses back to a name that never
existed: its live read answers 404 for an object that was never there, which would "prove" a model gone
whose real name was never read, and would count toward the delete breaker. So a key is mapped, in order:

1. to the real models (cached objects, manifests: ``real_keys``) whose own label or ConfigMap key it is;
2. for a ConfigMap key, to the model its entry names (the entry's ``name`` field, the kind and namespace
   from the key), when that model's key is exactly this key; a label, to such a model named by an entry;
3. to the model parsed from the key, only when the key cannot be a truncated form (:func:`may_be_truncated`);
   a ConfigMap key that parses this way names the model of the labels too (ConfigMap keys have a far larger
   budget: a label truncated for a name is found through the untruncated ConfigMap key);
4. to nothing: :class:`Unresolved` — the caller leaves it alone, logs it and counts it (no live read of a
   real name is possible, so nothing can prove it an orphan).

A namespace of exactly eight lowercase hex digits is never taken from a BaseModel's key: it may be the hash
a long namespace was truncated to (such a model still resolves through step 1).

Contract: pure and deterministic; never raises for any input (garbled entries and foreign keys included).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Final, Literal

from model_agent.model import json_text
from model_agent.model.keys import (
    MODEL_LABEL_DOMAIN,
    ModelKind,
    configmap_key,
    node_label_key,
    parse_configmap_key,
)
from model_agent.model.resources import ModelRef

LABEL_PREFIX: Final = MODEL_LABEL_DOMAIN + "/"
_HASH8: Final = re.compile(r"[0-9a-f]{8}")
_HASHED_NAME: Final = re.compile(r"[0-9a-f]{8}-")

Where = Literal["label", "configmap"]


def _label_part(ref: ModelRef) -> str:
    return node_label_key(ref.kind, ref.namespace, ref.name).removeprefix(LABEL_PREFIX)


def _configmap_part(ref: ModelRef) -> str:
    return configmap_key(ref.kind, ref.namespace, ref.name)


KeyPart = Callable[[ModelRef], str]


@dataclass(frozen=True)
class Budgets:
    """How long a key's name part may be before the key function truncates it (measured, not restated)."""

    cluster: int
    basemodel: int  # len(namespace part) + len(name part)

    @classmethod
    def of(cls, part: KeyPart) -> Budgets:
        """Measure the budgets of ``part`` by keying a name far too long and seeing what survives the truncation."""
        long = "a" * 600
        cluster = parse_configmap_key(part(ModelRef(ModelKind.CLUSTER_BASE_MODEL, "", long)))
        # A one-character namespace is kept whole, so the name part takes the rest of the budget.
        basemodel = parse_configmap_key(part(ModelRef(ModelKind.BASE_MODEL, "n", long)))
        assert cluster is not None and basemodel is not None
        return cls(len(cluster.name.encode()), 1 + len(basemodel.name.encode()))


LABEL_BUDGETS: Final = Budgets.of(_label_part)
CONFIGMAP_BUDGETS: Final = Budgets.of(_configmap_part)


@dataclass(frozen=True)
class Unresolved:
    """A label or ConfigMap key that maps to no model known to be real: left alone."""

    where: Where
    key: str
    why: str


@dataclass
class Owners:
    """The models each label and ConfigMap key belongs to; what maps to none is in ``unresolved``."""

    by_label: dict[str, frozenset[str]] = field(default_factory=dict)
    by_configmap_key: dict[str, frozenset[str]] = field(default_factory=dict)
    unresolved: list[Unresolved] = field(default_factory=list)

    def keys(self) -> set[str]:
        """Every model key some label or ConfigMap key belongs to."""
        out: set[str] = set()
        for owners in (*self.by_label.values(), *self.by_configmap_key.values()):
            out.update(owners)
        return out


def may_be_truncated(kind: ModelKind, namespace_part: str, name_part: str, budgets: Budgets) -> bool:
    """Could a key with these parts be the truncated form of a longer name or namespace?

    A truncated name part is ``hash8-tail`` filling its budget exactly; a truncated namespace is ``hash8``.
    """
    if kind == ModelKind.CLUSTER_BASE_MODEL:
        return len(name_part.encode()) == budgets.cluster and _HASHED_NAME.match(name_part) is not None
    if _HASH8.fullmatch(namespace_part):
        return True
    total = len(namespace_part.encode()) + len(name_part.encode())
    return total == budgets.basemodel and _HASHED_NAME.match(name_part) is not None


def resolve(real_keys: Iterable[str], entries: Mapping[str, str], labels: Iterable[str]) -> Owners:
    """Map the node's model labels (full keys) and ConfigMap entries (key -> entry JSON) to model keys."""
    by_label: dict[str, set[str]] = {}
    by_cm: dict[str, set[str]] = {}
    for key in real_keys:
        try:
            real = ModelRef.from_key(key)
        except ValueError:
            continue
        by_label.setdefault(real.label_key, set()).add(key)
        by_cm.setdefault(real.configmap_key, set()).add(key)

    owners = Owners()
    from_entries: dict[str, set[str]] = {}  # label key -> models named by a ConfigMap key or entry
    for cm_key, raw in entries.items():
        if cm_key in by_cm:
            owners.by_configmap_key[cm_key] = frozenset(by_cm[cm_key])
            continue
        named, why = _from_entry(cm_key, raw)
        if named is None:
            owners.unresolved.append(Unresolved("configmap", cm_key, why))
            continue
        owners.by_configmap_key[cm_key] = frozenset({named.key})
        from_entries.setdefault(named.label_key, set()).add(named.key)

    for label in labels:
        if not label.startswith(LABEL_PREFIX):
            continue  # not a model label: the agent never reads or writes it
        known = by_label.get(label) or from_entries.get(label)
        if known:
            owners.by_label[label] = frozenset(known)
            continue
        parsed, why = _parsed(label.removeprefix(LABEL_PREFIX), _label_part, LABEL_BUDGETS)
        if parsed is None:
            owners.unresolved.append(Unresolved("label", label, why))
        else:
            owners.by_label[label] = frozenset({parsed.key})
    return owners


def _from_entry(cm_key: str, raw: str | None) -> tuple[ModelRef | None, str]:
    """The model an entry names under this key (its ``name``), else the model the key itself names."""
    parsed = parse_configmap_key(cm_key)
    if parsed is None:
        return None, "not a model key"
    name = _entry_name(raw)
    # The entry holds metadata.name whole; only a namespace that may be a hash cannot be taken from the key.
    if name and not (parsed.kind == ModelKind.BASE_MODEL and _HASH8.fullmatch(parsed.namespace)):
        ref = _ref(parsed.kind, parsed.namespace, name)
        if ref is not None and ref.configmap_key == cm_key:
            return ref, ""
    return _parsed(cm_key, _configmap_part, CONFIGMAP_BUDGETS)


def _parsed(name_part: str, part: KeyPart, budgets: Budgets) -> tuple[ModelRef | None, str]:
    parsed = parse_configmap_key(name_part)
    if parsed is None:
        return None, "not a model key"
    ref = _ref(parsed.kind, parsed.namespace, parsed.name)
    if ref is None or part(ref) != name_part:
        return None, "not a key the agent writes for any model"
    if may_be_truncated(parsed.kind, parsed.namespace, parsed.name, budgets):
        return None, "truncated: the model's real name is not known (no object, manifest or entry names it)"
    return ref, ""


def _ref(kind: ModelKind, namespace: str, name: str) -> ModelRef | None:
    try:
        return ModelRef(kind, namespace, name)
    except ValueError:
        return None


def _entry_name(raw: str | None) -> str:
    if not raw:
        return ""
    try:
        doc = json_text.loads(raw)
    except ValueError:
        return ""
    name = doc.get("name") if isinstance(doc, dict) else None
    return name if isinstance(name, str) else ""
