"""The real components the agent talks to in tests and the demo, each started on loopback from a source checkout.

Role: among them a kube-apiserver and etcd with a generated PKI (``controlplane``, ``pki``), a Hugging Face
mirror over local git repositories (``olah``), S3 (``moto``), GCS (``fakegcs``) and Azure Blob (``azurite``),
each in the one start/stop shape of :mod:`~testbed.servers.service`.

Guarantees: every server binds 127.0.0.1 on a free port, keeps its state and log under the directory it is
given, and is stopped (SIGTERM, then SIGKILL) however the block that started it ends. Nothing here is imported
by the product.
"""
