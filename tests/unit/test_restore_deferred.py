"""A restore from the trash whose old copy cannot be retired yet leaves nothing unrecorded.

The reconciler restores a trashed copy of the new target, then asks the Remover to retire the superseded copy.
When that is deferred (settling, the breaker, an unproven read: ``Requeue``), the superseded manifest stays the
key's only record, so the restored copy goes back into the trash instead of sitting at its path without one.
Real: the reconciler's restore step, the layout, manifests and trash in ``tmp_path``; fake: the Remover.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any, cast

import pytest

from model_agent.agent.reconciler import Context, Reconciler, Target
from model_agent.agent.requeue import Requeue
from model_agent.local.layout import Layout
from model_agent.local.manifest import FileRecord, Manifest, ManifestStore
from model_agent.local.trash import Trash
from model_agent.model.resources import ModelObject
from model_agent.model.uris import StorageType
from model_agent.ops.metrics import Metrics

KEY = "ClusterBaseModel//m1"
URI_NEW, URI_OLD = "hf://acme/new", "hf://acme/old"
DATA = b"weights" * 100


class _DeferringRemover:
    def __init__(self) -> None:
        self.asked = 0

    async def replace_superseded(self, *_args: Any, **_kw: Any) -> None:
        self.asked += 1
        raise Requeue("settling", 5.0)


def _copy(root: Path, name: str, uri: str) -> Manifest:
    dest = root / name
    dest.mkdir(parents=True)
    (dest / "model.safetensors").write_bytes(DATA)
    st = (dest / "model.safetensors").stat()
    record = FileRecord("model.safetensors", len(DATA), hashlib.sha256(DATA).hexdigest(), mtime_ns=st.st_mtime_ns)
    return Manifest(key=KEY, uid="u1", storage_uri=uri, dest=str(dest), files=[record])


async def test_a_deferred_switch_puts_the_restored_copy_back_into_the_trash(tmp_path: Path) -> None:
    layout = Layout(tmp_path / "models")
    layout.ensure()
    manifests, trash = ManifestStore(layout), Trash(layout)
    root = layout.primary
    new = _copy(root.path, "new", URI_NEW)
    assert trash.quarantine(new, root, "deleted earlier") is not None  # the new target's copy waits in the trash
    old = _copy(root.path, "old", URI_OLD)
    manifests.save(old, root)  # the superseded copy: the key's record
    remover = _DeferringRemover()
    ctx = Context(
        client=cast(Any, None),
        node_name="n1",
        namespace="ome",
        layout=layout,
        manifests=manifests,
        trash=trash,
        labels=cast(Any, None),
        configmap=cast(Any, None),
        fetcher=cast(Any, None),
        events=cast(Any, None),
        metrics=Metrics(),
        remover=cast(Any, remover),
        hf=cast(Any, None),
        models_store={},
        requeue_after=lambda _k, _d: None,
    )
    obj = ModelObject.from_dict(
        "ClusterBaseModel",
        {"metadata": {"name": "m1", "uid": "u1"}, "spec": {"storage": {"storageUri": URI_NEW, "path": new.dest}}},
    )
    target = Target(URI_NEW, Path(new.dest), root, StorageType.HUGGINGFACE)
    with pytest.raises(Requeue):
        await Reconciler(ctx)._restore_from_trash(obj.ref, obj, target, superseded=old)
    assert remover.asked == 1
    assert not Path(new.dest).exists()  # not left at its path without a record ...
    assert trash.find_restorable(URI_NEW, new.dest) is not None  # ... but kept in the trash for the next pass
    kept = manifests.load(KEY)
    assert kept is not None and kept.storage_uri == URI_OLD  # the old copy and its record are untouched
    assert (Path(old.dest) / "model.safetensors").read_bytes() == DATA
