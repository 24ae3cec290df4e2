"""The per-model value stored in the node's ConfigMap (docs/ome-compatibility.md#63-configmap-entry-value), encoded
exactly as OME's Go agent does.

Role: typed, immutable views of one ConfigMap entry — :class:`ModelEntry` with its optional
:class:`ModelConfig` (holding an :class:`Artifact`) and :class:`DownloadProgress` — plus the codec.

Contract:

* ``to_json()`` produces the bytes Go's ``encoding/json`` would produce for the same value: struct
  fields in struct order; ``omitempty`` fields left out when empty/zero; ``config.artifact`` always
  present, with ``parentPath``/``childrenPaths`` written as ``null`` when unset (``None``) and as
  ``{}``/``[]`` when set but empty; Go maps (``modelFramework``, ``modelFormat``, ``parentPath``,
  ``decodedModelConfiguration`` at every depth) with sorted keys; compact separators; Go's float
  formatting; Go's default HTML-safe string escaping (``<``, ``>``, ``&``, U+2028, U+2029 as ``\\uXXXX``).
  Inside ``decodedModelConfiguration`` numbers are written as Go writes a ``float64`` (Go decodes that
  map's numbers into ``float64``), so every integer below 2**53 prints unchanged; a non-finite float
  there is written as ``null`` (Go would refuse to encode the whole entry).
* ``ModelEntry.from_json()`` accepts what Go's ``json.Unmarshal`` into the same structs accepts and
  returns ``None`` for everything else — it never raises. Like Go it ignores unknown fields, treats
  ``null`` as "leave the zero value", and rejects wrong types, non-integral or out-of-range integers,
  and NaN/Infinity; invalid UTF-8 becomes U+FFFD, as Go does inside strings. Unlike Go it matches
  field names case-sensitively (Go also folds case) and rejects a top-level ``null``; both only matter
  for hand-edited entries. A ``-0`` literal reads back as ``0`` (Python's json makes it an integer).
* ``storageUri`` and ``storagePath`` (the spec the state was computed for) follow ``progress``, each only when set
  (OME's v1.3 agent adds them; pull request #615).
* Two top-level fields are this agent's own, written after OME's fields and only when set; OME's controller
  ignores them, as Go ignores unknown fields: ``bytesBySource`` (where the bytes of the copy being fetched,
  or of the Ready copy, came from: ``origin``, ``peer``, ``sharedRoot``; while ``Updating`` and ``Ready``)
  and ``reason`` (why a model is ``Failed``), written last. A ``bytesBySource`` that is not the agent's
  shape (someone else's write) reads as none, never as an invalid entry: Go's decoder would not look at it.
* Entries written through OME's generic-map helpers come out with alphabetically sorted top-level keys;
  consumers parse JSON, so this codec always writes struct order.
* Size caps (the node's ConfigMap holds every model's entry within the API server's 1 MiB): ``cap_entry_json``
  bounds one entry to ``MAX_ENTRY_BYTES``, trimming only the parsed ``config`` — metadata strings and lists
  first, then ``decodedModelConfiguration``, then the whole ``config`` — and never ``name``, ``status``,
  ``progress``, ``bytesBySource``, the ``reason`` or fields it does not know; ``without_config`` is the
  smallest form of an entry (no ``config``, no storage fields), for a ConfigMap too full for the whole one. Both are
  idempotent.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any, Final

from model_agent.model.keys import ModelState

_UINT32_MAX: Final = 2**32 - 1
_UINT64_MAX: Final = 2**64 - 1
_INT32_MIN: Final = -(2**31)
_INT32_MAX: Final = 2**31 - 1

# Phases of an in-flight download, as OME's HF path writes them.
PROGRESS_PHASES: Final = ("scanning", "downloading", "finalizing", "unknown")


# --- model ----------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Artifact:
    """Artifact-sharing record (docs/ome-compatibility.md#83-reuseifexists). ``None`` and empty are different on the
    wire (null vs {} / [])."""

    sha: str = ""
    parent_path: Mapping[str, str] | None = None
    children_paths: tuple[str, ...] | None = None

    def to_json(self) -> str:
        """The artifact as Go encodes its struct (field order, ``omitempty``, ``null`` for unset paths)."""
        return _encode_struct(self._pairs())

    def _pairs(self) -> list[tuple[str, Any]]:
        return [
            ("sha", self.sha),
            ("parentPath", _GoMap(self.parent_path) if self.parent_path is not None else None),
            ("childrenPaths", list(self.children_paths) if self.children_paths is not None else None),
        ]


@dataclass(frozen=True, slots=True)
class ModelConfig:
    """Metadata parsed from the weights. Every field but ``artifact`` is omitted from JSON when empty."""

    model_type: str = ""
    model_architecture: str = ""
    model_framework: Mapping[str, str] | None = None
    model_format: Mapping[str, str] | None = None
    model_parameter_size: str = ""
    max_tokens: int = 0
    model_capabilities: tuple[str, ...] = ()
    api_capabilities: tuple[str, ...] = ()
    decoded_model_configuration: Mapping[str, Any] | None = None
    quantization: str = ""
    artifact: Artifact = field(default_factory=Artifact)

    def __post_init__(self) -> None:
        if not _INT32_MIN <= self.max_tokens <= _INT32_MAX:
            raise ValueError(f"max_tokens {self.max_tokens} does not fit in int32")

    @classmethod
    def from_document(cls, doc: object) -> ModelConfig | None:
        """A ``config`` object already decoded from JSON (a manifest keeps one); ``None`` when it is not one.

        The same rules as :meth:`ModelEntry.from_json` applies to an entry's ``config``, without encoding the
        document to text first.
        """
        if not isinstance(doc, Mapping):
            return None
        try:
            return _config_from(doc)
        except (_Malformed, ValueError, TypeError, RecursionError, OverflowError):
            return None

    def to_json(self) -> str:
        """The config as Go encodes its struct, byte for byte (see the module contract)."""
        return _encode_struct(self._pairs())

    def _pairs(self) -> list[tuple[str, Any]]:
        candidates: list[tuple[str, Any]] = [
            ("modelType", self.model_type),
            ("modelArchitecture", self.model_architecture),
            ("modelFramework", _GoMap(self.model_framework) if self.model_framework else None),
            ("modelFormat", _GoMap(self.model_format) if self.model_format else None),
            ("modelParameterSize", self.model_parameter_size),
            ("maxTokens", self.max_tokens),
            ("modelCapabilities", list(self.model_capabilities)),
            ("apiCapabilities", list(self.api_capabilities)),
            (
                "decodedModelConfiguration",
                _GoMap(self.decoded_model_configuration) if self.decoded_model_configuration else None,
            ),
            ("quantization", self.quantization),
        ]
        # omitempty: "", 0, empty list, nil/empty map are left out.
        pairs = [(k, v) for k, v in candidates if v is not None and v != "" and v != 0 and v != []]
        pairs.append(("artifact", _Struct(self.artifact._pairs())))
        return pairs


@dataclass(frozen=True, slots=True)
class DownloadProgress:
    """Progress of an in-flight download. All fields are always written."""

    phase: str = ""
    total_bytes: int = 0
    completed_bytes: int = 0
    total_files: int = 0
    completed_files: int = 0
    speed_bytes_per_sec: float = 0.0
    last_updated: str = ""  # RFC 3339, see rfc3339()

    def __post_init__(self) -> None:
        for name, value, top in (
            ("total_bytes", self.total_bytes, _UINT64_MAX),
            ("completed_bytes", self.completed_bytes, _UINT64_MAX),
            ("total_files", self.total_files, _UINT32_MAX),
            ("completed_files", self.completed_files, _UINT32_MAX),
        ):
            if not 0 <= value <= top:
                raise ValueError(f"{name} {value} is out of range 0..{top}")
        if not math.isfinite(self.speed_bytes_per_sec):
            raise ValueError("speed_bytes_per_sec must be finite")

    def to_json(self) -> str:
        """The progress as Go encodes its struct, byte for byte (see the module contract)."""
        return _encode_struct(self._pairs())

    def _pairs(self) -> list[tuple[str, Any]]:
        return [
            ("phase", self.phase),
            ("totalBytes", self.total_bytes),
            ("completedBytes", self.completed_bytes),
            ("totalFiles", self.total_files),
            ("completedFiles", self.completed_files),
            ("speedBytesPerSec", float(self.speed_bytes_per_sec)),
            ("lastUpdated", self.last_updated),
        ]


@dataclass(frozen=True, slots=True)
class BytesBySource:
    """Where a copy's bytes came from (this agent's ``bytesBySource`` field): each count always written.

    ``origin``: fetched from the model's source; ``peer``: from other nodes' peer servers, verified against the
    origin's digest; ``shared_root``: another node published the model on a shared models root and this node
    adopted it without a transfer. Resumed bytes of an earlier attempt count nowhere (their source is unknown).
    """

    origin: int = 0
    peer: int = 0
    shared_root: int = 0

    def __post_init__(self) -> None:
        for name, value in (("origin", self.origin), ("peer", self.peer), ("shared_root", self.shared_root)):
            if not 0 <= value <= _UINT64_MAX:
                raise ValueError(f"{name} {value} is out of range 0..{_UINT64_MAX}")

    @property
    def total(self) -> int:
        """Bytes counted anywhere."""
        return self.origin + self.peer + self.shared_root

    def _pairs(self) -> list[tuple[str, Any]]:
        return [("origin", self.origin), ("peer", self.peer), ("sharedRoot", self.shared_root)]


@dataclass(frozen=True, slots=True)
class ModelEntry:
    """One ConfigMap entry. ``status`` is normally a :class:`ModelState` value; any string read is kept."""

    name: str
    status: str
    config: ModelConfig | None = None
    progress: DownloadProgress | None = None
    # The spec the state was computed for: spec.storage.storageUri and the path the weights are served at
    # (spec.storage.path, or a local:// URI's path), so a reader can tell a state of an older spec. OME's v1.3 agent
    # adds the two fields (its pull request #615, open when this was written); omitted when empty.
    storage_uri: str = ""
    storage_path: str = ""
    # This agent's addition: why a model is Failed ("Reason: message"), written last and only when set, so
    # OME's controller (which ignores unknown fields) reads the entry as before. Capped at MAX_REASON chars.
    reason: str = ""
    # This agent's addition: where the bytes came from (while Updating with a fetch, and once Ready), after
    # OME's fields; None: unknown (a source that does not count them, an entry written by another agent).
    bytes_by_source: BytesBySource | None = None

    def to_json(self) -> str:
        """The whole entry as OME's agent writes it (struct order, Go escaping); ``from_json`` reads it back."""
        pairs: list[tuple[str, Any]] = [("name", self.name), ("status", str(self.status))]
        if self.config is not None:
            pairs.append(("config", _Struct(self.config._pairs())))
        if self.progress is not None:
            pairs.append(("progress", _Struct(self.progress._pairs())))
        if self.storage_uri:
            pairs.append(("storageUri", self.storage_uri))
        if self.storage_path:
            pairs.append(("storagePath", self.storage_path))
        if self.bytes_by_source is not None:
            pairs.append(("bytesBySource", _Struct(self.bytes_by_source._pairs())))
        if self.reason:
            pairs.append(("reason", self.reason[:MAX_REASON]))
        return _encode_struct(pairs)

    def with_status(self, status: ModelState | str) -> ModelEntry:
        """The status write of docs/ome-compatibility.md#64-writes: new status, config kept, progress dropped on
        Ready/Failed; a reason survives only on Failed, where the bytes came from only on Updating and Ready."""
        terminal = status in (ModelState.READY, ModelState.FAILED)
        return replace(
            self,
            status=str(status),
            progress=None if terminal else self.progress,
            reason=self.reason if status == ModelState.FAILED else "",
            bytes_by_source=None if status == ModelState.FAILED else self.bytes_by_source,
        )

    @classmethod
    def from_json(cls, text: str | bytes) -> ModelEntry | None:
        """Parse an entry; ``None`` when it is not a valid entry (see the module docstring)."""
        if isinstance(text, bytes):
            # Go replaces invalid UTF-8 inside strings with U+FFFD instead of failing.
            text = text.decode("utf-8", errors="replace")
        try:
            document = json.loads(text, parse_constant=_reject_constant)
            if not isinstance(document, dict):
                return None
            return _entry_from(document)
        except (_Malformed, ValueError, TypeError, RecursionError, OverflowError):
            return None


