"""Reading a model's metadata from its files: which file, confined and bounded reads, safetensors headers
(docs/ome-compatibility.md#7-model-config-parsing, ConfigMap 6.3).

Role
----
The disk half of metadata parsing; the rules are ``model_agent.model.metadata`` (pure, no I/O). This module:

* :func:`find_config_file` picks the file to read (``model_index.json`` for a diffusers pipeline, else
  ``config.json``; docs/ome-compatibility.md#72-which-file);
* :func:`parse_model_dir` reads it, plus what only other files can tell (a sentence-transformers config,
  a diffusers text encoder's config, safetensors headers), and hands the decoded dicts to the rules,
  returning a :class:`ParsedMetadata` (docs/ome-compatibility.md#73-extraction (to 7.5));
* the safetensors helpers count parameters from file *headers* only; no tensor data is read.

Contract
--------
* Read-only and synchronous. It never writes, never talks to Kubernetes, and may take a while on a
  slow disk, so async callers run it in a worker thread.
* Confined: nothing is read outside the real path of ``model_dir``. A symlink that leads out of it
  (config file, shard, safetensors file) is ignored or refused, never followed. A ``model_dir`` that is
  itself a symlink (a ReuseIfExists child, docs/ome-compatibility.md#83-reuseifexists) is resolved first and its target
  is the root.
* Bounded: config files are read only up to :data:`MAX_CONFIG_FILE_BYTES`, shard indexes up to
  :data:`MAX_INDEX_FILE_BYTES`, safetensors headers up to :data:`MAX_SAFETENSORS_HEADER_BYTES` (checked
  against the claimed length *and* the real file size before anything is allocated). The recursive
  search stops at :data:`MAX_WALK_DEPTH` levels and :data:`MAX_WALK_ENTRIES` directory entries.
  Non-regular files (FIFOs, devices) are refused unread. Decoding is bounded by the rules' JSON element
  limit (``MAX_JSON_ELEMENTS``) and strings by ``MAX_METADATA_STRING``.
* One error type: :class:`MetadataError` (with ``reason``) means "no usable metadata": no directory,
  no config file, or a config file that cannot be read or is not a JSON object. A problem counting
  parameters (garbage, truncated or oversized safetensors header, a shard outside the model directory,
  no safetensors at all) is *not* an error: the loader's estimate is used instead and the problem is
  recorded in :attr:`ParsedMetadata.warnings` for the caller to log.
* Deterministic: directory listings and shard sets are processed in sorted order; the same files give
  the same result.
"""

from __future__ import annotations

import itertools
import os
import stat
from collections import deque
from collections.abc import Iterable
from pathlib import Path, PurePosixPath
from typing import Any, Final

from model_agent.model.metadata import (
    DiffusionPipeline,
    MetadataError,
    ParsedMetadata,
    load_json_bytes,
)
from model_agent.model.metadata.architectures import (
    declares_similarity_function,
    settle_parameter_count,
    transformers_facts,
)
from model_agent.model.metadata.assemble import assemble
from model_agent.model.metadata.diffusers import diffusers_facts, parse_pipeline
from model_agent.model.metadata.facts import Facts, is_json_int
from model_agent.model.metadata.limits import INT64_MAX

__all__ = [
    "CONFIG_FILE",
    "MAX_CONFIG_FILE_BYTES",
    "MAX_INDEX_FILE_BYTES",
    "MAX_SAFETENSORS_FILES",
    "MAX_SAFETENSORS_HEADER_BYTES",
    "MAX_WALK_DEPTH",
    "MAX_WALK_ENTRIES",
    "MODEL_INDEX_FILE",
    "count_directory_parameters",
    "count_safetensors_parameters",
    "find_config_file",
    "parse_model_dir",
    "read_safetensors_header",
]

# --------------------------------------------------------------------------------------------------
# Read limits and file names

MAX_SAFETENSORS_HEADER_BYTES: Final = 10 * 1024 * 1024
"""Largest safetensors JSON header accepted (the Go agent's limit)."""
MAX_CONFIG_FILE_BYTES: Final = 16 * 1024 * 1024
"""Largest config.json / model_index.json / sentence-transformers config read (real ones are KiBs)."""
MAX_INDEX_FILE_BYTES: Final = 64 * 1024 * 1024
"""Largest ``*.safetensors.index.json`` read (the largest public ones are around 10 MiB)."""
MAX_SAFETENSORS_FILES: Final = 10_000
"""Most safetensors files (or distinct shards) counted for one directory."""
MAX_WALK_DEPTH: Final = 6
"""Deepest directory level (the model directory is level 0) the recursive config search enters."""
MAX_WALK_ENTRIES: Final = 10_000
"""Most directory entries the recursive config search looks at before giving up."""

