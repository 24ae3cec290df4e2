"""Model metadata rules: what a model's decoded config files say about it
(docs/ome-compatibility.md#7-model-config-parsing, ConfigMap 6.3).

Role
----
After the weights of a model are in place, the agent describes them in its ConfigMap entry and in the
model's spec: model type, architecture, framework and format, parameter count and its human-readable
size, context length, capabilities, quantization, and a small "decoded configuration" object. This
package holds the pure part of that: the result types, the rules from already-decoded JSON (and numbers)
to that description, and bounded decoding of JSON bytes. The file reading (which file, confinement to the
model directory, read limits, safetensors headers) is ``model_agent.local.metadata_files``, whose
``parse_model_dir`` reads the files and calls these rules.

One module per job:

* :mod:`.results`: :class:`ParsedMetadata` and its parts, :class:`MetadataError`, the decoded keys;
* :mod:`.limits`: the bounds every value is held to;
* :mod:`.json_decoding`: :func:`load_json_bytes`, bytes to a bounded decoded value;
* :mod:`.sizes` and :mod:`.capabilities`: size strings, bytes per dtype, quantization, capabilities;
* :mod:`.facts`: value coercions and :class:`~.facts.Facts`, the working record;
* :mod:`.architectures`: the per-family transformers rules and parameter estimates;
* :mod:`.diffusers`: the diffusers pipeline index;
* :mod:`.assemble`: facts to :class:`ParsedMetadata`.

Contract
--------
* No I/O: nothing here opens a file, lists a directory, talks to Kubernetes or reads the clock; a path
  appears only as a name in messages and in :attr:`ParsedMetadata.config_path`. Same input, same output.
* Bounded: a JSON document of more than :data:`MAX_JSON_ELEMENTS` values is refused before it is decoded,
  nesting too deep is an error, not a crash; strings taken into the entry are cut to
  :data:`MAX_METADATA_STRING` characters and a pipeline keeps at most :data:`MAX_PIPELINE_COMPONENTS`
  extra components, so one model cannot fill the node's ConfigMap.
* One error type: :class:`MetadataError` (with ``reason``) means "no usable metadata".
* Compatible: the output vocabulary and formatting (parameter size strings, capability names, the
  ``decodedModelConfiguration`` keys, ``Infinity``/``NaN`` handling) are those of OME's Go agent, so a
  mixed Go/Python fleet writes interchangeable entries. Deliberate departures are noted where made.
"""

from __future__ import annotations

from model_agent.model.metadata.architectures import REGISTERED_MODEL_TYPES
from model_agent.model.metadata.capabilities import (
    CAPABILITY_AUDIO_TO_AUDIO,
    CAPABILITY_AUDIO_TO_TEXT,
    CAPABILITY_EMBEDDING,
    CAPABILITY_IMAGE_TEXT_TO_AUDIO,
    CAPABILITY_IMAGE_TEXT_TO_IMAGE,
    CAPABILITY_IMAGE_TEXT_TO_TEXT,
    CAPABILITY_IMAGE_TEXT_TO_VIDEO,
    CAPABILITY_TEXT_TO_AUDIO,
    CAPABILITY_TEXT_TO_IMAGE,
    CAPABILITY_TEXT_TO_TEXT,
    CAPABILITY_TEXT_TO_VIDEO,
    CAPABILITY_VIDEO_TEXT_TO_AUDIO,
    determine_capabilities,
)
from model_agent.model.metadata.json_decoding import load_json_bytes
from model_agent.model.metadata.limits import MAX_JSON_ELEMENTS, MAX_METADATA_STRING, MAX_PIPELINE_COMPONENTS
from model_agent.model.metadata.results import (
    DECODED_CONFIGURATION_KEYS,
    DiffusionComponent,
    DiffusionPipeline,
    MetadataError,
    ModelFormat,
    ModelFramework,
    ParsedMetadata,
)
from model_agent.model.metadata.sizes import (
    bytes_per_parameter,
    estimate_model_size_bytes,
    format_parameter_size,
    quantization_from_method,
)

__all__ = [
    "CAPABILITY_AUDIO_TO_AUDIO",
    "CAPABILITY_AUDIO_TO_TEXT",
    "CAPABILITY_EMBEDDING",
    "CAPABILITY_IMAGE_TEXT_TO_AUDIO",
    "CAPABILITY_IMAGE_TEXT_TO_IMAGE",
    "CAPABILITY_IMAGE_TEXT_TO_TEXT",
    "CAPABILITY_IMAGE_TEXT_TO_VIDEO",
    "CAPABILITY_TEXT_TO_AUDIO",
    "CAPABILITY_TEXT_TO_IMAGE",
    "CAPABILITY_TEXT_TO_TEXT",
    "CAPABILITY_TEXT_TO_VIDEO",
    "CAPABILITY_VIDEO_TEXT_TO_AUDIO",
    "DECODED_CONFIGURATION_KEYS",
    "MAX_JSON_ELEMENTS",
    "MAX_METADATA_STRING",
    "MAX_PIPELINE_COMPONENTS",
    "REGISTERED_MODEL_TYPES",
    "DiffusionComponent",
    "DiffusionPipeline",
    "MetadataError",
    "ModelFormat",
    "ModelFramework",
    "ParsedMetadata",
    "bytes_per_parameter",
    "determine_capabilities",
    "estimate_model_size_bytes",
    "format_parameter_size",
    "load_json_bytes",
    "quantization_from_method",
]
