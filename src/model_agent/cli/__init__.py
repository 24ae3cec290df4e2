"""The operator's commands: ``model-agent run``, ``status``, ``verify`` and ``trash``.

Role: turn flags and the environment into a running agent (``run``) or into one question put to a running
agent or to the node's disk (the others). Guarantees: a usage or environment error is one line on stderr
and exit code 2, never a traceback; the commands that only look (``status``, ``verify`` without
``--repair``, ``trash list``) change nothing. The developer's commands (the local control plane, the demo)
are not here: they live in the test bed (``python -m testbed``), which the product does not ship.
"""
