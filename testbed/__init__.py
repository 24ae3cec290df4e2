"""The test bed: every real component the tests, the demo and the benchmarks stand on — never the product.

Role: build, start and stop the things a node agent talks to, on loopback, from a source checkout: a real
kube-apiserver and etcd (``servers.controlplane``), a Hugging Face mirror serving local git repositories
(``servers.olah``), S3 (``servers.moto``), GCS (``servers.fakegcs``), Azure Blob (``servers.azurite``),
byte-level proxies that count or break traffic (``proxies``), the agent run as a subprocess
(``agent_process``), the small models they serve (``models``) and the demo (``demo``).

Guarantees:

* Nothing here is imported by ``model_agent`` (an import contract in ``make lint`` keeps it so), and the
  product wheel and image do not contain it (``tests/unit/test_wheel_contents.py``).
* Every component is the real program where one can run here; a stand-in is named a fake in its docstring.
* Everything started is stopped by its owner (context managers, ``down``); ports are picked free on 127.0.0.1.
* It runs from a source checkout only: binaries are built from ``tools/controlplane`` into the user cache.

Command line: ``python -m testbed --help`` (``build``, ``up``, ``down``, ``status``, ``demo``).
"""
