"""Unit tests for the informer store: vanished keys are candidates, and what the store heard of each key
(tombstones included) decides whether a live read may repair it."""

from __future__ import annotations

from typing import Any

from model_agent.kube.store import Store


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def obj(name: str, rv: str = "1", uid: str = "u1") -> dict[str, Any]:
    return {"kind": "ClusterBaseModel", "metadata": {"name": name, "resourceVersion": rv, "uid": uid}}


def test_a_relist_reports_vanished_keys_and_leaves_a_tombstone() -> None:
    clock = Clock()
    store = Store(clock=clock)
    store.replace([obj("a"), obj("b")])
    clock.advance(1)
    changes = store.replace([obj("a")])
    assert [(c.key, c.vanished) for c in changes] == [("b", True)]
    heard = store.heard("b")
    assert heard is not None and heard.deleted and heard.at == clock.now


def test_a_delete_leaves_a_tombstone_with_the_deleted_objects_resource_version() -> None:
    clock = Clock()
    store = Store(clock=clock)
    store.upsert(obj("x", rv="5"))
    clock.advance(1)
    change = store.delete(obj("x", rv="9"))
    assert change.old == obj("x", rv="5")  # the last known state travels with the change
    heard = store.heard("x")
    assert heard is not None and heard.deleted and heard.resource_version == "9"


def test_a_read_that_started_before_a_heard_delete_does_not_repair() -> None:
    # The race of item 5: a LIST proved X alive, X was deleted and its DELETED heard, then the answer arrived.
    clock = Clock()
    store = Store(clock=clock)
    store.upsert(obj("x"))
    read_started = clock.now + 1
    clock.advance(2)
    store.delete(obj("x"))  # heard after the read began
    clock.advance(1)
    assert not store.repair(obj("x"), read_started)
    assert "x" not in store


def test_a_read_that_started_after_everything_heard_repairs() -> None:
    clock = Clock()
    store = Store(clock=clock)
    store.replace([obj("x")])
    clock.advance(1)
    store.replace([])  # a relist that omitted it (a rumour)
    clock.advance(1)
    read_started = clock.now
    clock.advance(1)
    assert store.repair(obj("x", rv="2"), read_started)
    assert store.get("x") == obj("x", rv="2")
    heard = store.heard("x")
    assert heard is not None and not heard.deleted


def test_a_repair_never_overwrites_a_cached_object() -> None:
    clock = Clock()
    store = Store(clock=clock)
    read_started = clock.now
    clock.advance(1)
    store.upsert(obj("x", rv="7"))  # the watch brought a newer state meanwhile
    assert not store.repair(obj("x", rv="3"), read_started)
    assert store.get("x") == obj("x", rv="7")


def test_a_key_never_heard_of_is_repaired() -> None:
    clock = Clock()
    store = Store(clock=clock)
    assert store.repair(obj("x"), clock.now)


def test_tombstones_expire_and_reads_older_than_them_are_refused() -> None:
    clock = Clock()
    store = Store(clock=clock, tombstone_ttl_s=100)
    read_started = clock.now
    store.delete(obj("x"))
    clock.advance(200)
    store.delete(obj("y"))  # any later delete prunes what is older than the TTL
    assert store.heard("x") is None
    assert not store.repair(obj("x"), read_started)  # older than what the store still remembers
    assert store.heard("y") is not None


def test_a_relist_after_the_read_began_that_lacks_the_key_refuses_the_repair() -> None:
    # X vanished in a relist (a rumour), a confirmation read began, X was really deleted while no watch was
    # open, and the next relist lacks X: the store has no entry for X to change, but the relist is newer news.
    clock = Clock()
    store = Store(clock=clock)
    store.replace([obj("x"), obj("a")])
    clock.advance(1)
    store.replace([obj("a")])
    clock.advance(1)
    read_started = clock.now
    clock.advance(1)
    store.replace([obj("a")])
    clock.advance(1)
    assert not store.repair(obj("x"), read_started)
    assert store.repair(obj("x"), clock.now)  # a read that began after that relist may repair
