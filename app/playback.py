"""Playback of a request's streamed audio through the runtime's ``AudioPlayer``.

``AudioOutput`` keeps every sample of the current request, so playback can start while
chunks still arrive (fed from any thread: the studio's bridge feeds it on the runtime thread
that delivered each chunk, so audio never waits for the GUI), pause, resume, and start again from the beginning. One
``AudioPlayer`` is made per playback; a feeder thread (owned here, joined on stop) is its
producer, because ``feed`` waits while the player's buffer is full and the GUI must not.
``pause`` and ``resume`` only set a flag; ``start`` opens the device and ``stop`` ends the
stream within one callback block.
"""

from __future__ import annotations

import queue
import threading

import numpy as np

from runtime.audio import (
    AudioDeviceError,
    AudioPlayer,
    OutputDevice,
    PlayerState,
    list_output_devices,
)
from runtime.errors import OmniError, RequestCancelled

__all__ = ["AudioOutput", "OutputDevice"]

#: Joining the feeder after ``stop`` (it leaves ``feed`` within one block).
FEEDER_JOIN_S = 2.0
_END = object()


class AudioOutput:
    """The current request's audio, and its playback on one output device."""

    def __init__(self) -> None:
        self.unavailable_reason: str | None = None
        self._lock = threading.Lock()
        self._chunks: list[np.ndarray] = []
        self._frames = 0
        self._sample_rate = 0
        self._ended = False
        self._request_id: str | None = None
        self._player: AudioPlayer | None = None
        self._queue: queue.SimpleQueue[object] | None = None
        self._feeder: threading.Thread | None = None
        self.feed_error: str | None = None

    # -- devices -----------------------------------------------------------------------

    def devices(self) -> list[OutputDevice]:
        """Output devices PortAudio offers now (empty, with ``unavailable_reason``, if none)."""
        try:
            found = list_output_devices()
        except AudioDeviceError as exc:
            self.unavailable_reason = str(exc)
            return []
        self.unavailable_reason = None if found else "no output device was found"
        return found

    # -- the request's audio -----------------------------------------------------------

    def reset(self) -> None:
        """Forget the previous request's audio and stop playing it."""
        self.stop()
        with self._lock:
            self._chunks = []
            self._frames = 0
            self._sample_rate = 0
            self._ended = False
            self._request_id = None

    def begin(self, request_id: str) -> None:
        """Take the chunks of ``request_id`` from now on; feeds naming another are dropped."""
        with self._lock:
            self._request_id = request_id

    def feed(self, pcm: np.ndarray, sample_rate: int, *, request_id: str | None = None) -> None:
        """Queue one chunk (any thread). A chunk naming a request other than the one begun
        (a late chunk of an earlier run) is dropped."""
        samples = np.ascontiguousarray(pcm, dtype=np.float32).reshape(-1)
        with self._lock:
            if request_id is not None and request_id != self._request_id:
                return
            if self._sample_rate and sample_rate != self._sample_rate:
                raise ValueError(
                    f"a chunk at {sample_rate} Hz follows chunks at {self._sample_rate} Hz"
                )
            self._sample_rate = sample_rate
            self._chunks.append(samples)
            self._frames += samples.size
            if self._queue is not None:
                self._queue.put(samples)

    def end_of_stream(self) -> None:
        with self._lock:
            self._ended = True
            if self._queue is not None:
                self._queue.put(_END)

    # -- transport ---------------------------------------------------------------------

    @property
    def state(self) -> str:
        """``stopped``, ``playing`` (or buffering), ``paused``, ``finished`` or ``failed``."""
        player = self._player
        if player is None:
            return "stopped"
        state = player.state
        if state in (PlayerState.PLAYING, PlayerState.BUFFERING, PlayerState.CREATED):
            return "playing"
        return {
            PlayerState.PAUSED: "paused",
            PlayerState.FINISHED: "finished",
            PlayerState.FAILED: "failed",
        }.get(state, "stopped")

    @property
    def underruns(self) -> int:
        player = self._player
        if player is None or player.state is PlayerState.CREATED:
            return 0
        return player.metrics().underruns

    @property
    def position_s(self) -> float:
        player = self._player
        if player is None or player.state is PlayerState.CREATED:
            return 0.0
        metrics = player.metrics()
        return metrics.frames_played / metrics.device_rate if metrics.device_rate else 0.0

    @property
    def buffered_s(self) -> float:
        with self._lock:
            return self._frames / self._sample_rate if self._sample_rate else 0.0

    def play(self, device: int | None) -> None:
        """Play from the start (or resume after ``pause``) on ``device`` (None: the default)."""
        if self._player is not None and self.state == "paused":
            self._player.resume()
            return
        self.stop()
        with self._lock:
            rate = self._sample_rate
        if not rate:
            raise RuntimeError("there is no audio to play yet")
        player = AudioPlayer(device, sample_rate_in=rate)
        try:
            player.start()
        except OmniError:
            player.stop()
            raise
        feeds: queue.SimpleQueue[object] = queue.SimpleQueue()
        with self._lock:
            for chunk in self._chunks:
                feeds.put(chunk)
            if self._ended:
                feeds.put(_END)
            self._queue = feeds
        self._player = player
        self.feed_error = None
        self._feeder = threading.Thread(
            target=self._feed_loop, args=(player, feeds), name="omni-studio-playback", daemon=True
        )
        self._feeder.start()

    def _feed_loop(self, player: AudioPlayer, feeds: queue.SimpleQueue[object]) -> None:
        try:
            while (item := feeds.get()) is not None:
                if item is _END:
                    player.end_of_stream()
                    return
                assert isinstance(item, np.ndarray)
                player.feed(item)
        except RequestCancelled:
            return
        except OmniError as exc:  # the device failed; the controls show why
            self.feed_error = str(exc)

    def pause(self) -> None:
        if self._player is not None and self.state == "playing":
            self._player.pause()

    def stop(self) -> None:
        """Stop playing and rewind; the next ``play`` starts from the beginning."""
        player, self._player = self._player, None
        with self._lock:
            feeds, self._queue = self._queue, None
        if player is not None:
            player.stop()
        if feeds is not None:
            feeds.put(None)
        feeder, self._feeder = self._feeder, None
        if feeder is not None:
            feeder.join(FEEDER_JOIN_S)

    def close(self) -> None:
        self.stop()
