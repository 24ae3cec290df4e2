"""ConfigMap entry codec (docs/ome-compatibility.md#63-configmap-entry-value): byte-exact Go encoding and tolerant
decoding."""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import UTC, datetime, timedelta, timezone

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from model_agent.model.entry import (
    MAX_ENTRY_BYTES,
    MAX_METADATA_STRING,
    Artifact,
    BytesBySource,
    DownloadProgress,
    ModelConfig,
    ModelEntry,
    cap_entry_json,
    rfc3339,
    without_config,
)
from model_agent.model.keys import ModelState

# docs/ome-compatibility.md#63-configmap-entry-value, marshalled by Go from OME's types.
GOLDEN = [
    '{"name":"x","status":"Updating"}',
    '{"name":"x","status":"Ready","config":{"modelType":"llama","artifact":{"sha":"","parentPath":null,'
    '"childrenPaths":null}}}',
    '{"name":"x","status":"Updating","progress":{"phase":"downloading","totalBytes":16060522496,'
    '"completedBytes":4294967296,"totalFiles":17,"completedFiles":5,"speedBytesPerSec":104857600.5,'
    '"lastUpdated":"2026-05-01T12:00:00Z"}}',
    '{"name":"llama-3-1-8b-instruct","status":"Ready","config":{"modelType":"llama",'
    '"modelArchitecture":"LlamaForCausalLM","modelFramework":{"name":"transformers","version":"4.43.0.dev0"},'
    '"modelFormat":{"name":"safetensors","version":"1.0.0"},"modelParameterSize":"8.03B","maxTokens":131072,'
    '"modelCapabilities":["TEXT_TO_TEXT"],"decodedModelConfiguration":{"architecture":"LlamaForCausalLM",'
    '"context_length":131072,"has_vision":false,"is_embedding":false,"model_size_bytes":16060522496,'
    '"model_type":"llama","parameter_count":"8.03B","torch_dtype":"bfloat16",'
    '"transformers_version":"4.43.0.dev0"},"artifact":{"sha":"0e9e39f249a16976918f6564b8830bc894c89659",'
    '"parentPath":{"clusterbasemodel.llama-3-1-8b-instruct":"/raid/models/meta/llama-3.1-8b-instruct"},'
    '"childrenPaths":[]}}}',
]


@pytest.mark.parametrize("text", GOLDEN)
def test_golden_round_trip(text: str) -> None:
    entry = ModelEntry.from_json(text)
    assert entry is not None
    assert entry.to_json() == text


def test_golden_built_from_python_values() -> None:
    assert ModelEntry("x", ModelState.UPDATING).to_json() == GOLDEN[0]
    assert ModelEntry("x", ModelState.READY, config=ModelConfig(model_type="llama")).to_json() == GOLDEN[1]
    progress = DownloadProgress(
        phase="downloading",
        total_bytes=16060522496,
        completed_bytes=4294967296,
        total_files=17,
        completed_files=5,
        speed_bytes_per_sec=104857600.5,
        last_updated="2026-05-01T12:00:00Z",
    )
    assert ModelEntry("x", "Updating", progress=progress).to_json() == GOLDEN[2]
    config = ModelConfig(
        model_type="llama",
        model_architecture="LlamaForCausalLM",
        # Insertion order must not matter: Go maps are written with sorted keys.
        model_framework={"version": "4.43.0.dev0", "name": "transformers"},
        model_format={"name": "safetensors", "version": "1.0.0"},
        model_parameter_size="8.03B",
        max_tokens=131072,
        model_capabilities=("TEXT_TO_TEXT",),
        decoded_model_configuration={
            "transformers_version": "4.43.0.dev0",
            "torch_dtype": "bfloat16",
            "parameter_count": "8.03B",
            "model_type": "llama",
            "model_size_bytes": 16060522496,
            "is_embedding": False,
            "has_vision": False,
            "context_length": 131072,
            "architecture": "LlamaForCausalLM",
        },
        artifact=Artifact(
            sha="0e9e39f249a16976918f6564b8830bc894c89659",
            parent_path={"clusterbasemodel.llama-3-1-8b-instruct": "/raid/models/meta/llama-3.1-8b-instruct"},
            children_paths=(),
        ),
    )
    assert ModelEntry("llama-3-1-8b-instruct", ModelState.READY, config=config).to_json() == GOLDEN[3]


