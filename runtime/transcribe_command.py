"""The ``transcribe`` and ``model`` commands of ``omni-edge``: speech to text from an audio file
or standard input, and the built-in models made on first use.

``omni-edge transcribe FILE|- [PIPELINE]`` reads the audio block by block
(:func:`~runtime.audio.reader.open_audio`: any format libsndfile reads, any rate and channel
count, to 16 kHz mono with soxr), computes Whisper's features as the blocks arrive into an
anonymous temporary file (:func:`~runtime.adapters.whisper_stream.spool_stream`, 32 KB a
second), then runs the pipeline (``assets/pipelines/transcribe.yaml`` by default), which reads
each 30 s window back as it comes to it, and prints each window's segment as it finishes: a
two-hour file needs the memory of one window, not of its audio or features. Bad audio is
refused, naming the file and what is accepted, before any worker starts. For audio over a
minute, progress goes to stderr as the other commands' does (``omni-edge: read 41:00 of
2:00:00`` while reading, then ``omni-edge: transcribed 12:30 of 2:00:00`` after every window);
stdout holds only the transcript.

The command line registers both with :func:`add_transcribe_commands`; each handler returns an
exit code and lets :class:`~runtime.errors.OmniError` reach the caller, which prints it.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Final

from runtime.command_args import say
from runtime.errors import EXIT_OK, UsageError

if TYPE_CHECKING:
    import argparse
    from collections.abc import Callable

__all__ = [
    "FORMATS",
    "TranscriptSegment",
    "add_transcribe_commands",
    "clock",
    "format_document",
]

#: ``timed``: one line per segment with its times (the default); the rest are OpenAI's
#: ``response_format`` values.
FORMATS: Final = ("timed", "text", "json", "verbose_json", "srt", "vtt")
#: Audio at least this long reports progress on stderr.
PROGRESS_FROM_S: Final = 60.0
#: Seconds between two progress lines.
PROGRESS_EVERY_S: Final = 2.0
#: The recognisers ``omni-edge model`` makes, by name.
RECOGNISERS: Final = {"whisper-tiny.en": "tiny.en"}


def clock(seconds: float, *, style: str = "short") -> str:
    """``seconds`` as ``12:30`` / ``2:00:00`` (short), ``00:12:30,500`` (srt) or
    ``00:12:30.500`` (vtt, timed)."""
    millis = max(0, round(seconds * 1000))
    hours, rest = divmod(millis, 3_600_000)
    minutes, rest = divmod(rest, 60_000)
    secs, millis = divmod(rest, 1000)
    if style == "short":
        return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"
    mark = "," if style == "srt" else "."
    return f"{hours:02d}:{minutes:02d}:{secs:02d}{mark}{millis:03d}"


@dataclass(frozen=True, slots=True)
class TranscriptSegment:
    """One finished segment: its index, times in seconds, text and tokens."""

    index: int
    start: float
    end: float
    text: str
    tokens: tuple[int, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.index,
            "start": round(self.start, 3),
            "end": round(self.end, 3),
            "text": self.text,
            "tokens": list(self.tokens),
        }


def _cue_text(text: str) -> str:
    # A blank line ends a cue in SRT and WebVTT; "-->" inside a cue's text confuses readers.
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return "\n".join(lines).replace("-->", "->") or "..."


def format_segment(fmt: str, segment: TranscriptSegment) -> str:
    """What ``fmt`` prints for one segment as it finishes ('' for the whole-document formats)."""
    if fmt == "timed":
        start, end = clock(segment.start, style="vtt"), clock(segment.end, style="vtt")
        return f"[{start} --> {end}]  {segment.text.strip()}\n"
    if fmt == "text":
        return segment.text.strip() + "\n"
    if fmt == "srt":
        start, end = clock(segment.start, style="srt"), clock(segment.end, style="srt")
        return f"{segment.index + 1}\n{start} --> {end}\n{_cue_text(segment.text)}\n\n"
    if fmt == "vtt":
        start, end = clock(segment.start, style="vtt"), clock(segment.end, style="vtt")
        return f"{start} --> {end}\n{_cue_text(segment.text)}\n\n"
    return ""


def format_header(fmt: str) -> str:
    return "WEBVTT\n\n" if fmt == "vtt" else ""


def format_document(
    fmt: str, segments: list[TranscriptSegment], *, text: str, duration: float, model: str
) -> str:
    """The whole transcript in ``fmt`` (see :data:`FORMATS`)."""
    if fmt == "json":
        return json.dumps({"text": text.strip()}, ensure_ascii=False) + "\n"
    if fmt == "verbose_json":
        document = {
            "task": "transcribe",
            "language": "english",
            "duration": round(duration, 3),
            "text": text.strip(),
            "model": model,
            "segments": [segment.to_json() for segment in segments],
        }
        return json.dumps(document, ensure_ascii=False, indent=2) + "\n"
    return format_header(fmt) + "".join(format_segment(fmt, segment) for segment in segments)


class _Progress:
    """Progress lines on stderr, at most one every :data:`PROGRESS_EVERY_S` seconds."""

    def __init__(self, verb: str, total_s: float | None, write: Callable[[str], None]) -> None:
        self.verb = verb
        self.total_s = total_s
        self.write = write
        self.enabled = total_s is None or total_s >= PROGRESS_FROM_S
        self.last = time.monotonic()
        self.shown = ""

    def __call__(self, done_s: float, *, force: bool = False) -> None:
        now = time.monotonic()
        if not self.enabled or (not force and now - self.last < PROGRESS_EVERY_S):
            return
        total = "" if self.total_s is None else f" of {clock(self.total_s)}"
        line = f"{self.verb} {clock(done_s)}{total}"
        if line != self.shown:
            self.last, self.shown = now, line
            self.write(line)


class _Output:
    """Where the transcript goes: stdout as it comes, or a file that appears complete."""

    def __init__(self, out: Path | None) -> None:
        self.out = out
        self.stream: IO[str] = sys.stdout
        self.temp: Path | None = None
        if out is not None:
            handle, name = tempfile.mkstemp(prefix=f".{out.name}.", suffix=".part", dir=out.parent)
            self.temp = Path(name)
            self.stream = os.fdopen(handle, "w", encoding="utf-8")

    def write(self, text: str) -> None:
        if text:
            self.stream.write(text)
            self.stream.flush()

    def commit(self) -> None:
        if self.temp is not None and self.out is not None:
            self.stream.close()
            os.replace(self.temp, self.out)
            self.temp = None

    def discard(self) -> None:
        if self.temp is not None:
            self.stream.close()
            self.temp.unlink(missing_ok=True)
            self.temp = None


def _checked_out(text: str | None) -> Path | None:
    if text is None:
        return None
    out = Path(text)
    if out.is_dir() or not out.parent.is_dir():
        raise UsageError(
            f"--out {out}: accepted: a file in an existing folder"
            + ("" if out.parent.is_dir() else f" ({out.parent} does not exist)")
        )
    return out


def cmd_transcribe(args: argparse.Namespace) -> int:
    from runtime.adapters.whisper import TranscribeAdapter
    from runtime.adapters.whisper_export import export_missing_recognisers
    from runtime.adapters.whisper_stream import spool_stream
    from runtime.api import PipelineSession
    from runtime.assets import demo_pipeline
    from runtime.audio.reader import TARGET_RATE, open_audio

    fmt = args.format
    out = _checked_out(args.out)
    pipeline = Path(args.pipeline) if args.pipeline else demo_pipeline("transcribe")
    # The recogniser is made on first use, before its manifests load.
    export_missing_recognisers(pipeline, say)
    # Nothing loads yet: the session reads the pipeline and makes its program.
    session = PipelineSession(pipeline)
    config = session.config
    limit = session.options.max_audio_s
    if session.kind != "transcribe" or limit is None or config.adapter is None:
        raise UsageError(
            f"pipeline {config.pipeline} ({pipeline}) does not transcribe; accepted: a pipeline "
            "whose adapter is runtime.adapters.whisper:TranscribeAdapter (e.g. "
            "assets/pipelines/transcribe.yaml)"
        )
    # The recogniser's bundles: the features the audio is read into, the model's name.
    bundles = TranscribeAdapter(config, config.adapter.options).bundles
    # Bad audio is refused here, before any worker starts; a copy of stdin goes with the stream.
    with open_audio(args.file, max_seconds=limit) as stream:
        total_s = stream.duration_s
        reading = _Progress("read", total_s, say)
        spooled = spool_stream(stream, bundles.n_mels, on_block=lambda n: reading(n / TARGET_RATE))
    seconds = spooled.seconds
    transcribing = _Progress("transcribed", seconds, say)
    # Told after every window, on the engine's thread, until the session below is closed.
    spooled.on_progress = lambda done, _total: transcribing(done)
    segments: list[TranscriptSegment] = []
    text = ""
    model = bundles.model_name
    streamed = fmt in ("timed", "text", "srt", "vtt")
    output = _Output(out)
    try:
        with spooled, session:
            output.write(format_header(fmt) if streamed else "")
            for result in session.submit(spooled):
                if result.finished:
                    text = result.text or ""
                    continue
                values = result.outputs
                segment = TranscriptSegment(
                    len(segments),
                    float(values["start_s"]),
                    float(values["end_s"]),
                    result.text or "",
                    tuple(int(token) for token in values["tokens"]),
                )
                segments.append(segment)
                if streamed:
                    output.write(format_segment(fmt, segment))
        if not streamed:
            output.write(format_document(fmt, segments, text=text, duration=seconds, model=model))
        output.commit()
    finally:
        output.discard()
    transcribing(seconds, force=True)
    if out is not None:
        say(f"wrote {len(segments)} segment(s) of {clock(seconds)} to {out}")
    return EXIT_OK


# -- omni-edge model -------------------------------------------------------------------


def _folder_size(root: Path) -> int:
    return sum(path.stat().st_size for path in root.rglob("*") if path.is_file())


def cmd_model_list(args: argparse.Namespace) -> int:
    from runtime.adapters.whisper_export import default_whisper_dir, load_whisper_bundles
    from runtime.errors import VerificationError

    rows: list[dict[str, Any]] = []
    for name, recogniser in RECOGNISERS.items():
        root = default_whisper_dir(recogniser)
        try:
            load_whisper_bundles(root)
            state = "made"
        except (VerificationError, OSError):
            state = "not made" if not root.exists() else "damaged (make it again)"
        size = _folder_size(root) if state == "made" else None
        rows.append(
            {
                "name": name,
                "kind": "speech recogniser",
                "state": state,
                "path": str(root),
                "bytes": size,
            }
        )
    if args.json:
        json.dump(rows, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return EXIT_OK
    for row in rows:
        shown = "" if row["bytes"] is None else f"\t{row['bytes'] / 1e6:.0f} MB"
        print(f"{row['name']}\t{row['kind']}\t{row['state']}\t{row['path']}{shown}")
    return EXIT_OK


def cmd_model_make(args: argparse.Namespace) -> int:
    from runtime.adapters.whisper_export import default_whisper_dir, ensure_whisper_bundles

    recogniser = RECOGNISERS.get(args.name)
    if recogniser is None:
        raise UsageError(f"model {args.name!r} is not built in; accepted: {', '.join(RECOGNISERS)}")
    root = default_whisper_dir(recogniser)
    bundles = ensure_whisper_bundles(recogniser, root, progress=say)
    print(f"{args.name}\t{bundles.model_name}\t{root}\t{_folder_size(root) / 1e6:.0f} MB")
    return EXIT_OK


def add_transcribe_commands(commands: Any) -> None:
    """Register ``transcribe`` and ``model`` on the command line's subparsers."""
    transcribe = commands.add_parser(
        "transcribe",
        help="transcribe an audio file (or - for standard input) with the speech recogniser",
    )
    transcribe.add_argument(
        "file", metavar="FILE|-", help="WAV, FLAC, OGG, MP3, ... at any rate; - reads stdin"
    )
    transcribe.add_argument(
        "pipeline",
        nargs="?",
        metavar="PIPELINE",
        help="a transcription pipeline (default: assets/pipelines/transcribe.yaml)",
    )
    transcribe.add_argument(
        "--format",
        choices=FORMATS,
        default="timed",
        help="timed lines (default), text, json, verbose_json, srt or vtt",
    )
    transcribe.add_argument(
        "--out", metavar="FILE", help="write the transcript to FILE (complete, or not at all)"
    )
    transcribe.set_defaults(handler=cmd_transcribe)

    model = commands.add_parser("model", help="list and make the built-in models")
    actions = model.add_subparsers(dest="model_command", required=True, metavar="ACTION")
    listing = actions.add_parser("list", help="the built-in models and whether they are made")
    listing.add_argument("--json", action="store_true", help="print JSON")
    listing.set_defaults(handler=cmd_model_list)
    make = actions.add_parser("make", help="make a built-in model now (it is made on first use)")
    make.add_argument("name", choices=tuple(RECOGNISERS), help="the model")
    make.set_defaults(handler=cmd_model_make)
