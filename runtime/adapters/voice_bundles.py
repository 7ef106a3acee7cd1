"""An exported voice read back: both bundles verified, their export format checked, and the
settings an adapter drives them with."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Final

from runtime.adapters.tts_text import VoiceConfig
from runtime.adapters.voice_chunks import ChunkPlan, decode_chunks_plan, plan_chunk
from runtime.artifacts import VerifiedBundle, verify_bundle
from runtime.errors import UsageError, VerificationError

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

#: Version of the bundle layout this module writes; bundles of another format are re-exported.
#: 2: context chosen by measurement, windows sized to the chunk, chunks up to 256 frames.
#: 3: acoustic calls sized to the utterance (``metadata.sized_axis``, a 32-id bucket), decoder
#:    chunks from 32 up to 512 frames.
EXPORT_FORMAT: Final = 3


@dataclass(frozen=True, slots=True)
class AcousticSettings:
    """How the acoustic bundle is called: its phoneme-id buckets; ``sized`` says it accepts any
    id count between its smallest and largest bucket (``metadata.sized_axis``)."""

    buckets: tuple[int, ...]
    sized: bool = False


@dataclass(frozen=True, slots=True)
class DecoderSettings:
    """How the decoder bundle is called: chunk schedule, context and window buckets.

    ``sized`` says the bundle accepts windows of any length between its smallest and largest
    bucket (``metadata.sized_axis``); a route that needs static shapes still uses the buckets.
    """

    schedule: tuple[int, ...]
    context: tuple[int, int]
    buckets: tuple[int, ...]
    samples_per_frame: int
    sized: bool = False

    def plan(
        self, frames: int, schedule: Sequence[int] | None = None, *, sized: bool | None = None
    ) -> list[ChunkPlan]:
        """:func:`decode_chunks_plan` with these settings (and optionally another schedule
        whose chunks fit these buckets, or fixed buckets on a bundle that accepts sized ones)."""
        return decode_chunks_plan(
            frames,
            self.schedule if schedule is None else schedule,
            self.context,
            buckets=self.buckets,
            samples_per_frame=self.samples_per_frame,
            sized=self.sized if sized is None else sized and self.sized,
        )

    def chunk(self, index: int, start: int, size: int, frames: int, *, sized: bool) -> ChunkPlan:
        """:func:`plan_chunk` with these settings: one call keeping ``size`` frames."""
        return plan_chunk(
            index,
            start,
            size,
            frames,
            self.context,
            self.buckets,
            samples_per_frame=self.samples_per_frame,
            sized=sized and self.sized,
        )


@dataclass(frozen=True, slots=True)
class VoiceBundles:
    """An exported voice: both verified bundles and what an adapter needs to drive them."""

    root: Path
    acoustic: VerifiedBundle
    decoder: VerifiedBundle
    voice: VoiceConfig
    acoustic_settings: AcousticSettings
    decoder_settings: DecoderSettings
    checkpoint_revision: str
    validation: Mapping[str, Any]


def _metadata_error(bundle: VerifiedBundle, key: str, accepted: str) -> VerificationError:
    return VerificationError(
        f"{bundle.manifest_path}: metadata.{key} is missing or malformed; accepted: {accepted}. "
        "Export the voice again (omni-edge bundle export-voice)",
        code="bad_voice_metadata",
        subject=f"metadata.{key}",
    )


def _int_list(value: object) -> tuple[int, ...] | None:
    if not isinstance(value, list) or not all(type(v) is int and v > 0 for v in value):
        return None
    return tuple(value)


def export_format_of(manifest: Path) -> object:
    """The ``voice_export_format`` a voice bundle's manifest names (None when unreadable);
    read without verifying the bundle, to tell a previous release's export from a current one."""
    try:
        document = json.loads(Path(manifest).read_bytes())
    except (OSError, ValueError):
        return None
    metadata = document.get("metadata") if isinstance(document, dict) else None
    return metadata.get("voice_export_format") if isinstance(metadata, dict) else None


def load_voice_bundles(root: Path) -> VoiceBundles:
    """Verify ``root/acoustic`` and ``root/decoder`` and read their voice metadata."""
    return read_voice_bundles(Path(root) / "acoustic", Path(root) / "decoder", root=Path(root))


def read_voice_bundles(
    acoustic_manifest: Path, decoder_manifest: Path, *, root: Path | None = None
) -> VoiceBundles:
    """Verify an acoustic and a decoder bundle (manifest files or directories) wherever they
    are, and read their voice metadata; ``root`` defaults to the acoustic bundle's parent."""
    acoustic = verify_bundle(acoustic_manifest)
    decoder = verify_bundle(decoder_manifest)
    for bundle, role in ((acoustic, "acoustic"), (decoder, "decoder")):
        meta = bundle.manifest.metadata
        if meta.get("voice_export_format") != EXPORT_FORMAT or meta.get("role") != role:
            raise _metadata_error(
                bundle,
                "voice_export_format",
                f"a {role} bundle of export format {EXPORT_FORMAT}",
            )
    meta = acoustic.manifest.metadata
    ac_buckets = _int_list(meta.get("id_buckets"))
    if not ac_buckets:
        raise _metadata_error(acoustic, "id_buckets", "a list of positive id counts")
    try:
        voice = VoiceConfig.from_json(meta.get("voice"), source=f"{acoustic.manifest_path}")
    except UsageError as exc:
        raise _metadata_error(acoustic, "voice", f"a Piper voice config ({exc})") from None
    dmeta = decoder.manifest.metadata
    schedule = _int_list(dmeta.get("schedule"))
    context = dmeta.get("context")
    frame_buckets = _int_list(dmeta.get("frame_buckets"))
    spf = dmeta.get("samples_per_frame")
    if (
        not schedule
        or not frame_buckets
        or not isinstance(context, list)
        or len(context) != 2
        or not all(type(side) is int and side >= 0 for side in context)
        or type(spf) is not int
        or spf < 1
    ):
        raise _metadata_error(
            decoder,
            "schedule",
            "schedule, frame_buckets (positive ints), context [left, right] and samples_per_frame",
        )
    return VoiceBundles(
        root=acoustic.root.parent if root is None else root,
        acoustic=acoustic,
        decoder=decoder,
        voice=voice,
        acoustic_settings=AcousticSettings(ac_buckets, sized=meta.get("sized_axis") is not None),
        decoder_settings=DecoderSettings(
            schedule,
            (context[0], context[1]),
            frame_buckets,
            spf,
            sized=dmeta.get("sized_axis") is not None,
        ),
        checkpoint_revision=str(meta["checkpoint_revision"]),
        validation=MappingProxyType(dict(meta["validation"]))
        if isinstance(meta["validation"], dict)
        else MappingProxyType({}),
    )