def rfc3339(moment: datetime) -> str:
    """Format a timestamp as Go's ``time.RFC3339`` for ``lastUpdated`` (UTC, seconds, ``Z``).

    A naive datetime is taken as UTC.
    """
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


# --- size caps ------------------------------------------------------------------------------------------

# One entry's bound. A typical entry with its parsed config is under 2 KiB; 8 KiB leaves room for a large
# decoded configuration while 128 such entries still take only a tenth of the ConfigMap.
MAX_ENTRY_BYTES: Final = 8 * 1024
# Metadata strings (modelType, a capability, a framework version, a parent path...) are names, not text.
MAX_METADATA_STRING: Final = 256
MAX_METADATA_ITEMS: Final = 64
MAX_REASON: Final = 500
_KNOWN_FIELDS: Final = ("name", "status", "config", "progress", "storageUri", "storagePath", "bytesBySource", "reason")


def cap_entry_json(text: str, max_bytes: int = MAX_ENTRY_BYTES) -> str:
    """``text`` (an encoded entry) bounded to ``max_bytes`` UTF-8 bytes by trimming only its ``config``.

    Over-long metadata strings and lists are cut always; then, while the entry is too large, the decoded
    configuration is dropped, then the whole ``config``. ``name``, ``status``, ``progress``, ``bytesBySource``,
    ``reason`` and unknown top-level fields are kept as they are, even if the result is still too large.
    A text that is not a valid entry, or that needs no change, is returned unchanged.
    """
    entry = ModelEntry.from_json(text)
    if entry is None or entry.config is None:
        return text
    config = _cap_metadata(entry.config)
    if config == entry.config and len(text.encode()) <= max_bytes:
        return text
    extra = _extra_fields(text)
    out = text
    for candidate in (config, replace(config, decoded_model_configuration=None), None):
        out = _encode_entry(replace(entry, config=candidate), extra)
        if len(out.encode()) <= max_bytes:
            break
    return out


