"""Buckets and chunk plans of an exported voice (pure; no model involved).

The acoustic call pads an utterance's phoneme ids to a bucket; the decoder is called on
windows of latent frames around each chunk it keeps, and the kept samples of each call join
into the utterance's audio.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

import numpy as np

if TYPE_CHECKING:
    from collections.abc import Sequence

#: Frames each decoder call keeps: a short first chunk for early audio (0.37 s of audio at
#: 22,050 Hz, enough lead for the next call to take most utterances' rest at once), then
#: larger ones up to the last size, as far as the player's lead pays for (see
#: ``SpeechAdapter``); with deterministic scales the sizes follow in order, the last repeating.
DEFAULT_SCHEDULE: Final = (32, 64, 128, 256, 512)
#: Context frames the export tries, smallest first; it keeps the smallest whose joins reach
#: ``CONTEXT_TARGET_SNR_DB`` against one whole decode on every validation sentence. The flow's
#: four coupling layers reach 32 frames each way; with the default schedule joe's joins reach
#: 67 dB at 20 frames and 28 dB at 16 (16-frame chunks needed 22).
CONTEXT_CANDIDATES: Final = (4, 8, 12, 16, 20, 22, 24, 28, 32)
#: Latent frames of context (left, right) when no measurement chose them.
DEFAULT_CONTEXT: Final = (32, 32)


def pick_bucket(size: int, buckets: Sequence[int]) -> int:
    """The smallest bucket holding ``size``; ValueError when none does."""
    fitting = [bucket for bucket in buckets if bucket >= size]
    if not fitting:
        raise ValueError(f"{size} does not fit any bucket of {sorted(buckets)}")
    return min(fitting)


def acoustic_inputs(
    ids: Sequence[int], buckets: Sequence[int], scales: Sequence[float], *, sized: bool = False
) -> dict[str, np.ndarray]:
    """The acoustic call for one utterance: ids zero-padded to the smallest fitting bucket, or
    (``sized``: routes that accept any length between the smallest and the largest bucket) to
    the smallest bucket only when shorter. Padding costs the text encoder as much as real ids."""
    bucket = pick_bucket(len(ids), buckets)
    if sized:
        bucket = max(len(ids), min(buckets))
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
    sized: bool = False,
) -> list[ChunkPlan]:
    """Plan the decoder calls for ``frames`` latent frames (pure; no model involved).

    Chunk ``i`` keeps ``schedule[i]`` frames (the last size repeats; the final chunk keeps the
    rest); each call is planned by :func:`plan_chunk`.
    """
    if type(frames) is not int or frames < 1:
        raise ValueError(f"frames {frames!r} must be a positive integer")
    _check_schedule(schedule, context)
    sizes = sorted(decoder_buckets(schedule, context) if buckets is None else buckets)
    plans: list[ChunkPlan] = []
    start = 0
    while start < frames:
        size = schedule[min(len(plans), len(schedule) - 1)]
        plans.append(
            plan_chunk(
                len(plans),
                start,
                size,
                frames,
                context,
                sizes,
                samples_per_frame=samples_per_frame,
                sized=sized,
            )
        )
        start = plans[-1].end
    return plans


def plan_chunk(
    index: int,
    start: int,
    size: int,
    frames: int,
    context: tuple[int, int],
    buckets: Sequence[int],
    *,
    samples_per_frame: int = 256,
    sized: bool = False,
) -> ChunkPlan:
    """One decoder call keeping frames ``[start, start + size)`` (cut at ``frames``).

    The window is the chunk plus the context available on each side. With fixed buckets the
    call takes the smallest bucket that holds the window; ``sized`` windows (routes that accept
    any length between the smallest and the largest bucket) keep the window's own length, or
    the smallest bucket's when shorter. The window then grows into more real frames (right
    first, then left) to that length and is only padded (zeros, mask 0) at its right end when
    the utterance is shorter.
    """
    left, right = context
    end = min(start + size, frames)
    window_start = start - min(left, start)
    window_end = end + min(right, frames - end)
    needed = window_end - window_start
    low, high = min(buckets), max(buckets)
    if sized and needed <= high:
        bucket = max(needed, low)
    else:
        try:
            bucket = pick_bucket(needed, buckets)
        except ValueError:
            raise ValueError(
                f"chunk [{start}, {end}) with context needs {needed} frames; no decoder "
                f"bucket of {sorted(buckets)} holds it"
            ) from None
    extra = bucket - needed
    grow = min(extra, frames - window_end)
    window_end += grow
    extra -= grow
    grow = min(extra, window_start)
    window_start -= grow
    return ChunkPlan(
        index=index,
        start=start,
        end=end,
        window_start=window_start,
        window_end=window_end,
        bucket=bucket,
        keep_start=(start - window_start) * samples_per_frame,
        keep_end=(end - window_start) * samples_per_frame,
    )


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
