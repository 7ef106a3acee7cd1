"""The state a full-duplex stream shares with PortAudio's audio callback.

One PortAudio stream carries both directions in one callback, so each microphone block is
captured together with the block played in the same callback: the two signals stay
sample-aligned at a constant device offset, which is what echo cancellation needs.

:class:`_Duplex` is that state and its callback, :class:`_Reply` one reply's progress through
it, and :class:`_StreamHolder` owns the stream so that a finalizer can close it; the owner's
side is :class:`~runtime.audio.duplex.DuplexAudio`.

Between replies the output is silence, which is not an underrun. An underrun is counted when
the ring runs dry while a reply is playing and was not ended. Playback of a reply starts once
``cushion_s`` of it is queued (or it was ended), and again after an underrun.

``duck`` fades the gain linearly to 0 over ``fade_s`` and then holds: the ring is no longer
read, so the rest of the reply waits and ``resume`` fades back in from the held sample.
``interrupt`` fades out the same way (unless already silent) and then drops every reply not
yet finished; feeds for those replies are discarded from then on. Closing asks the callback
to end the stream and waits for that, as the player and the input do.
"""

from __future__ import annotations

import collections
import math
import threading
import time
from typing import TYPE_CHECKING, Any

import numpy as np

from runtime.audio.devices import _stream_closed

if TYPE_CHECKING:
    from runtime.audio.resample import StreamResampler
    from runtime.audio.ring import SampleRing


class _Reply:
    """One reply's state. The producer writes ``end``, ``fed``, ``discarded`` and the
    resampler; the controls write ``interrupt_requested``; the callback writes the rest."""

    __slots__ = (
        "discarded",
        "dropped",
        "end",
        "fed",
        "finished",
        "first_at",
        "interrupt_requested",
        "interrupted",
        "played",
        "playing",
        "rate",
        "reply_id",
        "resampler",
    )

    def __init__(self, reply_id: str, rate: int, resampler: StreamResampler | None) -> None:
        self.reply_id = reply_id
        self.rate = rate
        self.resampler = resampler
        self.end = -1
        self.fed = 0
        self.discarded = 0
        self.interrupt_requested = False
        self.played = 0
        self.dropped = 0
        self.first_at: float | None = None
        self.playing = False
        self.finished = False
        self.interrupted = False