def without_config(text: str) -> str:
    """The smallest form of an entry: its ``config`` and its storage fields dropped, everything else (the status)
    kept. (The storage fields name paths: with them a compact entry would be several times its size.)"""
    entry = ModelEntry.from_json(text)
    if entry is None or (entry.config is None and not entry.storage_uri and not entry.storage_path):
        return text
    return _encode_entry(replace(entry, config=None, storage_uri="", storage_path=""), _extra_fields(text))


def _cap_metadata(config: ModelConfig) -> ModelConfig:
    def cut(value: str) -> str:
        return value[:MAX_METADATA_STRING]

    def cut_map(value: Mapping[str, str] | None) -> Mapping[str, str] | None:
        if value is None:
            return None
        items = sorted(value.items())[:MAX_METADATA_ITEMS]
        return {cut(k): cut(v) for k, v in items}

    def cut_list(value: tuple[str, ...] | None) -> tuple[str, ...] | None:
        return None if value is None else tuple(cut(v) for v in value[:MAX_METADATA_ITEMS])

    return replace(
        config,
        model_type=cut(config.model_type),
        model_architecture=cut(config.model_architecture),
        model_framework=cut_map(config.model_framework),
        model_format=cut_map(config.model_format),
        model_parameter_size=cut(config.model_parameter_size),
        model_capabilities=cut_list(config.model_capabilities) or (),
        api_capabilities=cut_list(config.api_capabilities) or (),
        quantization=cut(config.quantization),
        artifact=Artifact(
            sha=cut(config.artifact.sha),
            parent_path=cut_map(config.artifact.parent_path),
            children_paths=cut_list(config.artifact.children_paths),
        ),
    )


