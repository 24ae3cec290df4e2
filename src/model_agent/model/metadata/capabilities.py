"""Model capabilities (``TEXT_TO_TEXT``, ``EMBEDDING``, ...) from architecture, type and flags.

Role: the first-match rule table of docs/ome-compatibility.md#75-capabilities as one pure function. No I/O.
"""

from __future__ import annotations

from typing import Final

CAPABILITY_TEXT_TO_TEXT: Final = "TEXT_TO_TEXT"
CAPABILITY_EMBEDDING: Final = "EMBEDDING"
CAPABILITY_TEXT_TO_AUDIO: Final = "TEXT_TO_AUDIO"
CAPABILITY_TEXT_TO_IMAGE: Final = "TEXT_TO_IMAGE"
CAPABILITY_TEXT_TO_VIDEO: Final = "TEXT_TO_VIDEO"
CAPABILITY_IMAGE_TEXT_TO_TEXT: Final = "IMAGE_TEXT_TO_TEXT"
CAPABILITY_IMAGE_TEXT_TO_AUDIO: Final = "IMAGE_TEXT_TO_AUDIO"
CAPABILITY_IMAGE_TEXT_TO_IMAGE: Final = "IMAGE_TEXT_TO_IMAGE"
CAPABILITY_IMAGE_TEXT_TO_VIDEO: Final = "IMAGE_TEXT_TO_VIDEO"
CAPABILITY_VIDEO_TEXT_TO_AUDIO: Final = "VIDEO_TEXT_TO_AUDIO"
CAPABILITY_AUDIO_TO_TEXT: Final = "AUDIO_TO_TEXT"
CAPABILITY_AUDIO_TO_AUDIO: Final = "AUDIO_TO_AUDIO"


def determine_capabilities(
    architecture: str,
    model_type: str,
    *,
    has_vision: bool,
    is_embedding: bool,
    is_diffusers: bool,
) -> list[str]:
    """Capabilities by the first matching rule of docs/ome-compatibility.md#75-capabilities (lower-cased substring
    tests)."""
    arch = architecture.lower()
    mtype = model_type.lower()

    def has(*needles: str) -> bool:
        return any(n in arch for n in needles)

    if is_diffusers:
        if has("imageedit", "pix2pix", "img2img", "inpaint"):
            return [CAPABILITY_IMAGE_TEXT_TO_IMAGE]
        if has("image", "pix", "stablediffusion"):
            return [CAPABILITY_TEXT_TO_IMAGE]
        if has("texttovideo", "t2v"):
            return [CAPABILITY_TEXT_TO_VIDEO]
        if has("video"):
            return [CAPABILITY_IMAGE_TEXT_TO_VIDEO]
    if "nemotronh_nano" in mtype:
        return [CAPABILITY_IMAGE_TEXT_TO_TEXT, CAPABILITY_TEXT_TO_TEXT, CAPABILITY_AUDIO_TO_TEXT]
    if has_vision:
        return [CAPABILITY_IMAGE_TEXT_TO_TEXT]
    if has("omni"):
        return [
            CAPABILITY_TEXT_TO_AUDIO,
            CAPABILITY_IMAGE_TEXT_TO_AUDIO,
            CAPABILITY_VIDEO_TEXT_TO_AUDIO,
            CAPABILITY_AUDIO_TO_TEXT,
            CAPABILITY_AUDIO_TO_AUDIO,
        ]
    if has("whisper", "wav2vec2", "hubert", "fortc", "forspeechtotext"):
        return [CAPABILITY_AUDIO_TO_TEXT]
    if (
        is_embedding
        or has("embedding", "sentence")
        or "bert" in mtype
        or ("mistral" in mtype and "mistralmodel" in arch)
    ):
        return [CAPABILITY_EMBEDDING]
    return [CAPABILITY_TEXT_TO_TEXT]
