"""The built-in speech recogniser against faster-whisper on many and on long clips (``make slow``).

Every one of :data:`~tests.runtime.adapters.test_whisper.SENTENCES` spoken by the bundled voice
gives faster-whisper's tokens and text (float32, greedy, no timestamps, same weights); clips of
about 45 s, 100 s and 180 s of varied sentences with pauses of varied length, transcribed in
30 s windows each prompted with the text before it, have a word error rate against the spoken
text within 0.01 of faster-whisper's on the same clip.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pytest

from benchmarks.speech_in import wer
from runtime.adapters.whisper_export import export_missing_recognisers, spoken_clips
from runtime.config import load_pipeline
from tests.runtime.adapters.test_whisper import (
    PIPELINE,
    SENTENCES,
    pipeline_transcripts,
    reference_transcripts,
    spoken_clip,
)

if TYPE_CHECKING:
    from collections.abc import Iterator, Sequence

    from runtime.config import PipelineConfig

#: Minutes each on a busy machine: the export, the voice, three minutes of audio twice.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

RATE = 16000

#: More sentences for the long clips, so that three minutes do not repeat: numbers, dates,
#: names and places, questions and exclamations, short and long.
MORE_SENTENCES = (
    "Good morning, everyone, and welcome to the quarterly review.",
    "Flight 2417 to Buenos Aires has been delayed by forty minutes.",
    "Did you remember to lock the back door before we left?",
    "Amelia Hartley won the regional chess championship at the age of fourteen.",
    "The library opens at eight and closes at nine, except on Sundays.",
    "Our new office is on the fifth floor of 230 Park Avenue.",
    "How many apples are left in the basket on the kitchen table?",
    "Thank you!",
    "The population of the town doubled between 1990 and 2010.",
    "Samuel and Priya are driving up to Vancouver next weekend.",
    "Mix the paint slowly, or the colour will come out uneven.",
    "What time does the last bus leave for the airport?",
    "The package weighs about six kilograms and measures forty centimetres across.",
    "Captain Rivera ordered the crew to raise the sails at dawn.",
    "Honestly, I think the second option is cheaper in the long run.",
    "The museum displays more than three thousand paintings from the nineteenth century.",
    "Where did you put the spare keys for the garage?",
    "Elena Petrova teaches mathematics at a small school near Vienna.",
    "Please send the signed contract back to us by the end of the month.",
    "Our team scored two goals in the first half and one in the second.",
    "A gentle breeze carried the smell of fresh bread down the street.",
    "Could we move the call to Wednesday afternoon instead?",
    "The bridge is eleven hundred meters long and took six years to build.",
    "Doctor Okafor said the results would be ready on Monday.",
    "Every spring, the garden fills with tulips, daffodils and roses.",
    "The temperature dropped to minus fifteen degrees last night.",
    "Would you like tea or coffee with your breakfast?",
    "Mount Everest is the highest mountain on Earth, at nearly nine thousand meters.",
    "Our son Thomas just started his first year at university in Manchester.",
    "Turn off the lights when you leave the room.",
    "The store sold four hundred and twenty umbrellas during the rainy week.",
    "Is the museum open on public holidays, or only on weekdays?",
    "Lucia painted the fence green, and her brother painted the gate blue.",
    "The old clock in the hall strikes twelve times at midnight.",
    "Wait for me at the corner of Baker Street and Oxford Road.",
    "Nobody expected the small company to grow so quickly.",
    "The ticket costs nineteen dollars for adults and nine for children.",
    "Why is the sky blue during the day and red at sunset?",
    "Jonathan forgot his umbrella, so he arrived at work soaking wet.",
    "The river flows for about two thousand kilometres before it reaches the sea.",
    "Remember to water the plants while we are away.",
    "Sophie found an old map of Amsterdam in her grandfather's attic.",
    "Which of these three jackets do you like best?",
    "The concert starts at half past seven, so let's meet at seven.",
    "Careful, the floor is still wet!",
)

#: The spoken sentences each long clip draws from (the short ones first, then the longer
#: ones), each sentence at most once in a clip.
POOL = SENTENCES + MORE_SENTENCES

#: (target seconds, first sentence in the pool, seed of the pauses); each clip ends at most
#: at its target, so the longest stays within three minutes.
LONG_CLIPS = ((45.0, 20, 1), (100.0, 0, 2), (180.0, 10, 3))


@pytest.fixture(scope="module")
def config(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PipelineConfig]:
    """The transcription pipeline, its recogniser exported into a temporary data folder."""
    root = tmp_path_factory.mktemp("whisper-data")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("OMNI_EDGE_DATA_DIR", str(root))
        assert export_missing_recognisers(PIPELINE, lambda _line: None) == ["tiny.en"]
        yield load_pipeline(PIPELINE)


def compose(
    spoken: Sequence[np.ndarray], texts: Sequence[str], seconds: float, start: int, seed: int
) -> tuple[np.ndarray, str]:
    """Sentences from ``start`` on (wrapping around), each followed by 0.15-1.5 s of silence,
    as long as the clip stays within ``seconds``; the audio and the text it speaks."""
    rng = np.random.default_rng(seed)
    parts: list[np.ndarray] = []
    said: list[str] = []
    length = 0
    for step in range(len(texts)):
        index = (start + step) % len(texts)
        pause = np.zeros(int(rng.uniform(0.15, 1.5) * RATE), np.float32)
        if length + spoken[index].size + pause.size > seconds * RATE:
            break
        parts += [spoken[index], pause]
        said.append(texts[index])
        length += spoken[index].size + pause.size
    return np.concatenate(parts), " ".join(said)


@pytest.fixture(scope="module")
def long_clips() -> list[tuple[np.ndarray, str]]:
    """The clips of :data:`LONG_CLIPS` with the text each speaks."""
    spoken = spoken_clips(POOL)
    return [compose(spoken, POOL, *clip) for clip in LONG_CLIPS]


def test_long_clips_have_the_word_error_rate_of_faster_whisper(
    config: PipelineConfig, long_clips: list[tuple[np.ndarray, str]]
) -> None:
    """Per clip, |WER(pipeline) - WER(faster-whisper)| <= 0.01, both against the spoken text."""
    clips = [audio for audio, _ in long_clips]
    for audio, (target, *_) in zip(clips, LONG_CLIPS, strict=True):
        assert target - 10 < audio.size / RATE <= target
    theirs = reference_transcripts(clips)
    ours = pipeline_transcripts(config, clips)
    failures = []
    for (audio, said), (tokens, text, metrics), (ref_tokens, ref_text) in zip(
        long_clips, ours, theirs, strict=True
    ):
        seconds = audio.size / RATE
        ours_wer, theirs_wer = wer([said], [text]), wer([said], [ref_text])
        same = "equal" if tokens == ref_tokens else "differ"
        line = (
            f"{seconds:.1f} s, {metrics['windows']} windows: WER {ours_wer:.4f} ours, "
            f"{theirs_wer:.4f} faster-whisper; tokens {same}"
        )
        print(line)
        # 30 s windows of 10 ms frames, the last one short.
        assert metrics["windows"] == -(-(audio.size // 160) // 3000)
        if abs(ours_wer - theirs_wer) > 0.01:
            failures.append(f"{line}\n  ours {text!r}\n  ref  {ref_text!r}")
    assert not failures, "\n".join(failures)


def test_every_sentence_gives_the_tokens_of_faster_whisper(config: PipelineConfig) -> None:
    """All 20 clips under 30 s: the same tokens and text as faster-whisper, none empty."""
    clips = [spoken_clip(sentence) for sentence in SENTENCES]
    theirs = reference_transcripts(clips)
    ours = pipeline_transcripts(config, clips)
    differ = [
        f"{sentence!r}\n  ours {text!r}\n  ref  {ref_text!r}"
        for sentence, (tokens, text, _), (ref_tokens, ref_text) in zip(
            SENTENCES, ours, theirs, strict=True
        )
        if tokens != ref_tokens or text != ref_text or not ref_tokens
    ]
    assert not differ, f"{len(differ)} of {len(SENTENCES)} clips differ:\n" + "\n".join(differ)
