"""The speech front end of Piper/VITS voices: text -> normalized text -> sentences -> phoneme ids.

Phonemes come from the espeak-ng that ``piper-tts`` bundles (its own data directory, never a
system espeak), and ids follow the voice config's ``phoneme_id_map`` exactly as Piper maps
them: BOS, PAD, then each phoneme followed by PAD, then EOS.

Text policy (what :func:`normalize_for_speech` does, in order):

* Unicode NFC; non-ASCII decimal digits become ASCII digits.
* Whitespace (any Unicode space, tab, line break) collapses to one space; a blank line (two or
  more line breaks) is a paragraph break, kept as one ``"\\n"``, and always ends a sentence.
  Leading and trailing whitespace is dropped.
* Invisible format characters (zero-width joiners and spaces, soft hyphens, direction marks,
  variation selectors, tags) are removed without a note.
* Skipped with a note (a :class:`SkippedText`) and replaced by a space: control characters
  (``control``), emoji and pictographs (``emoji``), letters of a script the voice does not
  speak, with their combining marks (``script``; an English voice speaks Latin letters), and
  unassigned, private-use or surrogate code points (``character``).
* Everything else (Latin letters, digits, punctuation, symbols such as ``$`` or ``%``) is kept
  for espeak-ng, which reads it the way Piper would.

Sentences end at ``!`` or ``?`` followed by a space, at ``.`` followed by a space and an
upper-case letter, and at paragraph breaks; espeak-ng may split a piece further (after
``Mr.``), and each of its sentences becomes one utterance, so ordinary text gives exactly
Piper's sentences and ids. A sentence longer than the largest acoustic bucket is split at
clause punctuation (``,`` ``;`` ``:`` dashes), then at spaces, and a single over-long word at
character boundaries, so every utterance fits; those pieces are spoken as separate utterances.

Input limits: empty, whitespace-only and nothing-speakable texts raise :class:`SpeechInputError`;
texts up to :data:`MAX_TEXT_CHARS` characters are split and processed (20,000 characters take
about a second of phonemization on two cores); longer texts are refused with a clear error. Piper's
``[[ raw phonemes ]]`` blocks are not interpreted: brackets are text.
"""

from __future__ import annotations

import json
import re
import threading
import unicodedata
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any, Final

from piper import espeakbridge
from piper.phonemize_espeak import ESPEAK_DATA_DIR

from runtime.errors import ConfigError, UsageError

__all__ = [
    "DEFAULT_MAX_IDS",
    "MAX_TEXT_CHARS",
    "SKIP_CHARACTER",
    "SKIP_CONTROL",
    "SKIP_EMOJI",
    "SKIP_PHONEME",
    "SKIP_SCRIPT",
    "NormalizedText",
    "Phonemizer",
    "SkippedText",
    "SpeechInputError",
    "SpeechPlan",
    "Utterance",
    "VoiceConfig",
    "VoiceConfigError",
    "normalize_for_speech",
    "normalize_text",
    "prepare_speech",
    "split_sentences",
]

#: Longest text :func:`prepare_speech` accepts, in characters (after nothing is removed).
MAX_TEXT_CHARS: Final = 100_000
#: Phoneme ids per utterance when no bucket size is given (the default largest acoustic bucket).
DEFAULT_MAX_IDS: Final = 256

SKIP_CONTROL: Final = "control"
SKIP_EMOJI: Final = "emoji"
SKIP_SCRIPT: Final = "script"
SKIP_CHARACTER: Final = "character"
SKIP_PHONEME: Final = "phoneme"

BOS: Final = "^"
EOS: Final = "$"
PAD: Final = "_"

