"""The agent proper: the reconcile loop and every collaborator that keeps a node in agreement with its models.

Role: everything that decides and acts on the cluster's wish — the reconciler and its converge decision,
the one destructive path (confirmation, the delete breaker, removal into the trash), ownership of
directories, the fetcher pool and its fair slots and deadlines, the batched writers of the node's labels
and ConfigMap, the fleet-wide origin slots and resolve records, the supervisor of background tasks — and
the wiring that builds them from the settings (``runtime``, ``settings``).

Guarantees: the invariants of docs/design.md#2-invariants are kept here — absence is a rumour until a live
read proves it, every destructive act goes one way (confirm, breaker, label → entry → weights → record),
nothing is Ready that is not complete and verified, the agent writes only what it owns, and bad input is a
``Failed`` status with a reason, never a crash loop. Where a choice keeps weights safe it is a pure function
from facts to a decision (``converge``, ``confirm``, ``breaker``, ``ownership``, ``configmap_space``,
``download_limits``), tested row by row, and one actor carries it out. Only ``cli`` imports this package.
"""