class TestEncoding:
    def test_artifact_null_versus_empty(self) -> None:
        assert Artifact().to_json() == '{"sha":"","parentPath":null,"childrenPaths":null}'
        assert Artifact("s", {}, ()).to_json() == '{"sha":"s","parentPath":{},"childrenPaths":[]}'
        assert (
            Artifact("", {"b": "2", "a": "1"}, ("/x", "/y")).to_json()
            == '{"sha":"","parentPath":{"a":"1","b":"2"},"childrenPaths":["/x","/y"]}'
        )

    def test_config_omits_empty_fields_but_keeps_artifact(self) -> None:
        empty = ModelConfig(model_framework={}, model_format={}, decoded_model_configuration={})
        assert empty.to_json() == '{"artifact":{"sha":"","parentPath":null,"childrenPaths":null}}'

    def test_config_field_order_is_struct_order(self) -> None:
        config = ModelConfig(
            quantization="fp8",
            api_capabilities=("A",),
            model_capabilities=("M",),
            max_tokens=7,
            model_parameter_size="1B",
            model_format={"name": "f"},
            model_framework={"name": "t"},
            model_architecture="Arch",
            model_type="t",
            decoded_model_configuration={"k": 1},
        )
        keys = list(json.loads(config.to_json()))
        assert keys == [
            "modelType",
            "modelArchitecture",
            "modelFramework",
            "modelFormat",
            "modelParameterSize",
            "maxTokens",
            "modelCapabilities",
            "apiCapabilities",
            "decodedModelConfiguration",
            "quantization",
            "artifact",
        ]

    def test_progress_always_writes_every_field(self) -> None:
        assert DownloadProgress().to_json() == (
            '{"phase":"","totalBytes":0,"completedBytes":0,"totalFiles":0,"completedFiles":0,'
            '"speedBytesPerSec":0,"lastUpdated":""}'
        )

    @pytest.mark.parametrize(
        ("value", "expected"),
        [
            (0.0, "0"),
            (-0.0, "-0"),
            (1.0, "1"),
            (-3.0, "-3"),
            (0.1, "0.1"),
            (104857600.5, "104857600.5"),
            (2.5e-5, "0.000025"),
            (1e-6, "0.000001"),
            (1e-7, "1e-7"),
            (1.5e-7, "1.5e-7"),
            (1.2345e-10, "1.2345e-10"),
            (5e-324, "5e-324"),
            (1e16, "10000000000000000"),
            (1e20, "100000000000000000000"),
            (1e21, "1e+21"),
            (1.7976931348623157e308, "1.7976931348623157e+308"),
            (123456789.123, "123456789.123"),
        ],
    )
    def test_go_float_format(self, value: float, expected: str) -> None:
        text = DownloadProgress(speed_bytes_per_sec=value).to_json()
        assert f'"speedBytesPerSec":{expected},' in text

    def test_decoded_configuration_numbers_are_go_float64(self) -> None:
        config = ModelConfig(
            decoded_model_configuration={
                "z": [1, 2.0, {"b": True, "a": None}],
                "big": 2**60 + 1,  # not representable in float64: Go prints the rounded value
                "huge": 10**21,
                "nan": float("nan"),
            }
        )
        decoded = json.loads(config.to_json())["decodedModelConfiguration"]
        assert list(decoded) == ["big", "huge", "nan", "z"]
        text = config.to_json()
        assert '"big":1152921504606847000' in text  # shortest digits, as Go (and JavaScript) print it
        assert '"huge":1e+21' in text
        assert '"nan":null' in text
        assert '"z":[1,2,{"a":null,"b":true}]' in text

    def test_string_escaping_matches_go(self) -> None:
        entry = ModelEntry('a<b>&c"\\\n\t\x01\x7fé\u2028\u2029\ud800', "Ready")
        assert entry.to_json() == (
            '{"name":"a\\u003cb\\u003e\\u0026c\\"\\\\\\n\\t\\u0001\x7fé\\u2028\\u2029\ufffd","status":"Ready"}'
        )

    def test_invalid_values_are_refused_at_construction(self) -> None:
        with pytest.raises(ValueError):
            DownloadProgress(total_bytes=-1)
        with pytest.raises(ValueError):
            DownloadProgress(total_files=2**32)
        with pytest.raises(ValueError):
            DownloadProgress(speed_bytes_per_sec=float("inf"))
        with pytest.raises(ValueError):
            ModelConfig(max_tokens=2**31)