#: Code point ranges treated as emoji and pictographs. The invisible joiners, variation
#: selectors and tags that build emoji sequences are removed like other format characters.
_EMOJI_RANGES: Final = (
    (0x1F000, 0x1FAFF),
    (0x2600, 0x27BF),
    (0x2B00, 0x2BFF),
    (0x2300, 0x23FF),
    (0x20E3, 0x20E3),
)
#: Scripts each espeak-ng language family speaks; any other family speaks Latin letters.
_SCRIPTS_BY_FAMILY: Final[Mapping[str, tuple[str, ...]]] = MappingProxyType(
    {
        "ru": ("CYRILLIC",),
        "uk": ("CYRILLIC",),
        "bg": ("CYRILLIC",),
        "sr": ("CYRILLIC", "LATIN"),
        "el": ("GREEK",),
    }
)
#: A sentence ends after ``!``/``?`` or a ``.`` before an upper-case letter, closing quotes included.
_SENTENCE_END = re.compile(
    r"(?P<end>[!?][\"'\u201d\u2019)\]]*|(?<!\.)\.[\"'\u201d\u2019)\]]*(?=\s+[\"'\u201c\u2018(\[]*[A-Z]))\s+"
)
#: Line breaks in a whitespace run; two make a paragraph break (U+2029 is one by itself).
_NEWLINES: Final[Mapping[str, int]] = MappingProxyType(
    {
        "\n": 1,
        "\v": 1,
        "\f": 1,
        "\x1c": 1,
        "\x1d": 1,
        "\x1e": 1,
        "\x85": 1,
        "\u2028": 1,
        "\u2029": 2,
    }
)
_CLAUSE_END = re.compile(r"(?<=[,;:\u2014\u2013])\s+|\s+(?=[\u2014\u2013]\s)")

_SPACES = re.compile(r"\s+")
_LANGUAGE_FLAG = re.compile(r"\([^)]+\)")
_ESPEAK_LOCK = threading.Lock()
_ESPEAK_READY: list[bool] = []


class SpeechInputError(UsageError):
    """Text that cannot be spoken. ``code`` is stable: ``not_text``, ``empty``,
    ``whitespace_only``, ``too_long``, ``nothing_speakable`` or ``does_not_fit``."""

    def __init__(self, message: str, *, code: str) -> None:
        super().__init__(message)
        self.code = code


class VoiceConfigError(ConfigError):
    """A voice config (Piper's ``.onnx.json``) is missing a field or holds a bad value."""