def _extra_fields(text: str) -> list[tuple[str, Any]]:
    """Top-level fields the entry schema does not know (kept verbatim through a trim), in document order."""
    try:
        document = json.loads(text)
    except ValueError:
        return []
    if not isinstance(document, dict):
        return []
    # A bytesBySource the entry could not read is someone else's field: kept verbatim like any unknown one.
    return [
        (k, v)
        for k, v in document.items()
        if k not in _KNOWN_FIELDS or (k == "bytesBySource" and _bytes_by_source_from(v) is None)
    ]


def _encode_entry(entry: ModelEntry, extra: list[tuple[str, Any]]) -> str:
    encoded = entry.to_json()
    if not extra:
        return encoded
    return encoded[:-1] + "," + ",".join(f"{_encode_string(k)}:{_encode(v, False)}" for k, v in extra) + "}"


# --- decoding -------------------------------------------------------------------------------------------


class _Malformed(Exception):
    """Internal: the document does not fit the entry schema."""


def _reject_constant(token: str) -> Any:
    raise _Malformed(f"{token} is not JSON")


def _entry_from(doc: Mapping[str, Any]) -> ModelEntry:
    config_doc = _optional_object(doc, "config")
    progress_doc = _optional_object(doc, "progress")
    return ModelEntry(
        name=_string(doc, "name"),
        status=_string(doc, "status"),
        config=_config_from(config_doc) if config_doc is not None else None,
        progress=_progress_from(progress_doc) if progress_doc is not None else None,
        storage_uri=_string(doc, "storageUri"),
        storage_path=_string(doc, "storagePath"),
        # Not a field of OME's struct: whatever else stands there (someone else's write) reads as no reason.
        reason=doc["reason"] if isinstance(doc.get("reason"), str) else "",
        bytes_by_source=_bytes_by_source_from(doc.get("bytesBySource")),
    )


