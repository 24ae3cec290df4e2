"""--tenant-local-allow (agent/tenant_local.py): which tenant local:// paths the admin's directories allow."""

from __future__ import annotations

from pathlib import Path

import pytest

from model_agent.agent.tenant_local import admin_allows

SHARED = ["/shared/models"]


def identity(path: str) -> str:
    return path


@pytest.mark.parametrize(
    ("raw", "allowed", "expected"),
    [
        ("/shared/models/llama", SHARED, True),
        ("/shared/models/team-a/llama", SHARED, True),
        ("/shared/models", SHARED, False),  # the directory itself: never a model
        ("/shared/models2/llama", SHARED, False),  # a sibling with the same prefix
        ("/shared/models/../../etc", SHARED, False),  # '..' is refused, not collapsed
        ("/shared/models/./llama", SHARED, False),
        ("shared/models/llama", SHARED, False),  # relative
        ("/etc/kubernetes", SHARED, False),
        ("/shared/models/llama", [], False),  # nothing listed: the tenant rule alone
        ("/shared/models/llama", ["relative/dir"], False),  # a listed directory must be absolute
        ("/srv/b/llama", ["/srv/a", "/srv/b"], True),
        ("", SHARED, False),
    ],
)
def test_admin_allows(raw: str, allowed: list[str], expected: bool) -> None:
    assert admin_allows(raw, allowed, realpath=identity) is expected


def test_a_symlink_out_of_the_listed_directory_is_refused(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    (shared / "real").mkdir(parents=True)
    outside = tmp_path / "secret"
    outside.mkdir()
    (shared / "escape").symlink_to(outside)
    (shared / "inner").symlink_to(shared / "real")
    assert admin_allows(str(shared / "real"), [str(shared)])
    assert admin_allows(str(shared / "inner"), [str(shared)])  # a symlink that stays inside
    assert not admin_allows(str(shared / "escape"), [str(shared)])
    # A listed directory that is itself a symlink is compared resolved.
    (tmp_path / "link").symlink_to(shared)
    assert admin_allows(str(tmp_path / "link" / "real"), [str(tmp_path / "link")])