@dataclass(frozen=True, slots=True)
class VoiceConfig:
    """The parts of a Piper voice config that speech needs, checked on load."""

    sample_rate: int
    espeak_voice: str
    phoneme_id_map: Mapping[str, tuple[int, ...]]
    noise_scale: float
    length_scale: float
    noise_w: float
    hop_length: int = 256
    language: str = ""
    vowel_clusters: frozenset[tuple[str, ...]] = frozenset()

    @property
    def scales(self) -> tuple[float, float, float]:
        """The voice's ``scales`` input: noise, length, noise width."""
        return (self.noise_scale, self.length_scale, self.noise_w)

    @property
    def scripts(self) -> tuple[str, ...]:
        """Unicode script names (as letter names begin) this voice speaks."""
        family = self.espeak_voice.split("-")[0].lower()
        return _SCRIPTS_BY_FAMILY.get(family, ("LATIN",))

    @classmethod
    def from_json(cls, doc: object, *, source: str = "voice config") -> VoiceConfig:
        """Parse Piper's voice config document (or the subset :meth:`to_json` writes)."""
        if not isinstance(doc, Mapping):
            raise VoiceConfigError("must be a JSON object (Piper's .onnx.json)", file=source)
        phoneme_type = doc.get("phoneme_type", "espeak")
        if phoneme_type != "espeak":
            raise VoiceConfigError(
                f"phoneme_type {phoneme_type!r} is not supported; accepted: 'espeak'",
                file=source,
                key="phoneme_type",
            )
        speakers = doc.get("num_speakers", 1)
        if speakers != 1:
            raise VoiceConfigError(
                f"num_speakers {speakers!r}: only single-speaker voices are supported; accepted: 1",
                file=source,
                key="num_speakers",
            )
        audio = _field(doc, "audio", Mapping, source)
        espeak = _field(doc, "espeak", Mapping, source)
        inference = doc.get("inference", {})
        if not isinstance(inference, Mapping):
            raise VoiceConfigError("must be an object", file=source, key="inference")
        sample_rate = _positive_int(audio.get("sample_rate"), source, "audio.sample_rate")
        voice = espeak.get("voice")
        if not isinstance(voice, str) or not voice:
            raise VoiceConfigError(
                f"{voice!r} is not an espeak-ng voice name; accepted: e.g. 'en-us'",
                file=source,
                key="espeak.voice",
            )
        id_map = _parse_id_map(doc.get("phoneme_id_map"), source)
        clusters = doc.get("vowel_clusters") or []
        if not isinstance(clusters, list) or not all(
            isinstance(c, list) and c and all(isinstance(p, str) for p in c) for c in clusters
        ):
            raise VoiceConfigError(
                "must be a list of lists of phonemes", file=source, key="vowel_clusters"
            )
        language = doc.get("language", {})
        code = language.get("code", "") if isinstance(language, Mapping) else language
        return cls(
            sample_rate=sample_rate,
            espeak_voice=voice,
            phoneme_id_map=id_map,
            noise_scale=_scale(inference.get("noise_scale", 0.667), source, "noise_scale"),
            length_scale=_scale(inference.get("length_scale", 1.0), source, "length_scale"),
            noise_w=_scale(inference.get("noise_w", 0.8), source, "noise_w"),
            hop_length=_positive_int(doc.get("hop_length", 256), source, "hop_length"),
            language=str(code or ""),
            vowel_clusters=frozenset(tuple(c) for c in clusters),
        )

    @classmethod
    def load(cls, path: Path) -> VoiceConfig:
        """Read and parse a voice config file."""
        try:
            doc = json.loads(Path(path).read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise VoiceConfigError(
                f"cannot be read as UTF-8 JSON ({exc}); accepted: Piper's .onnx.json voice config",
                file=str(path),
            ) from None
        return cls.from_json(doc, source=str(path))

    def to_json(self) -> dict[str, Any]:
        """The config in Piper's layout (readable by :meth:`from_json`)."""
        doc: dict[str, Any] = {
            "audio": {"sample_rate": self.sample_rate},
            "espeak": {"voice": self.espeak_voice},
            "phoneme_type": "espeak",
            "num_speakers": 1,
            "inference": {
                "noise_scale": self.noise_scale,
                "length_scale": self.length_scale,
                "noise_w": self.noise_w,
            },
            "hop_length": self.hop_length,
            "language": {"code": self.language},
            "phoneme_id_map": {key: list(ids) for key, ids in self.phoneme_id_map.items()},
        }
        if self.vowel_clusters:
            doc["vowel_clusters"] = [list(c) for c in sorted(self.vowel_clusters)]
        return doc


def _field(doc: Mapping[str, Any], key: str, kind: type, source: str) -> Any:
    value = doc.get(key)
    if not isinstance(value, kind):
        raise VoiceConfigError(f"is missing or not an object (got {value!r})", file=source, key=key)
    return value


def _positive_int(value: object, source: str, key: str) -> int:
    if type(value) is not int or value <= 0:
        raise VoiceConfigError(
            f"{value!r} is not a positive integer; accepted: e.g. 22050", file=source, key=key
        )
    return value


def _scale(value: object, source: str, key: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
        raise VoiceConfigError(
            f"{value!r} is not a non-negative number", file=source, key=f"inference.{key}"
        )
    return float(value)


def _parse_id_map(raw: object, source: str) -> Mapping[str, tuple[int, ...]]:
    key = "phoneme_id_map"
    if not isinstance(raw, Mapping) or not raw:
        raise VoiceConfigError("must be a non-empty object of phoneme: [ids]", file=source, key=key)
    out: dict[str, tuple[int, ...]] = {}
    for phoneme, ids in raw.items():
        if (
            not isinstance(phoneme, str)
            or not isinstance(ids, list)
            or not ids
            or not all(type(i) is int and i >= 0 for i in ids)
        ):
            raise VoiceConfigError(
                f"entry {phoneme!r}: {ids!r} is not a non-empty list of non-negative ids",
                file=source,
                key=key,
            )
        out[phoneme] = tuple(ids)
    missing = [symbol for symbol in (BOS, EOS, PAD) if symbol not in out]
    if missing:
        raise VoiceConfigError(
            f"lacks the markers {missing}; accepted: a map holding {BOS!r}, {EOS!r} and {PAD!r}",
            file=source,
            key=key,
        )
    return MappingProxyType(out)


# -- normalization -----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SkippedText:
    """Input the voice will not speak. ``offset`` indexes the NFC-normalized input text
    (None for phonemes the voice lacks); ``reason`` is one of the ``SKIP_*`` codes."""

    text: str
    reason: str
    detail: str
    offset: int | None

    def to_json(self) -> dict[str, Any]:
        return {
            "text": self.text,
            "reason": self.reason,
            "detail": self.detail,
            "offset": self.offset,
        }


@dataclass(frozen=True, slots=True)
class NormalizedText:
    """Text ready for espeak-ng and what was left out of it."""

    text: str
    skipped: tuple[SkippedText, ...]


def _is_emoji(code: int) -> bool:
    return any(low <= code <= high for low, high in _EMOJI_RANGES)


def _letter_script(ch: str) -> str:
    """The script a letter belongs to, as its Unicode name begins (``LATIN``, ``CYRILLIC``)."""
    code = ord(ch)
    if code < 0x0250 or 0x1D00 <= code <= 0x1EFF or 0x02B0 <= code <= 0x02FF:
        return "LATIN"
    name = unicodedata.name(ch, "")
    if name.startswith("MODIFIER LETTER"):
        return "LATIN"
    return name.split(" ", 1)[0] if name else "UNKNOWN"


def _script_label(script: str) -> str:
    """``LATIN`` -> ``Latin``; short names such as ``CJK`` stay as they are."""
    return script if len(script) <= 3 else script.title()


def _classify(ch: str, scripts: Sequence[str], after_letter: bool) -> tuple[str, str] | None:
    """``(reason, detail)`` when a character is skipped; None when it is kept."""
    category = unicodedata.category(ch)
    code = ord(ch)
    if _is_emoji(code):
        return SKIP_EMOJI, "emoji and pictographs are not spoken"
    if category == "Cc":
        return SKIP_CONTROL, "control characters are not spoken"
    if category in ("Cs", "Co", "Cn"):
        return SKIP_CHARACTER, "unassigned, private-use or surrogate code points are not spoken"
    if category[0] == "L":
        script = _letter_script(ch)
        if script not in scripts:
            return SKIP_SCRIPT, (
                f"{_script_label(script)} letters are not spoken by this voice (it speaks "
                f"{', '.join(_script_label(s) for s in scripts)})"
            )
    elif category[0] == "M" and not after_letter:
        return SKIP_SCRIPT, "combining marks without a letter of the voice's script"
    return None


class _Builder:
    """Collects kept characters with collapsed whitespace and merged skipped runs."""

    def __init__(self, text: str) -> None:
        self.source = text
        self.out: list[str] = []
        self.pending_space = False
        self.pending_newlines = 0
        self.skipped: list[SkippedText] = []
        self.run: tuple[str, str, int, int] | None = None  # reason, detail, start, end

    def space(self, newlines: int) -> None:
        self.pending_space = True
        self.pending_newlines += newlines

    def skip(self, index: int, reason: str, detail: str) -> None:
        run = self.run
        if run is not None and run[0] == reason:
            self.run = (reason, run[1], run[2], index + 1)
        else:
            self.close_run()
            self.run = (reason, detail, index, index + 1)
        self.pending_space = True

    def close_run(self) -> None:
        if self.run is not None:
            reason, detail, start, end = self.run
            self.skipped.append(SkippedText(self.source[start:end], reason, detail, start))
            self.run = None

    def keep(self, ch: str) -> None:
        self.close_run()
        if self.pending_space and self.out:
            self.out.append("\n" if self.pending_newlines >= 2 else " ")
        self.pending_space = False
        self.pending_newlines = 0
        self.out.append(ch)

    def result(self) -> NormalizedText:
        self.close_run()
        return NormalizedText("".join(self.out), tuple(self.skipped))


def normalize_for_speech(text: str, scripts: Sequence[str] = ("LATIN",)) -> NormalizedText:
    """Normalize text for espeak-ng and report what was skipped (see the module policy)."""
    text = unicodedata.normalize("NFC", text)
    builder = _Builder(text)
    after_letter = False
    for index, ch in enumerate(text):
        category = unicodedata.category(ch)
        if ch.isspace():
            builder.space(_NEWLINES.get(ch, 0))
            after_letter = False
            continue
        if category == "Cf" or 0xFE00 <= ord(ch) <= 0xFE0F:
            # Invisible; between two skipped characters it stays inside their skipped run.
            continue
        skipped = _classify(ch, scripts, after_letter)
        if skipped is not None:
            builder.skip(index, *skipped)
            after_letter = False
            continue
        if category == "Nd" and not ch.isascii():
            ch = str(unicodedata.decimal(ch))
        after_letter = category[0] in ("L", "M")
        builder.keep(ch)
    return builder.result()


def normalize_text(text: str) -> str:
    """:func:`normalize_for_speech` for a Latin-script voice, returning only the text."""
    return normalize_for_speech(text).text


# -- sentence splitting ------------------------------------------------------------------


def split_sentences(
    text: str, max_length: int, *, measure: Callable[[str], int] = len, join_cost: int = 1
) -> list[str]:
    """Split normalized text into sentences whose ``measure`` is at most ``max_length``.

    ``measure`` defaults to characters; :func:`prepare_speech` measures the phoneme ids of the
    longest espeak-ng sentence, so every utterance fits an acoustic bucket. Over-long sentences
    are split at clause punctuation, then spaces, then characters: units are packed by the sum
    of their own measures plus ``join_cost`` per join (1 for characters; -1 for ids, as joined
    units share one BOS/PAD/EOS and add a space and its pad), and each packed piece is measured
    again and shrunk while it does not fit.
    """
    if max_length < 1:
        raise ValueError(f"max_length {max_length} must be at least 1")
    splitter = _Splitter(max_length, measure, join_cost)
    pieces: list[str] = []
    for paragraph in text.split("\n"):
        for sentence in _sentences(paragraph):
            if measure(sentence) <= max_length:
                pieces.append(sentence)
            else:
                pieces.extend(splitter.split(sentence, level=0))
    return pieces


def _sentences(paragraph: str) -> list[str]:
    found: list[str] = []
    start = 0
    for match in _SENTENCE_END.finditer(paragraph):
        found.append(paragraph[start : match.end("end")].strip())
        start = match.end()
    found.append(paragraph[start:].strip())
    return [sentence for sentence in found if sentence]


@dataclass(frozen=True, slots=True)
class _Splitter:
    limit: int
    measure: Callable[[str], int]
    join_cost: int

    def split(self, text: str, *, level: int) -> list[str]:
        """Pack clauses (level 0) or words (level 1); halve a single word (level 2)."""
        if level >= 2:
            if len(text) <= 1 or self.measure(text) <= self.limit:
                return [text]
            middle = len(text) // 2
            return [*self.split(text[:middle], level=2), *self.split(text[middle:], level=2)]
        pattern = _CLAUSE_END if level == 0 else _SPACES
        units = [unit.strip() for unit in pattern.split(text) if unit.strip()]
        sizes = [self.measure(unit) for unit in units]
        pieces: list[str] = []
        index = 0
        while index < len(units):
            if sizes[index] > self.limit:
                pieces.extend(self.split(units[index], level=level + 1))
                index += 1
                continue
            stop = index + 1
            estimate = sizes[index]
            while stop < len(units):
                estimate += sizes[stop] + self.join_cost
                if sizes[stop] > self.limit or estimate > self.limit:
                    break
                stop += 1
            while stop > index + 1 and self.measure(" ".join(units[index:stop])) > self.limit:
                stop -= 1
            pieces.append(" ".join(units[index:stop]))
            index = stop
        return pieces


# -- phonemes ----------------------------------------------------------------------------


@contextmanager
def _espeak_voice(voice: str) -> Iterator[None]:
    """Hold the process-wide espeak-ng (its state is global) with ``voice`` selected."""
    with _ESPEAK_LOCK:
        if not _ESPEAK_READY:
            espeakbridge.initialize(str(ESPEAK_DATA_DIR))
            _ESPEAK_READY.append(True)
        try:
            espeakbridge.set_voice(voice)
        except RuntimeError as exc:
            raise VoiceConfigError(
                f"espeak-ng has no voice {voice!r} ({exc}); accepted: a voice in {ESPEAK_DATA_DIR}",
                key="espeak.voice",
            ) from None
        yield


def _phonemize_selected(text: str, clusters: frozenset[tuple[str, ...]]) -> list[list[str]]:
    """Piper's espeak-ng phonemization (``EspeakPhonemizer.phonemize`` then dropping a final
    empty sentence, as ``PiperVoice.phonemize`` does) with the voice already selected."""
    sentences: list[list[str]] = []
    current: list[str] = []
    for phonemes, terminator, end_of_sentence in espeakbridge.get_phonemes(text):
        # Language-switch flags such as "(fr)" surround words of another language.
        phonemes = _LANGUAGE_FLAG.sub("", phonemes) + terminator
        if terminator in (",", ":", ";"):
            phonemes += " "
        current.extend(unicodedata.normalize("NFD", phonemes))
        if end_of_sentence:
            sentences.append(_merge_vowel_clusters(current, clusters))
            current = []
    if current:
        sentences.append(_merge_vowel_clusters(current, clusters))
    if sentences and not sentences[-1]:
        sentences.pop()
    return sentences


def _merge_vowel_clusters(phones: list[str], clusters: frozenset[tuple[str, ...]]) -> list[str]:
    """Piper's ``_merge_known_vowel_clusters``: join known adjacent vowels into one phoneme."""
    if not clusters:
        return phones
    longest = max(len(cluster) for cluster in clusters)
    out: list[str] = []
    index = 0
    while index < len(phones):
        match: tuple[str, ...] | None = None
        for size in range(min(longest, len(phones) - index), 1, -1):
            candidate = tuple(phones[index : index + size])
            if candidate in clusters:
                match = candidate
                break
        if match is None:
            out.append(phones[index])
            index += 1
        else:
            out.append("".join(match))
            index += len(match)
    return out


@dataclass(frozen=True, slots=True)
class PhonemeIds:
    """One sentence's phoneme ids and the phonemes the voice's id map lacks (left out)."""

    ids: tuple[int, ...]
    missing: tuple[str, ...]


class Phonemizer:
    """Text -> phonemes (Piper's espeak-ng) -> ids (the voice's ``phoneme_id_map``).

    espeak-ng keeps global state, so every call holds one process-wide lock.
    """

    def __init__(self, config: VoiceConfig) -> None:
        self.config = config

    @contextmanager
    def selected(self) -> Iterator[Callable[[str], list[list[str]]]]:
        """Hold espeak-ng with this voice for many calls; yields the phonemize function."""
        clusters = self.config.vowel_clusters
        with _espeak_voice(self.config.espeak_voice):
            yield lambda text: _phonemize_selected(text, clusters)

    def phonemize(self, text: str) -> list[list[str]]:
        """Phonemes per sentence, as ``PiperVoice.phonemize`` returns them."""
        with self.selected() as phonemize:
            return phonemize(text)

    def phoneme_ids(self, phonemes: Sequence[str]) -> PhonemeIds:
        """Ids as ``piper.phoneme_ids.phonemes_to_ids``: BOS PAD (phoneme PAD)* EOS."""
        id_map = self.config.phoneme_id_map
        pad = id_map[PAD]
        ids: list[int] = [*id_map[BOS], *pad]
        missing: list[str] = []
        for phoneme in phonemes:
            mapped = id_map.get(phoneme)
            if mapped is None:
                missing.append(phoneme)
                continue
            ids.extend(mapped)
            ids.extend(pad)
        ids.extend(id_map[EOS])
        return PhonemeIds(tuple(ids), tuple(missing))

    def ids(self, text: str) -> list[tuple[int, ...]]:
        """Phoneme ids per sentence of ``text`` (no normalization or splitting)."""
        return [self.phoneme_ids(sentence).ids for sentence in self.phonemize(text)]


# -- the plan ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Utterance:
    """One acoustic call's worth of speech: an espeak-ng sentence of a text piece."""

    text: str
    phonemes: tuple[str, ...]
    ids: tuple[int, ...]

    def to_json(self) -> dict[str, Any]:
        return {"text": self.text, "phonemes": "".join(self.phonemes), "ids": list(self.ids)}


@dataclass(frozen=True, slots=True)
class SpeechPlan:
    """What will be spoken, in order, and what was left out and why."""

    text: str
    sentences: tuple[Utterance, ...]
    skipped: tuple[SkippedText, ...]
    max_ids: int

    @property
    def total_ids(self) -> int:
        return sum(len(sentence.ids) for sentence in self.sentences)

    def to_json(self) -> dict[str, Any]:
        return {
            "text": self.text,
            "max_ids": self.max_ids,
            "sentences": [sentence.to_json() for sentence in self.sentences],
            "skipped": [item.to_json() for item in self.skipped],
        }


def _describe_skipped(skipped: Sequence[SkippedText]) -> str:
    if not skipped:
        return ""
    kinds = sorted({item.reason for item in skipped})
    return f" (skipped: {', '.join(kinds)})"


def prepare_speech(
    text: object, voice: VoiceConfig | Phonemizer, *, max_ids: int = DEFAULT_MAX_IDS
) -> SpeechPlan:
    """Normalize, split and phonemize ``text`` so every utterance fits ``max_ids`` ids.

    Raises :class:`SpeechInputError` for non-text, empty, whitespace-only, over-long
    (:data:`MAX_TEXT_CHARS`) and nothing-speakable input; skipped parts are in the plan.
    """
    phonemizer = voice if isinstance(voice, Phonemizer) else Phonemizer(voice)
    if not isinstance(text, str):
        raise SpeechInputError(
            f"speech input must be a string; got {type(text).__name__}", code="not_text"
        )
    if not text:
        raise SpeechInputError(
            "the text is empty; accepted: text with words to speak", code="empty"
        )
    if len(text) > MAX_TEXT_CHARS:
        raise SpeechInputError(
            f"the text has {len(text)} characters; accepted: at most {MAX_TEXT_CHARS} per "
            "request (send longer texts in parts)",
            code="too_long",
        )
    if not text.strip():
        raise SpeechInputError(
            f"the text is only whitespace ({len(text)} characters); accepted: text with words "
            "to speak",
            code="whitespace_only",
        )
    smallest = _smallest_ids(phonemizer)
    if max_ids < smallest:
        raise ValueError(f"max_ids {max_ids} is below {smallest}, the ids of one phoneme")
    normalized = normalize_for_speech(text, phonemizer.config.scripts)
    skipped = list(normalized.skipped)
    sentences: list[Utterance] = []
    with phonemizer.selected() as phonemize:
        cache: dict[str, list[list[str]]] = {}

        def phonemes_of(piece: str) -> list[list[str]]:
            found = cache.get(piece)
            if found is None:
                if len(cache) > 256:
                    cache.clear()
                found = cache[piece] = phonemize(piece)
            return found

        def measure(piece: str) -> int:
            return max((len(phonemizer.phoneme_ids(s).ids) for s in phonemes_of(piece)), default=0)

        pieces = split_sentences(normalized.text, max_ids, measure=measure, join_cost=-1)
        for piece in pieces:
            for phonemes in phonemes_of(piece):
                mapped = phonemizer.phoneme_ids(phonemes)
                for phoneme in dict.fromkeys(mapped.missing):
                    skipped.append(
                        SkippedText(
                            phoneme,
                            SKIP_PHONEME,
                            f"espeak-ng phoneme {phoneme!r} is not in the voice's phoneme_id_map",
                            None,
                        )
                    )
                if len(mapped.ids) > max_ids:
                    raise SpeechInputError(
                        f"{piece[:40]!r} needs {len(mapped.ids)} phoneme ids even when split "
                        f"to single characters; accepted: at most {max_ids}",
                        code="does_not_fit",
                    )
                sentences.append(Utterance(piece, tuple(phonemes), mapped.ids))
    if not sentences:
        raise SpeechInputError(
            "nothing in the text can be spoken by this voice"
            f"{_describe_skipped(skipped)}; accepted: words in "
            f"{', '.join(_script_label(s) for s in phonemizer.config.scripts)} script",
            code="nothing_speakable",
        )
    return SpeechPlan(
        text=normalized.text, sentences=tuple(sentences), skipped=tuple(skipped), max_ids=max_ids
    )


def _smallest_ids(phonemizer: Phonemizer) -> int:
    id_map = phonemizer.config.phoneme_id_map
    widest = max(len(ids) for ids in id_map.values())
    return len(id_map[BOS]) + 2 * len(id_map[PAD]) + widest + len(id_map[EOS])
