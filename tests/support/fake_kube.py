"""A fake Kubernetes client for unit tests: scripted answers, no server.

:class:`FakeKubeClient` is a *fake* (not the real :class:`~model_agent.kube.client.KubeClient`): it offers
the same ``request()`` signature and answers each ``(method, path)`` from a script. An answer is a dict
(returned, as a copy), an exception (raised: :class:`ApiError`, :class:`ApiUnavailable`, ...) or a zero-argument
coroutine function (awaited: lets a test stall a request on an :class:`asyncio.Event`). Every call is recorded
in :attr:`FakeKubeClient.calls`. A request nobody scripted fails the test loudly (``AssertionError``).
"""

from __future__ import annotations

import copy
from collections import deque
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from model_agent.kube.client import ApiError

JSON = dict[str, Any]
Answer = JSON | BaseException | Callable[[], Awaitable[JSON]]


@dataclass(frozen=True)
class Call:
    method: str
    path: str
    body: Any
    content_type: str | None
    timeout: float | None


class FakeKubeClient:
    """A fake KubeClient (no server): ``request()`` returns or raises scripted answers per method and path.

    ``script(method, path, *answers)`` queues answers consumed one per call; ``always(method, path, answer)``
    is the answer once the queue is empty. Unscripted requests raise ``AssertionError``.
    """

    def __init__(self) -> None:
        self.calls: list[Call] = []
        self._queued: dict[tuple[str, str], deque[Answer]] = {}
        self._always: dict[tuple[str, str], Answer] = {}

    def script(self, method: str, path: str, *answers: Answer) -> None:
        self._queued.setdefault((method, path), deque()).extend(answers)

    def always(self, method: str, path: str, answer: Answer) -> None:
        self._always[(method, path)] = answer

    def calls_to(self, method: str, path: str) -> list[Call]:
        return [c for c in self.calls if c.method == method and c.path == path]

    async def request(
        self,
        method: str,
        path: str,
        *,
        query: Mapping[str, str | int] | None = None,
        body: Any = None,
        content_type: str | None = None,
        timeout: float | None = None,
    ) -> JSON:
        self.calls.append(Call(method, path, copy.deepcopy(body), content_type, timeout))
        key = (method, path)
        queue = self._queued.get(key)
        if queue:
            answer = queue.popleft()
        elif key in self._always:
            answer = self._always[key]
        else:
            raise AssertionError(f"FakeKubeClient: unscripted request {method} {path}")
        if isinstance(answer, BaseException):
            raise answer
        if callable(answer):
            return await answer()
        return copy.deepcopy(answer)

    async def close(self) -> None:
        return None


def not_found(name: str, plural: str, group: str = "ome.io") -> ApiError:
    """The API server's 404 for a vanished object: a Status naming the object."""
    body = {
        "kind": "Status",
        "apiVersion": "v1",
        "status": "Failure",
        "message": f'{plural}.{group} "{name}" not found',
        "reason": "NotFound",
        "details": {"name": name, "group": group, "kind": plural},
        "code": 404,
    }
    return ApiError(404, body, "GET", f"/{plural}/{name}")


def type_not_found() -> ApiError:
    """The API server's 404 when the resource type itself is gone (e.g. the CRD was deleted)."""
    body = {"kind": "Status", "reason": "NotFound", "message": "the server could not find the requested resource"}
    return ApiError(404, body, "GET", "/")


def status_error(code: int, reason: str, message: str = "") -> ApiError:
    body = {"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": reason, "code": code}
    if message:
        body["message"] = message
    return ApiError(code, body, "GET", "/")