class TestDecoding:
    @pytest.mark.parametrize(
        "text",
        [
            "",
            "not json",
            "[]",
            "null",
            '"x"',
            "{",
            '{"name":1,"status":"Ready"}',
            '{"name":"x","status":["Ready"]}',
            '{"name":"x","status":"Ready","config":[]}',
            '{"name":"x","status":"Ready","config":{"maxTokens":2147483648}}',
            '{"name":"x","status":"Ready","config":{"maxTokens":1.0}}',
            '{"name":"x","status":"Ready","config":{"modelCapabilities":"TEXT"}}',
            '{"name":"x","status":"Ready","config":{"modelFramework":{"name":1}}}',
            '{"name":"x","status":"Ready","config":{"decodedModelConfiguration":[]}}',
            '{"name":"x","status":"Ready","config":{"decodedModelConfiguration":{"a":1e400}}}',
            '{"name":"x","status":"Ready","config":{"decodedModelConfiguration":{"a":NaN}}}',
            '{"name":"x","status":"Ready","config":{"artifact":{"childrenPaths":{}}}}',
            '{"name":"x","status":"Updating","progress":{"totalBytes":-1}}',
            '{"name":"x","status":"Updating","progress":{"totalBytes":18446744073709551616}}',
            '{"name":"x","status":"Updating","progress":{"totalFiles":4294967296}}',
            '{"name":"x","status":"Updating","progress":{"completedBytes":true}}',
            '{"name":"x","status":"Updating","progress":{"speedBytesPerSec":"fast"}}',
            '{"name":"x","status":"Updating","progress":{"speedBytesPerSec":Infinity}}',
            '{"name":"x","status":"Updating","progress":{"speedBytesPerSec":1' + "0" * 400 + "}}",
            '{"name":"x"} trailing',
            "[" * 100_000,
        ],
    )
    def test_garbage_gives_none(self, text: str) -> None:
        assert ModelEntry.from_json(text) is None

    def test_bytes_input_and_invalid_utf8(self) -> None:
        assert ModelEntry.from_json(b'{"name":"x","status":"Ready"}') == ModelEntry("x", "Ready")
        assert ModelEntry.from_json(b'{"name":"\xff"}') == ModelEntry("\ufffd", "")
        assert ModelEntry.from_json(b'\xff{"name":"x"}') is None

    def test_tolerances_shared_with_go(self) -> None:
        # Unknown fields are ignored; null leaves the zero value; missing fields default.
        entry = ModelEntry.from_json(
            '{"name":"x","status":null,"extra":{"deep":[1]},"config":{"modelType":null,'
            '"modelFramework":{"name":null},"modelCapabilities":null,"artifact":null},"progress":null}'
        )
        assert entry == ModelEntry(
            "x", "", config=ModelConfig(model_framework={"name": ""}, artifact=Artifact()), progress=None
        )
        assert ModelEntry.from_json("{}") == ModelEntry("", "")
        # An unknown status string is kept (Go's type is a plain string).
        deleted = ModelEntry.from_json('{"name":"x","status":"Deleted"}')
        assert deleted is not None and deleted.status == "Deleted"

    def test_empty_config_object_round_trips_as_go_does(self) -> None:
        entry = ModelEntry.from_json('{"name":"x","status":"Ready","config":{}}')
        assert entry is not None
        assert entry.to_json() == (
            '{"name":"x","status":"Ready","config":{"artifact":{"sha":"","parentPath":null,"childrenPaths":null}}}'
        )

    def test_generic_map_key_order_is_normalised_to_struct_order(self) -> None:
        sorted_text = '{"config":{"artifact":{"childrenPaths":["/c"],"parentPath":{"k":"/p"},"sha":"s"}},'
        sorted_text += '"name":"x","status":"Ready"}'
        entry = ModelEntry.from_json(sorted_text)
        assert entry is not None
        assert entry.to_json() == (
            '{"name":"x","status":"Ready","config":{"artifact":{"sha":"s","parentPath":{"k":"/p"},'
            '"childrenPaths":["/c"]}}}'
        )

    def test_integral_speed_is_accepted(self) -> None:
        entry = ModelEntry.from_json('{"name":"x","status":"Updating","progress":{"speedBytesPerSec":5}}')
        assert entry is not None and entry.progress is not None
        assert entry.progress.speed_bytes_per_sec == 5.0


