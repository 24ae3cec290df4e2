"""The control planes of the stores weights come from: one module per URI scheme, and what they share.

Role: a source turns a model's storage URI (``hf://``, ``s3://``, ``gs://``, ``az://``, ``oci://``) into a
plan — which objects, at which revision, with which credentials and expected hashes — and drives the
transfer engine (:mod:`model_agent.transfer`) to fetch them into staging; :mod:`~model_agent.sources.base`
holds the contract every source implements and the one ``publish`` step that moves verified files into
place; :mod:`~model_agent.sources.egress` the tenancy rules for what a namespaced model may reach;
:mod:`~model_agent.sources.listing` the bounds on one listing.

Guarantees: a source writes only under the request's staging directory and never publishes; every file it
returns was checked against its size and the strongest hash the store publishes; every failure is a
:class:`~model_agent.model.errors.SourceError` with a reason from :class:`~model_agent.model.reasons.Reason`
and says whether a retry can help; a tenant's fetch gets no ambient credentials and reaches only
allow-listed endpoints. Sources know nothing of the API server or the reconciler: they may import
``transfer``, ``local`` and ``model`` only.
"""