MODEL_INDEX_FILE: Final = "model_index.json"
CONFIG_FILE: Final = "config.json"
_CONFIG_SUBDIRS: Final = ("safetensors", "pytorch_model", "model")
_INDEX_FILES: Final = ("model.safetensors.index.json", "diffusion_pytorch_model.safetensors.index.json")
_SENTENCE_TRANSFORMERS_CONFIG: Final = "config_sentence_transformers.json"


# --------------------------------------------------------------------------------------------------
# Bounded file reads


def _open_regular(path: Path) -> tuple[int, int]:
    """Open ``path`` read-only; return (fd, size). Non-regular files are refused before opening (and,
    against a swap in between, the open is non-blocking and re-checked), so a FIFO never hangs us."""
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):
            raise MetadataError(f"{path}: not a regular file")
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise MetadataError(f"{path}: cannot open: {exc.strerror or exc}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise MetadataError(f"{path}: not a regular file")
    except BaseException:
        os.close(fd)
        raise
    return fd, st.st_size


def _read_fd_exactly(fd: int, count: int, path: Path) -> bytes:
    chunks: list[bytes] = []
    remaining = count
    while remaining > 0:
        try:
            chunk = os.read(fd, min(remaining, 1 << 20))
        except OSError as exc:
            raise MetadataError(f"{path}: read failed: {exc.strerror or exc}") from None
        if not chunk:
            raise MetadataError(f"{path}: truncated (expected {count} bytes, got {count - remaining})")
        chunks.append(chunk)
        remaining -= len(chunk)
    return b"".join(chunks)


def _read_bounded(path: Path, limit: int) -> bytes:
    fd, size = _open_regular(path)
    try:
        if size > limit:
            raise MetadataError(f"{path}: {size} bytes exceeds the {limit}-byte limit for this file")
        data = _read_fd_exactly(fd, size, path)
        try:
            extra = os.read(fd, 1)
        except OSError:
            extra = b""
        if extra:
            raise MetadataError(f"{path}: file grew while being read")
        return data
    finally:
        os.close(fd)


def _load_json_object(path: Path, limit: int) -> dict[str, Any]:
    value = load_json_bytes(_read_bounded(path, limit), str(path))
    if not isinstance(value, dict):
        raise MetadataError(f"{path}: expected a JSON object, got {type(value).__name__}")
    return value


# --------------------------------------------------------------------------------------------------
# Paths: confinement and the config-file search


def _real_directory(path: Path) -> Path | None:
    real = Path(os.path.realpath(path))
    return real if real.is_dir() else None


def _inside(real: Path, root: Path) -> bool:
    return real == root or real.is_relative_to(root)


def _confined_file(path: Path, root: Path) -> Path | None:
    """The real path of ``path`` if it is a regular file inside ``root`` (after symlinks), else None."""
    try:
        real = Path(os.path.realpath(path))
        if not _inside(real, root):
            return None
        if not stat.S_ISREG(os.stat(real).st_mode):
            return None
    except (OSError, ValueError):
        return None
    return real


def _walk_for(root: Path, names: Iterable[str]) -> dict[str, Path]:
    """Breadth-first search below ``root`` for files named ``names``; first (shallowest, then
    lexically first) match per name. Never enters symlinked or hidden directories; bounded by
    :data:`MAX_WALK_DEPTH` and :data:`MAX_WALK_ENTRIES`."""
    wanted = set(names)
    found: dict[str, Path] = {}
    queue: deque[tuple[Path, int]] = deque([(root, 0)])
    seen_entries = 0
    while queue and wanted - found.keys():
        directory, depth = queue.popleft()
        budget = MAX_WALK_ENTRIES - seen_entries
        try:
            with os.scandir(directory) as it:
                # Never hold more than the remaining budget of entries, however big the directory.
                entries = sorted(itertools.islice(it, budget + 1), key=lambda e: e.name)
        except OSError:
            continue
        if len(entries) > budget:
            return found  # an incomplete listing would make "first match" depend on disk order
        for entry in entries:
            seen_entries += 1
            if entry.name in wanted and entry.name not in found:
                real = _confined_file(Path(entry.path), root)
                if real is not None:
                    found[entry.name] = real
                    continue
            try:
                is_dir = entry.is_dir(follow_symlinks=False)
            except OSError:
                is_dir = False
            if is_dir and depth < MAX_WALK_DEPTH and not entry.name.startswith("."):
                queue.append((Path(entry.path), depth + 1))
    return found


def find_config_file(model_dir: Path) -> Path | None:
    """The file that describes the model in ``model_dir`` (docs/ome-compatibility.md#72-which-file), as a real path, or
    None.

    Order: ``model_index.json`` at the top, else anywhere below (a diffusers pipeline; used
    exclusively); then ``config.json`` at the top, in ``safetensors/``, ``pytorch_model/``,
    ``model/``; then anywhere below. "Anywhere below" is a bounded breadth-first walk (shallowest
    match wins, ties by name) that skips hidden directories and never follows a symlink out of
    ``model_dir``. None when ``model_dir`` is not a directory or nothing is found.
    """
    root = _real_directory(model_dir)
    if root is None:
        return None
    top_index = _confined_file(root / MODEL_INDEX_FILE, root)
    if top_index is not None:
        return top_index
    walked = _walk_for(root, (MODEL_INDEX_FILE, CONFIG_FILE))
    if MODEL_INDEX_FILE in walked:
        return walked[MODEL_INDEX_FILE]
    for candidate in (root / CONFIG_FILE, *(root / sub / CONFIG_FILE for sub in _CONFIG_SUBDIRS)):
        real = _confined_file(candidate, root)
        if real is not None:
            return real
    return walked.get(CONFIG_FILE)


# --------------------------------------------------------------------------------------------------
# Safetensors headers


def _open_safetensors(path: Path) -> tuple[dict[str, Any], int]:
    """(header object, length of the data section) of a safetensors file, read without its tensors."""
    fd, size = _open_regular(path)
    try:
        if size < 8:
            raise MetadataError(f"{path}: {size} bytes is too short for a safetensors file")
        header_len = int.from_bytes(_read_fd_exactly(fd, 8, path), "little")
        if header_len > MAX_SAFETENSORS_HEADER_BYTES:
            raise MetadataError(
                f"{path}: safetensors header length {header_len} exceeds the {MAX_SAFETENSORS_HEADER_BYTES}-byte limit"
            )
        if header_len > size - 8:
            raise MetadataError(
                f"{path}: truncated safetensors file: header claims {header_len} bytes, only {size - 8} follow"
            )
        if header_len < 2:
            raise MetadataError(f"{path}: safetensors header length {header_len} is too small")
        raw = _read_fd_exactly(fd, header_len, path)
    finally:
        os.close(fd)
    header = load_json_bytes(raw, f"{path}: safetensors header")
    if not isinstance(header, dict):
        raise MetadataError(f"{path}: safetensors header is not a JSON object")
    return header, size - 8 - header_len


def read_safetensors_header(path: Path) -> dict[str, Any]:
    """The parsed JSON header of a safetensors file. Only the first 8 + header-length bytes are read;
    the header must be ≤ :data:`MAX_SAFETENSORS_HEADER_BYTES` and fit in the file, else
    :class:`MetadataError`."""
    return _open_safetensors(path)[0]


def count_safetensors_parameters(path: Path) -> int:
    """Total element count of the tensors in one safetensors file, from its header alone.

    ``__metadata__`` and scalar tensors (empty shape) are skipped. A tensor entry that is not an
    object, a shape that is not a list of non-negative integers, ``data_offsets`` that are malformed
    or point past the end of the file, or a total beyond int64 is a :class:`MetadataError`.
    (Zero-sized dimensions are legal safetensors and count 0; the Go agent rejects them.)
    """
    header, data_len = _open_safetensors(path)
    total = 0
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        if not isinstance(entry, dict):
            raise MetadataError(f"{path}: tensor {name!r}: entry is not an object")
        shape = entry.get("shape")
        if not isinstance(shape, list):
            raise MetadataError(f"{path}: tensor {name!r}: missing or invalid shape")
        offsets = entry.get("data_offsets")
        if offsets is not None:
            if (
                not isinstance(offsets, list)
                or len(offsets) != 2
                or not all(is_json_int(o) for o in offsets)
                or not 0 <= offsets[0] <= offsets[1]
            ):
                raise MetadataError(f"{path}: tensor {name!r}: invalid data_offsets")
            if offsets[1] > data_len:
                raise MetadataError(
                    f"{path}: truncated safetensors file: tensor {name!r} ends at byte {offsets[1]} "
                    f"of a {data_len}-byte data section"
                )
        if not shape:
            continue
        count = 1
        for dim in shape:
            if not is_json_int(dim) or dim < 0:
                raise MetadataError(f"{path}: tensor {name!r}: invalid dimension {dim!r}")
            count *= dim
            if count > INT64_MAX:
                raise MetadataError(f"{path}: tensor {name!r}: element count overflows int64")
        total += count
        if total > INT64_MAX:
            raise MetadataError(f"{path}: parameter count overflows int64")
    return total


def _count_index(index: Path, directory: Path, root: Path) -> int:
    data = _load_json_object(index, MAX_INDEX_FILE_BYTES)
    weight_map = data.get("weight_map")
    if not isinstance(weight_map, dict) or not weight_map:
        raise MetadataError(f"{index}: no weight_map entries")
    shards: set[str] = set()
    for shard in weight_map.values():
        if not isinstance(shard, str) or not shard:
            raise MetadataError(f"{index}: weight_map has an empty or non-string shard name")
        shards.add(shard)
    if len(shards) > MAX_SAFETENSORS_FILES:
        raise MetadataError(f"{index}: {len(shards)} shards exceeds the limit of {MAX_SAFETENSORS_FILES}")
    total = 0
    for shard in sorted(shards):
        rel = PurePosixPath(shard)
        if rel.is_absolute() or ".." in rel.parts or "\x00" in shard:
            raise MetadataError(f"{index}: shard {shard!r} is not a plain relative path")
        real = _confined_file(directory / shard, root)
        if real is None:
            raise MetadataError(f"{index}: shard {shard!r} is missing or outside the model directory")
        total += count_safetensors_parameters(real)
        if total > INT64_MAX:
            raise MetadataError(f"{index}: parameter count overflows int64")
    return total


def count_directory_parameters(directory: Path, *, root: Path | None = None) -> int:
    """Parameters of the checkpoint in ``directory``, from safetensors headers only.

    With ``model.safetensors.index.json`` (or, for diffusers components,
    ``diffusion_pytorch_model.safetensors.index.json``) the distinct shards it references are
    counted; otherwise every ``*.safetensors`` regular file in ``directory`` (not below it). Every
    file read must resolve inside ``root`` (default: ``directory``). Any unreadable or invalid file,
    or no safetensors file at all, is a :class:`MetadataError`: a partial count is never returned.
    """
    real_dir = _real_directory(directory)
    if real_dir is None:
        raise MetadataError(f"{directory}: not a directory")
    real_root = _real_directory(root) if root is not None else real_dir
    if real_root is None or not _inside(real_dir, real_root):
        raise MetadataError(f"{directory}: outside the model directory")
    for name in _INDEX_FILES:
        index = _confined_file(real_dir / name, real_root)
        if index is not None:
            return _count_index(index, real_dir, real_root)
    try:
        with os.scandir(real_dir) as it:
            matching = (e.name for e in it if e.name.endswith(".safetensors"))
            names = sorted(itertools.islice(matching, MAX_SAFETENSORS_FILES + 1))
    except OSError as exc:
        raise MetadataError(f"{directory}: cannot list: {exc.strerror or exc}") from None
    if len(names) > MAX_SAFETENSORS_FILES:
        raise MetadataError(f"{directory}: more than {MAX_SAFETENSORS_FILES} safetensors files")
    files: list[Path] = []
    for name in names:
        candidate = real_dir / name
        if os.path.isdir(candidate):
            continue
        real = _confined_file(candidate, real_root)
        if real is None:
            raise MetadataError(f"{candidate}: not a regular file inside the model directory")
        files.append(real)
    if not files:
        raise MetadataError(f"no .safetensors files found in {directory}")
    total = 0
    for path in files:
        total += count_safetensors_parameters(path)
        if total > INT64_MAX:
            raise MetadataError(f"{directory}: parameter count overflows int64")
    return total


# --------------------------------------------------------------------------------------------------
# What only other files can tell (the rules get their decoded contents)


def _sentence_transformers_embedding(config_dir: Path, root: Path) -> bool:
    """A ``config_sentence_transformers.json`` naming a similarity function marks an embedding model."""
    path = _confined_file(config_dir / _SENTENCE_TRANSFORMERS_CONFIG, root)
    if path is None:
        return False
    try:
        data = _load_json_object(path, MAX_CONFIG_FILE_BYTES)
    except MetadataError:
        return False
    return declares_similarity_function(data)


def _count_or_warn(directory: Path, root: Path, facts: Facts) -> int:
    try:
        return count_directory_parameters(directory, root=root)
    except MetadataError as exc:
        facts.warnings.append(f"parameter count from safetensors unavailable: {exc.reason}")
        return 0


def _load_transformers(raw: dict[str, Any], config_path: Path, root: Path) -> Facts:
    facts = transformers_facts(raw, config_path)
    if not facts.is_embedding:
        facts.is_embedding = _sentence_transformers_embedding(config_path.parent, root)
    settle_parameter_count(facts, raw, _count_or_warn(config_path.parent, root, facts))
    return facts


def _is_plain_name(name: str) -> bool:
    return bool(name) and name not in (".", "..") and "/" not in name and "\\" not in name and "\x00" not in name


def _diffusers_parameters(base: Path, root: Path, pipeline: DiffusionPipeline, facts: Facts) -> int:
    """Sum over text_encoder, transformer (or unet), vae (all required) plus any additional component
    folder that has a config.json and countable safetensors (optional). A required part that is
    missing or uncountable makes the whole count 0 (unknown), as in the Go agent."""
    transformer = "transformer" if (base / "transformer" / CONFIG_FILE).exists() else "unet"
    total = 0
    for part in ("text_encoder", transformer, "vae"):
        if _confined_file(base / part / CONFIG_FILE, root) is None:
            facts.warnings.append(f"diffusers part {part!r} has no config.json; parameter count unknown")
            return 0
        count = _count_or_warn(base / part, root, facts)
        if count <= 0:
            return 0
        total += count
    for name in sorted(pipeline.additional_components):
        if not _is_plain_name(name) or _confined_file(base / name / CONFIG_FILE, root) is None:
            continue
        try:
            total += count_directory_parameters(base / name, root=root)
        except MetadataError:
            continue
    return total if total <= INT64_MAX else 0


def _text_encoder_config(base: Path, root: Path) -> dict[str, Any] | None:
    path = _confined_file(base / "text_encoder" / CONFIG_FILE, root)
    if path is None:
        return None
    try:
        return _load_json_object(path, MAX_CONFIG_FILE_BYTES)
    except MetadataError:
        return None


def _load_diffusers(raw: dict[str, Any], index_path: Path, root: Path) -> Facts:
    pipeline = parse_pipeline(raw, index_path)
    base = index_path.parent
    facts = diffusers_facts(pipeline, _text_encoder_config(base, root))
    count = _diffusers_parameters(base, root, pipeline, facts)
    if count > 0:
        facts.parameter_count, facts.parameter_count_source = count, "safetensors"
    return facts


# --------------------------------------------------------------------------------------------------
# Entry point


def parse_model_dir(model_dir: Path, *, total_size_bytes: int | None = None) -> ParsedMetadata:
    """Parse the model in ``model_dir`` into :class:`ParsedMetadata` (docs/ome-compatibility.md#72-which-file (to 7.5)).

    ``total_size_bytes`` is the size of the weights on disk if the caller knows it (e.g. from the
    download manifest). It is used only for ``model_size_bytes`` when the parameter count is unknown
    (0), where the spec's ``params × bytes-per-dtype`` would say 0.

    Raises :class:`MetadataError` when ``model_dir`` is not a directory, when neither
    ``model_index.json`` nor ``config.json`` is found, or when the chosen file cannot be read or is
    not a JSON object (including a diffusers index with no ``_class_name``). The caller decides what
    "no metadata" means (docs/ome-compatibility.md#72-which-file: a missing directory is not an error for the agent).
    """
    root = _real_directory(model_dir)
    if root is None:
        raise MetadataError(f"model directory {model_dir} does not exist or is not a directory")
    config_path = find_config_file(root)
    if config_path is None:
        raise MetadataError(f"no {MODEL_INDEX_FILE} or {CONFIG_FILE} found in {model_dir}")
    raw = _load_json_object(config_path, MAX_CONFIG_FILE_BYTES)
    if config_path.name == MODEL_INDEX_FILE:
        facts = _load_diffusers(raw, config_path, root)
    else:
        facts = _load_transformers(raw, config_path, root)
    return assemble(facts, config_path, total_size_bytes)