class TestStatusWrite:
    def test_terminal_status_drops_progress(self) -> None:
        entry = ModelEntry("x", "Updating", config=ModelConfig(model_type="t"), progress=DownloadProgress())
        ready = entry.with_status(ModelState.READY)
        assert ready == ModelEntry("x", "Ready", config=ModelConfig(model_type="t"))
        assert entry.with_status("Failed").progress is None
        assert entry.with_status(ModelState.UPDATING).progress == DownloadProgress()


def test_rfc3339() -> None:
    assert rfc3339(datetime(2026, 5, 1, 12, 0, 0, 123456, tzinfo=UTC)) == "2026-05-01T12:00:00Z"
    assert rfc3339(datetime(2026, 5, 1, 14, 0, 0, tzinfo=timezone(timedelta(hours=2)))) == "2026-05-01T12:00:00Z"
    assert rfc3339(datetime(2026, 5, 1, 12, 0, 0)) == "2026-05-01T12:00:00Z"


# --- properties -----------------------------------------------------------------------------------------

_text = st.text(max_size=20)
_json_scalar = st.none() | st.booleans() | st.integers(-(2**53), 2**53) | _text
_decoded = st.dictionaries(
    _text, st.recursive(_json_scalar, lambda inner: st.lists(inner, max_size=3), max_leaves=5), max_size=4
)
_artifact = st.builds(
    Artifact,
    sha=_text,
    parent_path=st.none() | st.dictionaries(_text, _text, max_size=2),
    children_paths=st.none() | st.lists(_text, max_size=3).map(tuple),
)
_config = st.builds(
    ModelConfig,
    model_type=_text,
    model_framework=st.none() | st.dictionaries(_text, _text, min_size=1, max_size=2),
    max_tokens=st.integers(-(2**31), 2**31 - 1),
    model_capabilities=st.lists(_text, max_size=3).map(tuple),
    decoded_model_configuration=st.none() | _decoded.filter(bool),
    artifact=_artifact,
)
_progress = st.builds(
    DownloadProgress,
    phase=st.sampled_from(["scanning", "downloading", "finalizing", "unknown"]),
    total_bytes=st.integers(0, 2**64 - 1),
    completed_files=st.integers(0, 2**32 - 1),
    # + 0.0 turns -0.0 into 0.0: Python's json reads the literal -0 as the integer 0.
    speed_bytes_per_sec=st.floats(allow_nan=False, allow_infinity=False).map(lambda f: f + 0.0),
    last_updated=_text,
)
_entries = st.builds(
    ModelEntry,
    name=_text,
    status=st.sampled_from(["Ready", "Updating", "Failed"]),
    config=st.none() | _config,
    progress=st.none() | _progress,
    storage_uri=_text,
    storage_path=_text,
    bytes_by_source=st.none()
    | st.builds(
        BytesBySource, origin=st.integers(0, 2**64 - 1), peer=st.integers(0, 2**40), shared_root=st.integers(0, 2**40)
    ),
)


@settings(max_examples=200, deadline=None)
@given(entry=_entries)
def test_encoding_round_trips(entry: ModelEntry) -> None:
    text = entry.to_json()
    json.loads(text)  # always valid JSON
    decoded = ModelEntry.from_json(text)
    assert decoded == entry
    assert decoded is not None and decoded.to_json() == text


@settings(max_examples=200, deadline=None)
@given(text=st.text(max_size=200) | st.binary(max_size=200))
def test_decoding_never_raises(text: str | bytes) -> None:
    ModelEntry.from_json(text)


