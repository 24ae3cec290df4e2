"""model-agent: a Kubernetes node agent that keeps model weights on its node in agreement with OME's
``BaseModel`` and ``ClusterBaseModel`` resources.

The packages, from the top (each may import only those below it; ``make lint`` checks it):
``cli`` (the operator's commands) → ``agent`` (the reconciler and its collaborators, the wiring) →
``sources`` (each store's control plane) and ``ops`` (metrics, health, Events, logs) → ``transfer`` (the
ranged download engine) → ``local`` (the node's disk) → ``model`` (the vocabulary, no I/O) and ``kube``
(the API-server plumbing). The invariants the whole tree keeps are in docs/design.md#2-invariants; the
product never imports the test bed (``testbed/``) or the tests.
"""