def _bytes_by_source_from(value: object) -> BytesBySource | None:
    """This agent's ``bytesBySource``; None for anything else (not OME's field: it never invalidates an entry)."""
    if not isinstance(value, dict):
        return None
    try:
        return BytesBySource(
            origin=_integer(value, "origin", 0, _UINT64_MAX),
            peer=_integer(value, "peer", 0, _UINT64_MAX),
            shared_root=_integer(value, "sharedRoot", 0, _UINT64_MAX),
        )
    except _Malformed:
        return None


def _config_from(doc: Mapping[str, Any]) -> ModelConfig:
    artifact_doc = _optional_object(doc, "artifact")
    decoded = _optional_object(doc, "decodedModelConfiguration")
    if decoded is not None:
        _check_numbers(decoded)
    return ModelConfig(
        model_type=_string(doc, "modelType"),
        model_architecture=_string(doc, "modelArchitecture"),
        model_framework=_string_map(doc, "modelFramework"),
        model_format=_string_map(doc, "modelFormat"),
        model_parameter_size=_string(doc, "modelParameterSize"),
        max_tokens=_integer(doc, "maxTokens", _INT32_MIN, _INT32_MAX),
        model_capabilities=_string_list(doc, "modelCapabilities") or (),
        api_capabilities=_string_list(doc, "apiCapabilities") or (),
        decoded_model_configuration=decoded,
        quantization=_string(doc, "quantization"),
        artifact=_artifact_from(artifact_doc) if artifact_doc is not None else Artifact(),
    )


def _artifact_from(doc: Mapping[str, Any]) -> Artifact:
    return Artifact(
        sha=_string(doc, "sha"),
        parent_path=_string_map(doc, "parentPath"),
        children_paths=_string_list(doc, "childrenPaths"),
    )


def _progress_from(doc: Mapping[str, Any]) -> DownloadProgress:
    speed = doc.get("speedBytesPerSec")
    if speed is None:
        speed = 0.0
    elif isinstance(speed, bool) or not isinstance(speed, int | float):
        raise _Malformed("speedBytesPerSec")
    speed = float(speed)  # OverflowError for a huge integer literal, as Go reports "out of range"
    if not math.isfinite(speed):
        raise _Malformed("speedBytesPerSec")
    return DownloadProgress(
        phase=_string(doc, "phase"),
        total_bytes=_integer(doc, "totalBytes", 0, _UINT64_MAX),
        completed_bytes=_integer(doc, "completedBytes", 0, _UINT64_MAX),
        total_files=_integer(doc, "totalFiles", 0, _UINT32_MAX),
        completed_files=_integer(doc, "completedFiles", 0, _UINT32_MAX),
        speed_bytes_per_sec=speed,
        last_updated=_string(doc, "lastUpdated"),
    )


# Go semantics for each helper: JSON null leaves the zero value; a wrong type is an error.


def _string(doc: Mapping[str, Any], key: str) -> str:
    value = doc.get(key)
    if value is None:
        return ""
    if not isinstance(value, str):
        raise _Malformed(key)
    return value


def _integer(doc: Mapping[str, Any], key: str, low: int, high: int) -> int:
    value = doc.get(key)
    if value is None:
        return 0
    # Go refuses 1.0 or 1e3 for an integer field; Python's json gives float for those literals.
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise _Malformed(key)
    return value


