"""Where a clip's sound is: the span of its frames within 40 dB of its loudest."""

from __future__ import annotations

import numpy as np

__all__ = ["sound_span"]

#: Frames quieter than this fraction of the loudest frame's RMS (-40 dB) are silence.
FLOOR: float = 0.01


def sound_span(samples: np.ndarray, frame: int) -> tuple[int, int]:
    """``(start, end)`` in samples: from the first to the end of the last ``frame``-long frame
    whose RMS is within 40 dB of the loudest (a trailing part frame is not scored). A clip
    with no sound at all gives ``(0, 0)``."""
    if frame <= 0:
        raise ValueError(f"frame must be a positive number of samples; got {frame}")
    count = samples.size // frame
    frames = samples[: count * frame].reshape(count, frame).astype(np.float64)
    rms = np.sqrt(np.mean(frames**2, axis=1)) if count else np.zeros(0)
    if not rms.size or rms.max() <= 0.0:
        return 0, 0
    loud = np.flatnonzero(rms > rms.max() * FLOOR)
    return int(loud[0]) * frame, (int(loud[-1]) + 1) * frame
