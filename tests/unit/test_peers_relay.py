"""Relaying files still being fetched: only bytes written or durable, one downstream per file, chains without cycles."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from model_agent.peers.relay import (
    Downstreams,
    DurableView,
    Relay,
    Relays,
    WrittenRanges,
    chain_of,
    durable_end,
    open_confined,
    order_candidates,
)
from model_agent.transfer.partmap import PartMap
from tests.support.waiting import eventually

KiB = 1024


def _map(size: int, part: int, done: list[int], *, complete: bool = False) -> PartMap:
    state = PartMap.fresh(size, part, None)
    for i in done:
        state.mark(i)
    state.complete = complete
    return state


@pytest.mark.parametrize(
    ("state", "offset", "end"),
    [
        (None, 0, 0),  # no map: nothing durable
        (_map(100, 10, []), 0, 0),
        (_map(100, 10, [0, 1, 3]), 0, 20),  # the run from 0 stops at the first missing part
        (_map(100, 10, [0, 1, 3]), 5, 20),  # from inside a done part
        (_map(100, 10, [0, 1, 3]), 20, 20),  # part 2 missing
        (_map(100, 10, [0, 1, 3]), 30, 40),
        (_map(95, 10, list(range(10))), 90, 95),  # the last part is short
        (_map(100, 10, [], complete=True), 40, 100),
        (_map(90, 10, list(range(9))), 0, 0),  # another size than the file's: trusted for nothing
        (_map(100, 10, [0]), 100, 100),  # past the end
    ],
)
def test_durable_end(state: PartMap | None, offset: int, end: int) -> None:
    assert durable_end(state, 100 if state is None or state.size != 95 else 95, offset) == end


def test_the_durable_view_follows_the_map_on_disk(tmp_path: Path) -> None:
    relays = Relays()
    with relays.scope() as scope:
        relay = scope.start("a" * 64, 30 * KiB, tmp_path / "f", tmp_path / "f.json")
        view = DurableView(relay)
        assert view.durable_end(0) == 0  # no map yet
        _map(30 * KiB, 10 * KiB, [0]).save(relay.state_path)
        assert view.durable_end(0) == 10 * KiB
        _map(30 * KiB, 10 * KiB, [0, 2]).save(relay.state_path)  # a part further on: the fetch goes on
        assert view.durable_end(0) == 10 * KiB and view.durable_end(20 * KiB) == 30 * KiB and view.durable_parts == 2
        _map(30 * KiB, 10 * KiB, [0, 1]).save(relay.state_path)
        assert view.durable_end(0) == 20 * KiB
        _map(30 * KiB, 10 * KiB, [0, 1, 2], complete=True).save(relay.state_path)
        assert view.durable_end(0) == 30 * KiB
        relay.state_path.unlink()  # (the staging published: a map once complete stays so for answers in flight)
        assert view.durable_end(0) == 30 * KiB
        fresh = DurableView(relay)
        assert fresh.durable_end(0) == 0


def test_relays_serve_only_files_with_a_source_and_never_a_failed_one(tmp_path: Path) -> None:
    relays = Relays()
    with relays.scope() as scope:
        a = scope.start("a" * 64, 10, tmp_path / "a", tmp_path / "a.json")
        b = scope.start("b" * 64, 10, tmp_path / "b", tmp_path / "b.json")
        assert relays.find("a" * 64) is None  # registered, not yet fed: another node must not wait for it
        relays.fed_by(a, ())
        relays.fed_by(b, ("10.0.0.2:1",))
        assert relays.find("a" * 64) is a and relays.find("b" * 64) is b and b.upstream == ("10.0.0.2:1",)
        relays.fed_by(b, None)  # its upstream went away: not servable until the next one feeds it
        assert relays.find("b" * 64) is None
        relays.failed(a)
        assert relays.find("a" * 64) is None and not relays.live(a)
        relays.fed_by(a, ())  # a failed file never comes back
        assert relays.find("a" * 64) is None
        assert relays.live(b)
    assert len(relays) == 0 and relays.live(b)  # unregistered; answers in flight of a verified file may finish


def test_a_scope_that_fails_marks_its_files_failed(tmp_path: Path) -> None:
    relays = Relays()
    with pytest.raises(RuntimeError), relays.scope() as scope:
        a = scope.start("a" * 64, 10, tmp_path / "a", tmp_path / "a.json")
        relays.fed_by(a, ())
        raise RuntimeError("fetch failed")
    assert len(relays) == 0 and not relays.live(a)


def test_one_downstream_per_file_with_a_grace_between_its_requests() -> None:
    d = Downstreams(cap=1, grace_s=3.0)
    assert d.admit("f", "A", now=0.0)
    assert not d.admit("f", "B", now=0.1)  # A's place
    assert d.admit("g", "B", now=0.1)  # another file: another place
    assert d.admit("f", "A", now=0.2)  # A again (a second part in flight)
    d.release("f", "A", now=1.0)
    d.release("f", "A", now=1.0)
    assert not d.admit("f", "B", now=3.9)  # A's place is kept for its next part request
    assert d.admit("f", "B", now=4.1)  # A gone for longer than the grace
    assert d.holders("f") == ["B"] and d.refused == 2


def test_more_downstreams_when_configured_and_none_capped_with_0() -> None:
    two = Downstreams(cap=2)
    assert two.admit("f", "A", now=0) and two.admit("f", "B", now=0) and not two.admit("f", "C", now=0)
    free = Downstreams(cap=0)
    assert all(free.admit("f", str(i), now=0) for i in range(20))


@pytest.mark.parametrize(
    ("ready", "fetching", "me", "turn", "order"),
    [
        ([], [], "c", 0, []),
        ([], ["a", "b", "d", "e"], "c", 0, ["b", "a", "e", "d"]),  # the nearest before me first, round the ring
        ([], ["a", "b", "d", "e"], "a", 0, ["e", "d", "b"]),
        (["x", "y"], ["a", "b"], "c", 0, ["x", "y", "b", "a"]),  # Ready copies first
        (["x", "y"], ["a", "b"], "c", 1, ["y", "x", "b", "a"]),  # rotated by the file's turn
        (["x", "c"], ["c", "x", "a"], "c", 0, ["x", "a"]),  # never me; Ready and fetching counts as Ready
    ],
)
def test_candidate_order(ready: list[str], fetching: list[str], me: str, turn: int, order: list[str]) -> None:
    assert order_candidates(ready, fetching, me, turn) == order


def test_every_node_taking_its_nearest_predecessor_makes_one_chain() -> None:
    nodes = [f"10.0.0.{i}:1" for i in range(2, 18)]
    firsts = {me: order_candidates([], nodes, me, 0)[0] for me in nodes}
    seen, at = [], nodes[0]
    while at not in seen:
        seen.append(at)
        at = firsts[at]
    assert len(seen) == len(nodes)  # one ring through every node: cut at the seed, a chain


def test_chain_header() -> None:
    assert chain_of(None) == () and chain_of("") == ()
    assert chain_of("10.0.0.2:1,10.0.0.3:1") == ("10.0.0.2:1", "10.0.0.3:1")


def test_open_confined(tmp_path: Path) -> None:
    root = tmp_path / "root"
    (root / "staging").mkdir(parents=True)
    inside = root / "staging" / "f"
    inside.write_bytes(b"x" * 10)
    fd = open_confined(inside, 10, [root])
    assert fd is not None
    os.close(fd)
    assert open_confined(inside, 11, [root]) is None  # not the size the listing gave
    outside = tmp_path / "elsewhere"
    outside.write_bytes(b"x" * 10)
    assert open_confined(outside, 10, [root]) is None
    link = root / "staging" / "link"
    link.symlink_to(outside)
    assert open_confined(link, 10, [root]) is None
    assert open_confined(root / "staging" / "missing", 10, [root]) is None


def test_a_verified_file_stays_servable_for_a_while_after_its_fetch_from_the_staging(tmp_path: Path) -> None:
    root = tmp_path / "root"
    (root / "staging").mkdir(parents=True)
    relays = Relays(lambda: [root], linger_s=10.0)
    path = root / "staging" / "w.bin"
    path.write_bytes(b"x" * 10)
    with relays.scope() as scope:
        done = scope.start("a" * 64, 10, path, root / "staging" / "a.json")
        given_up = scope.start("b" * 64, 10, root / "staging" / "b.bin", root / "staging" / "b.json")
        relays.fed_by(done, ())
        relays.fed_by(given_up, ())
        relays.verified(done)
    assert relays.find("b" * 64) is None  # not verified: gone with its fetch
    lingering = relays.find("a" * 64)
    assert lingering is done and done.fd is not None and DurableView(done).durable_end(0) == 10
    path.rename(root / "published.bin")  # published: the descriptor still reads the verified bytes
    assert os.pread(done.fd, 10, 0) == b"x" * 10
    assert relays.find("a" * 64, now=done.until + 1) is None and done.fd is None  # then closed


def test_a_lingering_file_gives_way_to_a_new_fetch_and_a_failed_scope_lingers_nothing(tmp_path: Path) -> None:
    root = tmp_path / "root"
    (root / "staging").mkdir(parents=True)
    (root / "staging" / "w.bin").write_bytes(b"x" * 10)
    relays = Relays(lambda: [root])
    with relays.scope() as scope:
        old = scope.start("a" * 64, 10, root / "staging" / "w.bin", root / "staging" / "a.json")
        relays.fed_by(old, ())
        relays.verified(old)
    assert old.fd is not None
    with relays.scope() as scope:
        new = scope.start("a" * 64, 10, root / "staging" / "w.bin", root / "staging" / "a.json")
        relays.fed_by(new, ())
        assert relays.find("a" * 64) is new and old.fd is None
        relays.verified(new)
        with pytest.raises(RuntimeError), relays.scope() as failing:
            other = failing.start("c" * 64, 10, root / "staging" / "w.bin", root / "staging" / "c.json")
            relays.fed_by(other, ())
            relays.verified(other)
            raise RuntimeError("the fetch failed")
        assert other.fd is None and relays.find("c" * 64) is None
    relays.close()
    assert len(relays) == 0 and new.fd is None


@pytest.mark.parametrize(
    ("writes", "offset", "end"),
    [
        ([], 0, 0),
        ([(0, 10)], 0, 10),
        ([(0, 10)], 5, 10),
        ([(0, 10)], 10, 10),  # the end itself is not written
        ([(0, 10), (20, 30)], 12, 12),  # a gap
        ([(0, 10), (20, 30)], 25, 30),
        ([(20, 30), (0, 10), (10, 20)], 0, 30),  # out of order, merged once they touch
        ([(0, 10), (5, 15)], 0, 15),  # overlapping
        ([(0, 10), (30, 40), (8, 32)], 3, 40),  # one write bridging two ranges
        ([(5, 5)], 5, 5),  # nothing
    ],
)
def test_written_ranges(writes: list[tuple[int, int]], offset: int, end: int) -> None:
    ranges = WrittenRanges()
    for start, stop in writes:
        ranges.add(start, stop)
    assert ranges.end_from(offset) == end
    assert ranges.total == sum(max(0, b - a) for a, b in writes)


def test_written_bytes_are_servable_beside_the_durable_parts(tmp_path: Path) -> None:
    relay = Relay("d" * 64, tmp_path / "f", tmp_path / "f.json", 30 * KiB, upstream=())
    _map(30 * KiB, 10 * KiB, [0]).save(relay.state_path)
    view = DurableView(relay)
    write = relay.writer()
    assert relay.servable_end(view, 0) == 10 * KiB  # the recorded part
    write(10 * KiB, 14 * KiB)
    assert relay.servable_end(view, 0) == 10 * KiB  # (ranges are per offset: the part map's ends at 10 KiB)
    assert relay.servable_end(view, 10 * KiB) == 14 * KiB  # written, not recorded: served
    assert relay.servable_end(view, 20 * KiB) == 20 * KiB  # neither
    relay.writer()  # a new attempt: the file may have been replaced, what was written is forgotten
    assert relay.servable_end(view, 10 * KiB) == 10 * KiB


async def test_a_waiting_answer_is_woken_by_a_write_and_a_failure_forgets_what_was_written(tmp_path: Path) -> None:
    relays = Relays()
    with relays.scope() as scope:
        relay = scope.start("e" * 64, 1000, tmp_path / "f", tmp_path / "f.json")
        relays.fed_by(relay, ())
        write = relay.writer()

        async def waiting() -> bool:
            return relay._changed is not None  # (the waiter has made its event: a write now wakes it)

        waiter = asyncio.ensure_future(relay.changed(timeout=30))
        await eventually(waiting, what="the answer waiting for the next write")
        write(0, 100)
        async with asyncio.timeout(5):
            await waiter  # woken by the write, long before its timeout
        assert relay.written.end_from(0) == 100
        relays.fed_by(relay, None)  # an attempt failed: its bytes may be gone
        assert relay.written.end_from(0) == 0
        write = relay.writer()
        write(0, 50)
        waiter = asyncio.ensure_future(relay.changed(timeout=30))
        await eventually(waiting, what="the answer waiting for the next write")
        relays.failed(relay)
        async with asyncio.timeout(5):
            await waiter  # the failure wakes it: the answer ends
        assert relay.written.end_from(0) == 0 and relays.find(relay.digest) is None


async def test_a_probe_waits_for_a_file_being_fetched_here_to_be_fed_and_not_for_one_that_is_not(
    tmp_path: Path,
) -> None:
    relays = Relays()
    async with asyncio.timeout(5):
        assert await relays.until_fed("f" * 64, timeout=30) is None  # not fetched here: nothing to wait for
    with relays.scope() as scope:
        relay = scope.start("f" * 64, 10, tmp_path / "f", tmp_path / "f.json")
        async with asyncio.timeout(5):
            assert await relays.until_fed("f" * 64, timeout=0.05) is None  # never fed within the wait
        waiter = asyncio.ensure_future(relays.until_fed("f" * 64, timeout=30))
        await eventually(lambda: _has_waiter(relay), what="the probe waiting for the file's source")
        relays.fed_by(relay, ("10.0.0.2:1",))
        async with asyncio.timeout(5):
            assert await waiter is relay  # answered when fed, long before its timeout
        other = scope.start("a" * 64, 10, tmp_path / "a", tmp_path / "a.json")
        waiter = asyncio.ensure_future(relays.until_fed("a" * 64, timeout=30))
        await eventually(lambda: _has_waiter(other), what="the probe waiting for the other file")
        relays.failed(other)  # its fetch gave it up: the probe ends at once, with nothing
        async with asyncio.timeout(5):
            assert await waiter is None


async def _has_waiter(relay: Relay) -> bool:
    return relay._changed is not None