def _optional_object(doc: Mapping[str, Any], key: str) -> dict[str, Any] | None:
    value = doc.get(key)
    if value is None:
        return None
    if not isinstance(value, dict):
        raise _Malformed(key)
    return value


def _string_map(doc: Mapping[str, Any], key: str) -> dict[str, str] | None:
    value = _optional_object(doc, key)
    if value is None:
        return None
    # A null map value becomes "" in Go.
    return {k: _element_string(v, key) for k, v in value.items()}


def _string_list(doc: Mapping[str, Any], key: str) -> tuple[str, ...] | None:
    value = doc.get(key)
    if value is None:
        return None
    if not isinstance(value, list):
        raise _Malformed(key)
    return tuple(_element_string(v, key) for v in value)


def _element_string(value: Any, key: str) -> str:
    if value is None:
        return ""
    if not isinstance(value, str):
        raise _Malformed(key)
    return value


def _check_numbers(value: Any) -> None:
    """Reject numbers Go cannot hold in a float64 (it fails the whole entry)."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
        elif isinstance(item, float) and not math.isfinite(item):
            raise _Malformed("number out of range")
        elif isinstance(item, int) and not isinstance(item, bool):
            float(item)  # OverflowError beyond float64


# --- encoding -------------------------------------------------------------------------------------------


class _GoMap:
    """Marks a mapping to be encoded as a Go map: sorted keys, numbers as float64."""

    __slots__ = ("items",)

    def __init__(self, items: Mapping[str, Any]) -> None:
        self.items = items


class _Struct:
    """Marks ordered (name, value) pairs to be encoded as a Go struct."""

    __slots__ = ("pairs",)

    def __init__(self, pairs: list[tuple[str, Any]]) -> None:
        self.pairs = pairs


_SURROGATES: Final = re.compile("[\ud800-\udfff]")
# Go's encoder escapes these by default (SetEscapeHTML(true)); Python's does not.
_GO_EXTRA_ESCAPES: Final = str.maketrans(
    {"<": "\\u003c", ">": "\\u003e", "&": "\\u0026", "\u2028": "\\u2028", "\u2029": "\\u2029"}
)


def _encode_struct(pairs: Iterable[tuple[str, Any]]) -> str:
    return "{" + ",".join(f"{_encode_string(k)}:{_encode(v, False)}" for k, v in pairs) + "}"


def _encode(value: Any, in_go_map: bool) -> str:
    """Encode one value; ``in_go_map`` means numbers came from a Go ``interface{}`` (float64)."""
    if value is None:
        return "null"
    if isinstance(value, _Struct):
        return _encode_struct(value.pairs)
    if isinstance(value, _GoMap):
        value = value.items
        in_go_map = True
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return _format_go_float(float(value)) if in_go_map else str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            return "null"
        return _format_go_float(value)
    if isinstance(value, str):
        return _encode_string(value)
    if isinstance(value, Mapping):
        body = ",".join(f"{_encode_string(str(k))}:{_encode(value[k], in_go_map)}" for k in sorted(value, key=str))
        return "{" + body + "}"
    if isinstance(value, list | tuple):
        return "[" + ",".join(_encode(item, in_go_map) for item in value) + "]"
    raise TypeError(f"cannot encode {type(value).__name__} in a ConfigMap entry")


def _encode_string(text: str) -> str:
    # Go replaces invalid UTF-8 with U+FFFD; lone surrogates are Python's equivalent.
    text = _SURROGATES.sub("\ufffd", text)
    return json.dumps(text, ensure_ascii=False).translate(_GO_EXTRA_ESCAPES)


def _format_go_float(value: float) -> str:
    """Go's ``encoding/json`` float64 format: shortest digits, fixed notation in [1e-6, 1e21)."""
    if value == 0:
        return "-0" if math.copysign(1.0, value) < 0 else "0"
    if 1e-6 <= abs(value) < 1e21:
        text = format(Decimal(repr(value)), "f")
        if "." in text:
            text = text.rstrip("0").rstrip(".")
        return text
    # Outside that range repr() is already exponent form with >= 2 exponent digits, like Go's 'e'
    # format; Go then shortens a negative two-digit exponent with a leading zero ("e-07" -> "e-7").
    text = repr(value)
    if len(text) >= 4 and text[-4] == "e" and text[-3] == "-" and text[-2] == "0":
        text = text[:-2] + text[-1]
    return text
