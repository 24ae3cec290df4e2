"""Coalescing of single-key writes into one request: many workers, one PATCH.

Every model has one node label and one ConfigMap key, but they all live in the same two objects. Written
one by one, 1,000 models cost 1,000 PATCHes of a Node with 1,000 labels and 1,000 PATCHes of a ConfigMap
that grows to hundreds of kilobytes — each answered with, and echoed on the watch as, the whole object.
:class:`KeyBatcher` lets each caller await its own key's write while one flusher sends every key pending
at that moment in one merge patch.

Guarantees: ``write(key, value)`` returns only after a request containing that value succeeded, or raises
that request's error (every waiter of a failed batch gets it, and retries on its own); ``send`` may also
refuse single keys of a batch (it returns their errors: e.g. no room left for them), and only those keys'
waiters get an error; for one key the last value written wins (a later write supersedes a pending earlier
one, whose waiter is satisfied by the later request, as level-triggered state allows); a batch never holds
more than ``max_keys`` keys, nor more than ``max_bytes`` by ``size`` (a single key larger than that goes
alone).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import KW_ONLY, dataclass, field

# Sends one batch; returns the errors of keys it refused (None or empty: all were written), raises if the
# whole batch failed.
Send = Callable[[dict[str, str | None]], Awaitable[Mapping[str, BaseException] | None]]


def _key_and_value_bytes(key: str, value: str | None) -> int:
    return len(key.encode()) + len((value or "").encode())


@dataclass(eq=False)
class KeyBatcher:
    """Coalesces single-key writes into batched ``send`` calls (see the module guarantees).

    ``gather_s`` is how long the flusher waits for more keys before it sends; it bounds the latency a write
    adds, and trades it for fewer requests.
    """

    send: Send
    _: KW_ONLY
    gather_s: float = 0.02
    max_keys: int = 500
    max_bytes: int | None = None
    size: Callable[[str, str | None], int] = _key_and_value_bytes
    _pending: dict[str, str | None] = field(default_factory=dict, init=False, repr=False)
    _waiters: dict[str, list[asyncio.Future[None]]] = field(default_factory=dict, init=False, repr=False)
    _wake: asyncio.Event = field(default_factory=asyncio.Event, init=False, repr=False)
    _task: asyncio.Task[None] | None = field(default=None, init=False, repr=False)
    requests: int = field(default=0, init=False)

    async def write(self, key: str, value: str | None) -> None:
        """Write ``value`` for ``key`` (None removes it) and return once a request carrying it succeeded.

        Raises the error of the batch that carried it, or the key's own refusal; the caller decides to retry.
        """
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._flusher(), name="key batcher")
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._pending[key] = value
        self._waiters.setdefault(key, []).append(fut)
        self._wake.set()
        await fut

    async def _flusher(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            await asyncio.sleep(self.gather_s)  # let concurrent writers join this batch
            while self._pending:
                keys = self._next_keys()
                batch = {k: self._pending.pop(k) for k in keys}
                waiters = {k: self._waiters.pop(k, []) for k in keys}
                try:
                    self.requests += 1
                    refused = await self.send(batch) or {}
                except Exception as exc:
                    refused = dict.fromkeys(keys, exc)
                for k, futures in waiters.items():
                    error = refused.get(k)
                    for f in futures:
                        if f.done():
                            continue
                        if error is None:
                            f.set_result(None)
                        else:
                            f.set_exception(error)

    def _next_keys(self) -> list[str]:
        """The pending keys of the next batch, in arrival order, within ``max_keys`` and ``max_bytes``."""
        keys: list[str] = []
        total = 0
        for key, value in self._pending.items():
            if len(keys) >= self.max_keys:
                break
            size = self.size(key, value)
            if self.max_bytes is not None and keys and total + size > self.max_bytes:
                break
            keys.append(key)
            total += size
        return keys

    async def close(self) -> None:
        """Stop the flusher; writes still waiting fail with ``RuntimeError`` rather than hanging forever."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        for futures in self._waiters.values():
            for f in futures:
                if not f.done():
                    f.set_exception(RuntimeError("writer closed"))
        self._waiters.clear()
        self._pending.clear()
