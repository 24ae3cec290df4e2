"""The node's disk: where models live, what the agent knows it holds, and how it lets go of them.

Role: the allowed roots and path confinement (:mod:`~model_agent.local.layout`), the manifests that record
each published model (:mod:`~model_agent.local.manifest`), the trash that makes every removal a rename
first (:mod:`~model_agent.local.trash`), verification of the bytes on disk (:mod:`~model_agent.local.verify`),
the disk-space reservations of downloads in flight (:mod:`~model_agent.local.capacity`), what is on disk that
no manifest explains (:mod:`~model_agent.local.inventory`) and the listing of adopted ``local://`` trees
(:mod:`~model_agent.local.listing`).

Guarantees (docs/design.md#8-local-state-on-disk): every write that a restart reads back is atomic (temp
file, fsync, rename, fsync of the directory); nothing outside the allowed roots and the agent's private area
is written; weights are never deleted in one step, only renamed into the trash and purged after the grace
period; what this package cannot explain it reports and leaves alone. It decides nothing about the API
server: callers confirm before they ask it to remove. It imports only ``model``.
"""
