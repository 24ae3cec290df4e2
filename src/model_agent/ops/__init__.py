"""What the agent shows the people who run it: metrics, health endpoints, Kubernetes Events and logs.

Role: the observable surface, in one package so every other layer reports the same way: Prometheus metrics
with OME's names, types and labels plus this project's safety metrics (:mod:`~model_agent.ops.metrics`),
``/healthz``, ``/readyz``, ``/metrics`` and ``/status`` (:mod:`~model_agent.ops.http`), aggregated and
rate-limited Events (:mod:`~model_agent.ops.events`), JSON logs with secrets masked
(:mod:`~model_agent.ops.logging`) and the event-loop lag window (:mod:`~model_agent.ops.looplag`).

Guarantees: reporting never blocks or fails the caller (an Event that cannot be sent is logged, not
raised); a registered secret never reaches a log line, whatever carries it; metric names that OME defines
are a compatibility contract and are never renamed. This package imports only ``kube``.
"""
