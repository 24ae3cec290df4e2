"""Unit tests for ``Layout.confine`` (the single gate for model destinations) and ``Layout.check_local``."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from model_agent.local.layout import (
    MAX_NAME_BYTES,
    MAX_PATH_BYTES,
    PRIVATE_DIR,
    Layout,
    PathRefused,
    RootsRefused,
    check_roots,
)


@pytest.fixture
def root(tmp_path: Path) -> Path:
    r = tmp_path / "models"
    r.mkdir()
    return Path(os.path.realpath(r))


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    o = tmp_path / "outside"
    (o / "sub").mkdir(parents=True)
    (o / "sub" / "secret.txt").write_text("do not touch")
    return Path(os.path.realpath(o))


@pytest.fixture
def layout(root: Path) -> Layout:
    lay = Layout(root)
    lay.ensure()
    return lay


def refused(layout: Layout, raw: str) -> str:
    with pytest.raises(PathRefused) as info:
        layout.confine(raw)
    return str(info.value)


def test_a_plain_path_inside_the_root_is_accepted(layout: Layout, root: Path) -> None:
    got_root, dest = layout.confine(str(root / "org" / "model"))
    assert got_root.path == root
    assert dest == root / "org" / "model"


def test_a_symlink_inside_the_root_pointing_inside_is_resolved(layout: Layout, root: Path) -> None:
    (root / "real").mkdir()
    (root / "alias").symlink_to(root / "real")
    _, dest = layout.confine(str(root / "alias" / "m"))
    assert dest == root / "real" / "m"


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("", "is empty"),
        ("models/x", "is not absolute"),
        ("./x", "is not absolute"),
        ("/etc/x", "outside the allowed roots"),
        ("/", "outside the allowed roots"),
    ],
)
def test_simple_refusals(layout: Layout, raw: str, expected: str) -> None:
    assert expected in refused(layout, raw)


def test_dot_dot_segments_are_refused_even_when_they_stay_inside(layout: Layout, root: Path) -> None:
    assert "'.' or '..' segments" in refused(layout, f"{root}/a/../b")
    assert "'.' or '..' segments" in refused(layout, f"{root}/../outside")
    assert "'.' or '..' segments" in refused(layout, f"{root}/./b")


def test_the_root_itself_is_refused(layout: Layout, root: Path) -> None:
    assert "models root itself" in refused(layout, str(root))
    assert "models root itself" in refused(layout, str(root) + "/")
    assert "models root itself" in refused(layout, str(root) + "//")


def test_a_symlink_to_the_root_is_the_root(layout: Layout, root: Path) -> None:
    (root / "self").symlink_to(root)
    assert "models root itself" in refused(layout, str(root / "self"))


def test_the_private_area_is_refused(layout: Layout, root: Path) -> None:
    for raw in (root / PRIVATE_DIR, root / PRIVATE_DIR / "staging", root / PRIVATE_DIR / "trash" / "x"):
        assert "private area" in refused(layout, str(raw))


def test_a_symlink_into_the_private_area_is_refused(layout: Layout, root: Path) -> None:
    (root / "sneaky").symlink_to(root / PRIVATE_DIR / "manifests")
    assert "private area" in refused(layout, str(root / "sneaky" / "m"))


def test_a_symlink_inside_the_root_pointing_outside_is_refused(layout: Layout, root: Path, outside: Path) -> None:
    (root / "escape").symlink_to(outside)
    message = refused(layout, str(root / "escape" / "sub"))
    assert "resolves through a symlink" in message and str(outside / "sub") in message
    # The target itself, and a not-yet-existing path below it, are refused the same way.
    assert "resolves through a symlink" in refused(layout, str(root / "escape"))
    assert "resolves through a symlink" in refused(layout, str(root / "escape" / "new" / "deeper"))


def test_a_dangling_symlink_pointing_outside_is_refused(layout: Layout, root: Path, tmp_path: Path) -> None:
    (root / "dangling").symlink_to(tmp_path / "nowhere" / "yet")
    assert "resolves through a symlink" in refused(layout, str(root / "dangling"))


def test_a_symlink_loop_is_refused_not_a_crash(layout: Layout, root: Path) -> None:
    (root / "loop-a").symlink_to(root / "loop-b")
    (root / "loop-b").symlink_to(root / "loop-a")
    with pytest.raises(PathRefused):
        layout.confine(str(root / "loop-a" / "x"))


@pytest.mark.parametrize("char", ["\x00", "\n", "\r", "\t", "\x1b", "\x7f"])
def test_control_characters_are_refused(layout: Layout, root: Path, char: str) -> None:
    assert "control characters" in refused(layout, f"{root}/a{char}b")


def test_an_overlong_component_is_refused(layout: Layout, root: Path) -> None:
    assert f"{MAX_NAME_BYTES}-byte limit" in refused(layout, f"{root}/{'x' * (MAX_NAME_BYTES + 1)}")
    # Bytes, not characters: 128 two-byte characters are 256 bytes.
    assert f"{MAX_NAME_BYTES}-byte limit" in refused(layout, f"{root}/{'é' * 128}")
    layout.confine(f"{root}/{'x' * MAX_NAME_BYTES}")  # exactly at the limit is fine


def test_an_overlong_path_is_refused(layout: Layout, root: Path) -> None:
    deep = str(root) + ("/" + "d" * 200) * 25
    assert len(deep.encode()) > MAX_PATH_BYTES
    assert f"{MAX_PATH_BYTES}-byte limit" in refused(layout, deep)


def test_a_second_allowed_root_is_accepted_and_checked(tmp_path: Path, root: Path, outside: Path) -> None:
    extra = tmp_path / "extra"
    extra.mkdir()
    lay = Layout(root, [extra])
    got_root, dest = lay.confine(str(extra / "m"))
    assert got_root.path == Path(os.path.realpath(extra)) and dest == Path(os.path.realpath(extra)) / "m"
    assert "models root itself" in refused(lay, str(extra))
    assert "private area" in refused(lay, str(extra / PRIVATE_DIR / "x"))
    assert "outside the allowed roots" in refused(lay, str(outside))


def test_messages_are_bounded(layout: Layout) -> None:
    assert len(refused(layout, "relative" * 1000)) < 400


def test_check_local_accepts_read_only_paths_outside_the_roots(layout: Layout, outside: Path) -> None:
    assert layout.check_local(str(outside)) == outside


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("", "empty"),
        ("etc", "not absolute"),
        ("/etc/../etc", "'..' segments"),
        ("/etc/\x00", "control characters"),
    ],
)
def test_check_local_refusals(layout: Layout, raw: str, expected: str) -> None:
    with pytest.raises(PathRefused, match=expected):
        layout.check_local(raw)


def test_check_local_refuses_the_root_and_the_private_area(layout: Layout, root: Path) -> None:
    with pytest.raises(PathRefused, match="models root itself"):
        layout.check_local(str(root))
    with pytest.raises(PathRefused, match="private area"):
        layout.check_local(str(root / PRIVATE_DIR / "trash"))
    (root / "link").symlink_to(root / PRIVATE_DIR)
    with pytest.raises(PathRefused, match="private area"):
        layout.check_local(str(root / "link"))


_SEGMENT = st.one_of(
    st.sampled_from(["", ".", "..", PRIVATE_DIR, "escape", "real", "x" * 256, "a\x00b", "a\nb"]),
    st.text(alphabet=st.characters(codec="utf-8", exclude_characters="/"), max_size=12),
)


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """models/{real/, escape -> ../outside, .model-agent/}, outside/ (module-scoped: hypothesis reuses it)."""
    base = Path(os.path.realpath(tmp_path_factory.mktemp("layout-prop")))
    (base / "models" / "real").mkdir(parents=True)
    (base / "models" / PRIVATE_DIR).mkdir()
    (base / "outside").mkdir()
    (base / "models" / "escape").symlink_to(base / "outside")
    return base


@settings(max_examples=300, deadline=None)
@given(segments=st.lists(_SEGMENT, max_size=6), absolute=st.booleans())
def test_whatever_is_accepted_is_strictly_inside_the_root_and_outside_the_private_area(
    tree: Path, segments: list[str], absolute: bool
) -> None:
    root = tree / "models"
    raw = "/".join([str(root), *segments]) if absolute else "/".join(segments)
    lay = Layout(root)
    try:
        got_root, dest = lay.confine(raw)
    except PathRefused as exc:
        assert str(exc)
        return
    assert got_root.path == root
    assert root in dest.parents
    assert dest != root / PRIVATE_DIR and root / PRIVATE_DIR not in dest.parents
    assert Path(os.path.realpath(dest)) == dest
    assert len(raw.encode()) <= MAX_PATH_BYTES


def test_a_file_where_a_directory_must_be_is_refused(layout: Layout, root: Path) -> None:
    (root / "a-file").write_bytes(b"x")
    assert "which is not a directory" in refused(layout, str(root / "a-file" / "sub"))
    assert "which is not a directory" in refused(layout, str(root / "a-file" / "sub" / "deeper"))
    assert refused(layout, str(root / "a-file")).endswith("is not a directory")
    assert (root / "a-file").read_bytes() == b"x"


# ------------------------------------------------------------------------------------- nested roots


@pytest.mark.parametrize(
    ("extra", "relation"),
    [
        (["models/inner"], "is inside the models root"),
        (["models"], "is the same directory as the models root"),
        (["."], "contains the models root"),
        (["other", "other/deeper"], "is inside allowed root"),
        (["other/deeper", "other"], "contains allowed root"),
        (["link-to-models/inner"], "is inside the models root"),  # through a symlink
    ],
)
def test_nested_roots_are_refused(tmp_path: Path, extra: list[str], relation: str) -> None:
    (tmp_path / "models").mkdir()
    (tmp_path / "link-to-models").symlink_to(tmp_path / "models")
    with pytest.raises(RootsRefused, match=relation) as info:
        Layout(tmp_path / "models", [tmp_path / e for e in extra])
    assert "must not nest" in str(info.value)
    with pytest.raises(RootsRefused):
        check_roots(tmp_path / "models", [tmp_path / e for e in extra])


def test_side_by_side_roots_are_accepted(tmp_path: Path) -> None:
    # "/x/models2" starts with the string "/x/models" but is not inside it.
    lay = Layout(tmp_path / "models", [tmp_path / "models2", tmp_path / "other"])
    assert len(lay.roots) == 3


def test_nested_roots_stop_the_agent_at_start_up(tmp_path: Path) -> None:
    import subprocess
    import sys

    (tmp_path / "models").mkdir()
    env = {**os.environ, "NODE_NAME": "n1"}
    argv = [sys.executable, "-m", "model_agent", "run", "--models-root-dir", str(tmp_path / "models")]
    argv += ["--allowed-root", str(tmp_path / "models" / "inner"), "--kubeconfig", str(tmp_path / "none")]
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 2
    assert "is inside the models root" in done.stderr and "must not nest" in done.stderr
    assert "Traceback" not in done.stderr


# ---------------------------------------------------------------------------------- tenants' local paths


def tenant_refused(layout: Layout, raw: str) -> str:
    with pytest.raises(PathRefused) as info:
        layout.check_local(raw, tenant=True)
    return str(info.value)


def test_a_tenant_local_path_inside_the_root_is_accepted(layout: Layout, root: Path) -> None:
    (root / "team-a" / "weights").mkdir(parents=True)
    assert layout.check_local(str(root / "team-a" / "weights"), tenant=True) == root / "team-a" / "weights"
    assert layout.check_local(str(root / "not-yet"), tenant=True) == root / "not-yet"


@pytest.mark.parametrize("raw", ["/", "/etc", "/etc/kubernetes", "/var/lib/kubelet", "/proc/self/root"])
def test_a_tenant_local_path_outside_the_roots_is_refused(layout: Layout, raw: str) -> None:
    assert "outside the allowed roots" in tenant_refused(layout, raw)
    assert layout.check_local(raw) == Path(raw)  # an admin's ClusterBaseModel: today's behaviour


def test_a_tenant_may_not_name_the_root_or_the_private_area(layout: Layout, root: Path) -> None:
    assert "models root itself" in tenant_refused(layout, str(root))
    assert "models root itself" in tenant_refused(layout, str(root) + "/")
    assert "private area" in tenant_refused(layout, str(root / PRIVATE_DIR / "trash"))


def test_a_tenant_symlink_out_of_the_root_is_refused_without_showing_its_target(
    layout: Layout, root: Path, outside: Path
) -> None:
    (root / "escape").symlink_to(outside)
    (root / "to-root").symlink_to(root)
    for raw in (root / "escape", root / "escape" / "sub", root / "to-root"):
        message = tenant_refused(layout, str(raw))
        assert "resolves through a symlink outside the allowed roots" in message
        assert str(outside) not in message
    assert layout.check_local(str(root / "escape" / "sub")) == root / "escape" / "sub"  # admin: allowed


def test_a_sibling_with_the_roots_name_as_prefix_is_outside(layout: Layout, root: Path) -> None:
    sibling = root.parent / (root.name + "2")
    sibling.mkdir()
    assert "outside the allowed roots" in tenant_refused(layout, str(sibling / "x"))


def test_a_tenant_path_through_a_symlinked_root_is_inside(tmp_path: Path) -> None:
    real = tmp_path / "real-models"
    (real / "team-a").mkdir(parents=True)
    (tmp_path / "models").symlink_to(real)
    lay = Layout(tmp_path / "models")
    assert lay.check_local(str(tmp_path / "models" / "team-a"), tenant=True) == tmp_path / "models" / "team-a"
    assert lay.check_local(str(real / "team-a"), tenant=True) == real / "team-a"


def test_writable_is_confine_for_resolved_paths(tmp_path: Path, root: Path) -> None:
    extra = tmp_path / "extra"
    lay = Layout(root, [extra])
    real_extra = Path(os.path.realpath(extra))
    assert lay.writable(str(root / "m")) and lay.writable(str(real_extra / "a" / "b"))
    for refused_path in (
        root,
        root / PRIVATE_DIR,
        root / PRIVATE_DIR / "trash" / "x",
        root.parent / (root.name + "2") / "m",  # a sibling whose name starts with the root's
        Path("/"),
        Path("/etc/x"),
    ):
        assert not lay.writable(str(refused_path)), refused_path
        with pytest.raises(PathRefused):
            lay.confine(str(refused_path))


def test_agents_probing_one_shared_records_directory_at_once_all_start(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Two nodes on a shared root: the second runs its whole probe between the first's create and unlink.
    first, second = Layout(root), Layout(root)
    real_unlink = Path.unlink
    interleaved: list[bool] = []

    def unlink_after_the_other_node(self: Path, missing_ok: bool = False) -> None:
        if self.name.startswith(".write-probe") and not interleaved:
            interleaved.append(True)
            second.ensure()
        real_unlink(self, missing_ok=missing_ok)

    monkeypatch.setattr(Path, "unlink", unlink_after_the_other_node)
    first.ensure()
    assert interleaved == [True]
    records = first.roots[0].manifests
    assert not [p for p in records.iterdir() if p.name.startswith(".write-probe")]