class _Duplex:
    """State shared with the audio callback (kept apart from ``DuplexAudio`` so the stream,
    which holds the callback, never keeps it alive and its finalizer can close the stream)."""

    __slots__ = (
        "abort_signal",
        "blocks",
        "cap_buffer",
        "cap_frame",
        "cap_frames",
        "cap_mean_square",
        "cap_peak",
        "cap_read",
        "cap_slots",
        "cap_time",
        "cap_written",
        "capture_dropped",
        "clock",
        "cushion",
        "device_overflows",
        "device_underflows",
        "fade_step",
        "finished",
        "frame_position",
        "frames_played",
        "gain",
        "hold_requested",
        "in_channels",
        "inv_channels",
        "level_count",
        "level_frames",
        "level_mean_square",
        "level_peak",
        "mic",
        "nan_mask",
        "play",
        "ramp",
        "ramp_index",
        "replies",
        "ring",
        "silence_serial",
        "silent_at",
        "silent_serial",
        "stop",
        "underrun_frames",
        "underruns",
    )

    def __init__(
        self,
        *,
        ring: SampleRing,
        block: int,
        in_channels: int,
        cap_slots: int,
        level_slots: int,
        cushion: int,
        fade_frames: int,
        sd: Any,
    ) -> None:
        self.ring = ring
        self.replies: collections.deque[_Reply] = collections.deque()
        self.cushion = cushion
        self.fade_step = 1.0 / fade_frames
        self.in_channels = in_channels
        self.inv_channels = np.float32(1.0 / in_channels)
        # Preallocated working memory of the callback.
        self.play = np.zeros((block, 1), np.float32)
        self.ramp = np.zeros(block, np.float32)
        self.ramp_index = np.arange(1, block + 1, dtype=np.float32)
        self.mic = np.zeros(block, np.float32)
        self.nan_mask = np.zeros(block, np.bool_)
        # The capture ring: slot i holds (mic, reference) of one block and its metadata.
        self.cap_slots = cap_slots
        self.cap_buffer = np.zeros((cap_slots, block, 2), np.float32)
        self.cap_frames = np.zeros(cap_slots, np.int64)
        self.cap_frame = np.zeros(cap_slots, np.int64)
        self.cap_time = np.zeros(cap_slots, np.float64)
        self.cap_mean_square = np.zeros(cap_slots, np.float64)
        self.cap_peak = np.zeros(cap_slots, np.float64)
        self.cap_written = 0  # callback
        self.cap_read = 0  # consumer
        # The level meter's history, kept whether or not the reader keeps up.
        self.level_frames = np.zeros(level_slots, np.int64)
        self.level_mean_square = np.zeros(level_slots, np.float64)
        self.level_peak = np.zeros(level_slots, np.float64)
        self.level_count = 0
        # Controls (written under DuplexAudio's control lock, read by the callback).
        self.hold_requested = False
        self.silence_serial = 0
        self.stop = False
        # Written by the callback only.
        self.gain = 1.0
        self.silent_serial = 0
        self.silent_at: float | None = None
        self.blocks = 0
        self.frame_position = 0
        self.frames_played = 0
        self.underruns = 0
        self.underrun_frames = 0
        self.device_underflows = 0
        self.device_overflows = 0
        self.capture_dropped = 0
        self.finished = threading.Event()
        self.clock = time.monotonic
        self.abort_signal: BaseException = sd.CallbackAbort()

    def callback(
        self, indata: np.ndarray, outdata: np.ndarray, frames: int, _time: Any, status: Any
    ) -> None:
        """PortAudio's audio thread: play one block and capture it with the microphone's."""
        now = self.clock()
        if self.stop or frames > self.play.shape[0]:
            outdata.fill(0.0)
            raise self.abort_signal
        if status:
            if status.output_underflow:
                self.device_underflows += 1
            if status.input_overflow:
                self.device_overflows += 1
        play = self.play[:frames]
        self._play_block(play, frames, now)
        outdata[:] = play
        self._capture_block(indata, play, frames, now)
        self.blocks += 1
        self.frame_position += frames

    def _play_block(self, play: np.ndarray, frames: int, now: float) -> None:
        serial = self.silence_serial
        replies = self.replies
        head = replies[0] if replies else None
        silence = self.hold_requested or (head is not None and head.interrupt_requested)
        step = self.fade_step
        if not silence and head is not None and head.first_at is None:
            # Nothing of this reply sounded yet: it starts at full gain, without a fade-in.
            self.gain = 1.0
        start_gain = self.gain
        if silence:
            # Reply audio is read only while the fade-out lets it through: the frames whose
            # gain is still above zero (the one that reaches zero is left for ``resume``).
            audible = math.ceil(start_gain / step - 1e-6) - 1
            limit = 0 if audible <= 0 else audible if audible < frames else frames
        else:
            limit = frames
        count = self._fill(play, limit, frames, now)
        if count < frames:
            play[count:].fill(0.0)
        target = 0.0 if silence else 1.0
        if start_gain != target:
            if count == 0:
                # Nothing sounded in this block: the gain may jump.
                self.gain = target
            else:
                signed = step if target else -step
                ramp = self.ramp[:frames]
                np.multiply(self.ramp_index[:frames], signed, out=ramp)
                ramp += start_gain
                np.clip(ramp, 0.0, 1.0, out=ramp)
                play[:, 0] *= ramp
                moved = start_gain + signed * frames
                self.gain = 0.0 if moved <= 0.0 else 1.0 if moved >= 1.0 else moved
        if self.silent_serial != serial and (self.gain == 0.0 or count == 0):
            # The first block after a duck or an interrupt whose end is silent.
            self.silent_at = now
            self.silent_serial = serial

    def _fill(self, play: np.ndarray, limit: int, frames: int, now: float) -> int:
        """Copy reply audio into ``play[:limit]``, reply after reply; return how many frames.

        Replies lie one after the other in the ring; only the last one can be open.
        """
        ring = self.ring
        replies = self.replies
        position = 0
        while replies:
            reply = replies[0]
            # ``written`` before ``end``: while the reply is still open, all that was
            # written is its own (the producer ends it before writing the next one).
            written = ring.total_written
            end = reply.end
            read = ring.total_read
            ended = end >= 0
            upto = end if ended and end <= written else written
            available = upto - read
            if reply.interrupt_requested and self.gain == 0.0:
                if available > 0:
                    reply.dropped += ring.discard(available)
                    reply.interrupted = True
                elif not ended or read < end:
                    reply.interrupted = True
                if ended and upto == end:
                    reply.finished = True
                    replies.popleft()
                    continue
                break
            if ended and read >= end:
                reply.finished = True
                replies.popleft()
                continue
            if position >= limit:
                break
            if not reply.playing:
                if available < self.cushion and not ended:
                    if reply.first_at is not None:
                        self.underrun_frames += frames - position
                    break
                reply.playing = True
            want = limit - position
            take = available if available < want else want
            got = ring.read_into(play[position:], take) if take > 0 else 0
            if got:
                if reply.first_at is None:
                    reply.first_at = now
                reply.played += got
                self.frames_played += got
                position += got
            if got < want:
                if ended:
                    if read + got >= end:
                        continue  # this reply is over: the next one may follow at once
                    break  # the end was set after ``written`` was read: the rest comes next
                # The ring ran dry in the middle of a reply that was not ended.
                self.underruns += 1
                self.underrun_frames += frames - position
                reply.playing = False
            break
        return position

    def _capture_block(self, indata: np.ndarray, play: np.ndarray, frames: int, now: float) -> None:
        mic = self.mic[:frames]
        if self.in_channels == 1:
            mic[:] = indata[:, 0]
        else:
            np.sum(indata, axis=1, out=mic)
            mic *= self.inv_channels
        # A device may hand over NaN, infinity or values past full scale: keep [-1, 1].
        np.clip(mic, -1.0, 1.0, out=mic)
        mask = self.nan_mask[:frames]
        np.isnan(mic, out=mask)
        np.copyto(mic, 0.0, where=mask)
        mean_square = float(np.dot(mic, mic)) / frames if frames else 0.0
        peak = max(float(mic.max()), -float(mic.min())) if frames else 0.0
        levels = self.level_count % self.level_frames.shape[0]
        self.level_frames[levels] = frames
        self.level_mean_square[levels] = mean_square
        self.level_peak[levels] = peak
        self.level_count += 1
        written = self.cap_written
        if written - self.cap_read >= self.cap_slots:
            self.capture_dropped += 1
            return
        slot = written % self.cap_slots
        buffer = self.cap_buffer[slot]
        buffer[:frames, 0] = mic
        buffer[:frames, 1] = play[:, 0]
        self.cap_frames[slot] = frames
        self.cap_frame[slot] = self.frame_position
        self.cap_time[slot] = now
        self.cap_mean_square[slot] = mean_square
        self.cap_peak[slot] = peak
        self.cap_written = written + 1

    def on_finished(self) -> None:
        """PortAudio calls this once the stream went inactive (closed, aborted or failed)."""
        self.finished.set()


class _StreamHolder:
    """Owns the PortAudio stream, so a finalizer or the exit hook can close it."""

    __slots__ = ("__weakref__", "duplex", "stream")

    def __init__(self) -> None:
        self.stream: Any | None = None
        self.duplex: _Duplex | None = None

    def close(self, grace_s: float) -> None:
        stream, self.stream = self.stream, None
        if stream is None:
            return
        try:
            duplex = self.duplex
            if duplex is not None and not duplex.finished.is_set():
                duplex.stop = True
                duplex.finished.wait(grace_s)
            # Past the grace period the callback is not being called (a stalled device).
            stream.abort()
            stream.close()
        finally:
            _stream_closed(self)
