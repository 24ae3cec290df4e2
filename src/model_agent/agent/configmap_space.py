"""Room in the node's ConfigMap: which entries of a write batch fit, as a pure decision.

The API server refuses a ConfigMap whose ``data`` (every key's and value's UTF-8 bytes, plus
``binaryData``) exceeds 1 MiB, and it refuses the whole merge patch — every key batched with the one
that did not fit. :func:`place` decides per key from facts alone (the object's current data, the batch,
the byte budget) so that the patch sent always fits:

* a removal, or a value no larger than the current one, always goes (it frees room), and goes first;
* a growing value goes whole when it fits; otherwise in its smallest form (``compact``: the parsed config
  dropped, the status kept) when that fits; otherwise it is refused and the key keeps its current value;
* growing keys are taken in batch order (first come, first served), so a retry never displaces an entry
  that is already written;
* a status comes before a parsed config: when a growing key has no room even in its smallest form, entries
  already written (only keys ``ours`` accepts, never another writer's) lose their parsed config, largest
  saving first, until it fits. An entry keeps its status either way; only when every entry is already in
  its smallest form is a key refused.

:class:`~model_agent.agent.node_configmap.NodeConfigMap` carries the decision out and reports refusals.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

# The API server's bound on a ConfigMap's data (k8s.io/api core validation: 1 MiB, keys and values).
DATA_LIMIT_BYTES = 1024 * 1024
# Kept free for keys others write between the agent's read of the object and its patch.
HEADROOM_BYTES = 8 * 1024


def entry_bytes(key: str, value: str | None) -> int:
    """What one data key costs against the limit (nothing when absent)."""
    return 0 if value is None else len(key.encode()) + len(value.encode())


def data_bytes(data: Mapping[str, str]) -> int:
    """What a ConfigMap's ``data`` costs against the API server's limit."""
    return sum(entry_bytes(k, v) for k, v in data.items())


@dataclass(frozen=True)
class Placement:
    """:func:`place`'s decision for one batch: what to send, what was shrunk, what was refused, and the size after."""

    write: dict[str, str | None]  # what to send: key -> value (possibly compacted) or None (remove)
    compacted: frozenset[str]  # keys written in their smallest form for lack of room
    refused: Mapping[str, int]  # keys with no room even for their smallest form -> bytes that form needs
    used_bytes: int  # the data's size once ``write`` is applied


def place(
    current: Mapping[str, str],
    batch: Mapping[str, str | None],
    budget: int,
    compact: Callable[[str], str],
    ours: Callable[[str], bool] = lambda _key: False,
) -> Placement:
    """Decide which keys of ``batch`` go, and in which form, so the patch fits in ``budget`` (the module's rules)."""
    used = data_bytes(current)
    write: dict[str, str | None] = {}
    compacted: set[str] = set()
    refused: dict[str, int] = {}
    growing: list[tuple[str, str]] = []
    for key, value in batch.items():
        delta = entry_bytes(key, value) - entry_bytes(key, current.get(key))
        if value is None or delta <= 0:
            write[key] = value
            used += delta
        else:
            growing.append((key, value))
    # Entries already written that could give up their parsed config: (bytes saved, key), largest first.
    givers: list[tuple[int, str]] | None = None
    for key, value in growing:
        old = entry_bytes(key, current.get(key))
        small = compact(value)
        if used + entry_bytes(key, value) - old <= budget:
            write[key] = value
            used += entry_bytes(key, value) - old
            continue
        if used + entry_bytes(key, small) - old > budget:
            if givers is None:
                givers = sorted(
                    (
                        (entry_bytes(k, v) - entry_bytes(k, compact(v)), k)
                        for k, v in current.items()
                        if k not in batch and ours(k) and compact(v) != v
                    ),
                    reverse=True,
                )
            while givers and used + entry_bytes(key, small) - old > budget:
                saved, giver = givers.pop(0)
                write[giver] = compact(current[giver])
                compacted.add(giver)
                used -= saved
        if used + entry_bytes(key, small) - old <= budget:
            write[key] = small
            used += entry_bytes(key, small) - old
            if small != value:
                compacted.add(key)
        else:
            refused[key] = entry_bytes(key, small)
    return Placement(write, frozenset(compacted), refused, used)