# --- size caps -------------------------------------------------------------------------------------------

_REASON_TEXT = "LocalPathNotFound: /models/x does not exist"
_REASON = ',"reason":"LocalPathNotFound: /models/x does not exist"}'


def _failed_with_reason(entry: ModelEntry) -> str:
    text = replace(entry, reason=_REASON_TEXT).to_json()
    assert text == entry.to_json()[:-1] + _REASON  # the reason is written last, after every OME field
    return text


def test_a_small_entry_is_left_exactly_as_written() -> None:
    for text in GOLDEN:
        assert cap_entry_json(text) == text
    with_reason = _failed_with_reason(ModelEntry("x", "Failed", config=ModelConfig(model_type="llama")))
    assert cap_entry_json(with_reason) == with_reason


def test_over_long_metadata_strings_are_cut_even_when_the_entry_fits() -> None:
    config = ModelConfig(model_type="t" * 5000, model_capabilities=tuple(f"c{i}" for i in range(500)))
    capped = ModelEntry.from_json(cap_entry_json(ModelEntry("x", "Ready", config=config).to_json()))
    assert capped is not None and capped.config is not None
    assert capped.status == "Ready"
    assert capped.config.model_type == "t" * MAX_METADATA_STRING
    assert len(capped.config.model_capabilities) == 64


def test_the_decoded_configuration_goes_first_then_the_whole_config_never_the_status() -> None:
    decoded = {f"layer_{i}": "x" * 100 for i in range(200)}  # ~22 KiB
    config = ModelConfig(model_type="llama", decoded_model_configuration=decoded)
    progress = DownloadProgress(phase="downloading", total_bytes=10, completed_bytes=5)
    entry = ModelEntry("m" * 200, "Updating", config=config, progress=progress)
    text = entry.to_json()[:-1] + _REASON
    capped_text = cap_entry_json(text)
    assert len(capped_text.encode()) <= MAX_ENTRY_BYTES
    capped = ModelEntry.from_json(capped_text)
    assert capped == ModelEntry(
        "m" * 200, "Updating", config=ModelConfig(model_type="llama"), progress=progress, reason=_REASON_TEXT
    )
    assert json.loads(capped_text)["reason"] == json.loads(text)["reason"]
    # A config too large even without its decoded configuration goes as a whole.
    huge = ModelConfig(artifact=Artifact(parent_path={f"k{i}": "p" * 250 for i in range(60)}))
    tiny = cap_entry_json(ModelEntry("x", "Ready", config=huge).to_json(), max_bytes=2000)
    assert tiny == '{"name":"x","status":"Ready"}'


def test_capping_is_idempotent_and_without_config_keeps_the_status() -> None:
    decoded = {f"k{i}": i for i in range(3000)}
    text = _failed_with_reason(ModelEntry("x", "Failed", config=ModelConfig(decoded_model_configuration=decoded)))
    once = cap_entry_json(text)
    assert cap_entry_json(once) == once
    assert without_config(text) == '{"name":"x","status":"Failed"' + _REASON
    assert without_config(without_config(text)) == without_config(text)
    assert cap_entry_json("not json") == "not json"


@pytest.mark.parametrize(
    ("reason_json", "reason"),
    [
        ('"RateLimited: slow down"', "RateLimited: slow down"),
        ("42", ""),  # someone else's field of another type: no reason, and the entry still reads
        ("null", ""),
    ],
)
def test_reason_is_read_leniently(reason_json: str, reason: str) -> None:
    entry = ModelEntry.from_json('{"name":"x","status":"Failed","reason":' + reason_json + "}")
    assert entry is not None and entry.reason == reason


def test_reason_is_capped_and_dropped_when_the_model_leaves_failed() -> None:
    failed = ModelEntry("x", "Failed", reason="E" * 2000)
    assert json.loads(failed.to_json())["reason"] == "E" * 500
    assert failed.with_status("Failed").reason == "E" * 2000
    assert failed.with_status("Ready").reason == "" and "reason" not in failed.with_status("Updating").to_json()


# --- bytesBySource: this agent's own field, after OME's, read leniently ---------------------------------


def test_bytes_by_source_is_written_after_omes_fields_and_read_back() -> None:
    progress = DownloadProgress("downloading", 100, 60, 3, 1, 1.5, "2026-12-02T15:00:00Z")
    entry = ModelEntry("x", "Updating", progress=progress, bytes_by_source=BytesBySource(10, 50, 0))
    text = entry.to_json()
    assert text.endswith(',"bytesBySource":{"origin":10,"peer":50,"sharedRoot":0}}')
    assert list(json.loads(text)) == ["name", "status", "progress", "bytesBySource"]
    assert ModelEntry.from_json(text) == entry
    # OME's fields are byte for byte what they are without it: a Go reader sees the same entry
    assert (
        text.replace(',"bytesBySource":{"origin":10,"peer":50,"sharedRoot":0}', "")
        == replace(entry, bytes_by_source=None).to_json()
    )


@pytest.mark.parametrize(
    "value",
    ['"lots"', "[1]", '{"origin":-1}', '{"origin":1.5}', '{"peer":"x"}', '{"sharedRoot":true}'],
)
def test_a_bytes_by_source_that_is_not_ours_reads_as_none_and_the_entry_still_reads(value: str) -> None:
    text = '{"name":"x","status":"Ready","bytesBySource":' + value + "}"
    entry = ModelEntry.from_json(text)
    assert entry is not None and entry.status == "Ready" and entry.bytes_by_source is None
    assert json.loads(without_config(text))["bytesBySource"] == json.loads(value)  # someone else's: kept verbatim


def test_bytes_by_source_stays_on_ready_and_updating_and_leaves_on_failed() -> None:
    entry = ModelEntry("x", "Updating", bytes_by_source=BytesBySource(peer=7))
    assert entry.with_status("Ready").bytes_by_source == BytesBySource(peer=7)
    assert entry.with_status("Updating").bytes_by_source == BytesBySource(peer=7)
    assert entry.with_status("Failed").bytes_by_source is None
    assert BytesBySource(1, 2, 3).total == 6
    with pytest.raises(ValueError, match="out of range"):
        BytesBySource(origin=-1)


def test_capping_never_drops_bytes_by_source() -> None:
    config = ModelConfig(model_type="llama", decoded_model_configuration={"k": "v" * (MAX_ENTRY_BYTES + 10)})
    entry = ModelEntry("x", "Ready", config=config, bytes_by_source=BytesBySource(origin=1, peer=2))
    capped = ModelEntry.from_json(cap_entry_json(entry.to_json()))
    assert capped is not None and capped.bytes_by_source == BytesBySource(origin=1, peer=2)
    assert capped.config is not None and capped.config.decoded_model_configuration is None


def test_storage_fields_follow_omes_fields_and_are_left_out_when_empty() -> None:
    entry = ModelEntry(name="m", status="Ready", storage_uri="hf://org/m", storage_path="/mnt/data/models/m")
    assert (
        entry.to_json() == '{"name":"m","status":"Ready","storageUri":"hf://org/m","storagePath":"/mnt/data/models/m"}'
    )
    assert ModelEntry(name="m", status="Ready").to_json() == '{"name":"m","status":"Ready"}'
    assert ModelEntry.from_json(entry.to_json()) == entry
    assert ModelEntry.from_json('{"name":"m","status":"Ready","storageUri":7}') is None  # Go refuses the type too


def test_the_smallest_form_drops_the_storage_fields_too() -> None:
    full = ModelEntry(name="m", status="Ready", storage_uri="local:///a/long/path", storage_path="/a/long/path")
    assert without_config(full.to_json()) == '{"name":"m","status":"Ready"}'
    assert without_config(without_config(full.to_json())) == '{"name":"m","status":"Ready"}'


def test_capping_keeps_the_storage_fields_once() -> None:
    big = ModelConfig(model_type="llama", decoded_model_configuration={"k": "v" * (MAX_ENTRY_BYTES + 100)})
    text = ModelEntry(name="m", status="Ready", config=big, storage_uri="hf://o/m", storage_path="/m").to_json()
    capped = cap_entry_json(text)
    assert capped.count('"storageUri"') == 1 and capped.count('"storagePath"') == 1
    assert len(capped.encode()) <= MAX_ENTRY_BYTES
