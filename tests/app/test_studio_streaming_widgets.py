"""The streaming output widgets, fed with synthetic chunks as the speech pipelines will
deliver them (``OmniRequestOutput`` with ``pcm``, ``sample_rate``, ``chunk_index``, ``text``)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

from app.models import ReceivedAudio, RequestMetrics, StageTiming, TextChunk
from app.playback import AudioOutput
from app.presenters import RequestTracker, output_items
from app.widgets.metrics import MetricsPanel
from app.widgets.output import (
    FIRST_BIN,
    MAX_BINS,
    OutputArea,
    StreamingTextView,
    WaveformView,
)
from runtime.engine.outputs import OmniRequestOutput

RATE = 22050


def _speech_outputs(chunks: int, samples: int = 4410) -> list[OmniRequestOutput]:
    """Outputs shaped like the speech pipeline's: a sine burst per chunk, then final text."""
    outputs = []
    for index in range(chunks):
        t = (np.arange(samples) + index * samples) / RATE
        pcm = (0.4 * np.sin(2 * np.pi * 220.0 * t)).astype(np.float32)
        outputs.append(
            OmniRequestOutput(
                request_id="req-speech",
                stage="decoder",
                outputs={"pcm": pcm, "sample_rate": np.array(RATE), "chunk_index": np.array(index)},
                finished=False,
                index=index,
            )
        )
    return outputs


def test_the_waveform_grows_with_each_chunk(qtbot: Any) -> None:
    waveform = WaveformView()
    qtbot.addWidget(waveform)
    waveform.show()
    drawn = []
    for index, output in enumerate(_speech_outputs(4)):
        (chunk,) = output_items(output, received_s=0.1 * (index + 1))
        assert isinstance(chunk, ReceivedAudio)
        with qtbot.waitSignal(waveform.grew, timeout=2000) as blocker:
            waveform.append_chunk(chunk)
        drawn.append(blocker.args[0])
        x, y = waveform.curve.getOriginalDataset()
        # The curve draws the envelope: a (min, max) pair per bin of samples.
        bins = math.ceil(blocker.args[0] / waveform.bin_samples)
        assert len(x) == len(y) == 2 * bins
    assert drawn == [4410, 8820, 13230, 17640]
    assert waveform.duration_s == pytest.approx(0.8)
    assert waveform.chunks == 4
    _x, y = waveform.curve.getOriginalDataset()
    assert float(np.max(np.abs(y))) == pytest.approx(0.4, abs=1e-3)
    marks, _heights = waveform.boundary_curve.getOriginalDataset()
    assert sorted(set(marks.tolist())) == pytest.approx([0.2, 0.4, 0.6])
    waveform.clear_audio()
    assert waveform.sample_count == 0


def test_a_long_waveform_draws_a_bounded_envelope_of_the_same_peaks(qtbot: Any) -> None:
    """Twenty minutes of audio in 3 s chunks: each redraw draws at most MAX_BINS pairs, and
    the envelope keeps every chunk's peaks."""
    waveform = WaveformView()
    qtbot.addWidget(waveform)
    waveform.show()
    rng = np.random.default_rng(7)
    chunk_samples = 3 * RATE
    peaks = []
    for index in range(400):
        pcm = (rng.standard_normal(chunk_samples) * 0.1).astype(np.float32)
        pcm[rng.integers(chunk_samples)] = 0.9 if index % 2 else -0.9
        peaks.append(pcm)
        waveform.append_chunk(ReceivedAudio("r", index, index, pcm, RATE, float(index)))
        if index in (0, 399):
            with qtbot.waitSignal(waveform.grew, timeout=2000):
                pass
    every = np.concatenate(peaks)
    times, values = waveform.envelope()
    assert len(values) <= 2 * (MAX_BINS + 1)
    assert waveform.bin_samples > FIRST_BIN
    assert float(values.max()) == float(every.max())
    assert float(values.min()) == float(every.min())
    assert times[-1] <= waveform.duration_s
    x, _y = waveform.curve.getOriginalDataset()
    assert len(x) == len(values)
    # Each bin holds exactly the extremes of its samples.
    width = waveform.bin_samples
    for position in (0, 100, len(values) // 2 - 2):
        part = every[position * width : (position + 1) * width]
        assert values[2 * position] == part.min()
        assert values[2 * position + 1] == part.max()


def test_the_waveform_refuses_a_chunk_at_another_sample_rate(qtbot: Any) -> None:
    waveform = WaveformView()
    qtbot.addWidget(waveform)
    waveform.append_chunk(ReceivedAudio("r", 0, 0, np.zeros(100, np.float32), RATE, 0.0))
    with pytest.raises(ValueError, match="at 16000 Hz, earlier chunks at 22050 Hz"):
        waveform.append_chunk(ReceivedAudio("r", 1, 1, np.zeros(100, np.float32), 16000, 0.1))
    with pytest.raises(ValueError, match="no sample rate"):
        waveform.append_chunk(ReceivedAudio("r", 2, 2, np.zeros(100, np.float32), 0, 0.1))


def test_streamed_text_accepts_cumulative_and_delta_chunks(qtbot: Any) -> None:
    view = StreamingTextView()
    qtbot.addWidget(view)
    for text in ("Hello", "Hello, wor", "Hello, world."):
        view.append_chunk(TextChunk("r", 0, text, False))
    assert view.toPlainText() == "Hello, world."
    view.append_chunk(TextChunk("r", 1, " Bye.", True))
    assert view.toPlainText() == "Hello, world. Bye."
    assert view.chunks == 4


def test_a_speech_run_fills_the_output_area_and_the_metrics(qtbot: Any) -> None:
    area = OutputArea(AudioOutput())
    metrics = MetricsPanel()
    for widget in (area, metrics):
        qtbot.addWidget(widget)
        widget.show()
    area.new_run()
    metrics.clear()
    tracker = RequestTracker("req-speech", submitted_at=0.0)
    area.run_started("req-speech")
    for index, output in enumerate(_speech_outputs(3)):
        (chunk,) = output_items(output, received_s=0.05 + 0.1 * index)
        tracker.add_call("decoder", 0.0, 0.04, 0.002)
        tracker.add_audio(chunk)
        with qtbot.waitSignal(area.waveform.grew, timeout=2000):
            area.add_audio(chunk)
    (text,) = output_items(
        OmniRequestOutput(
            "req-speech", "decoder", {"text": np.array("Hello there.")}, True, index=3
        ),
        0.3,
    )
    assert isinstance(text, TextChunk)
    area.add_text(text)
    tracker.finish("completed", 0.3)
    final = tracker.snapshot(now=1.0)
    metrics.show_metrics(final)
    with qtbot.waitSignal(metrics._refresh.timeout, timeout=2000):
        pass
    area.finished("completed", "")
    assert area.audio_box.isVisible()
    assert area.text_view.toPlainText() == "Hello there."
    assert area.audio_label.text() == f"3 chunks · 0.60 s · {RATE} Hz"
    assert area.playback.output.buffered_s == pytest.approx(0.6)
    assert metrics.first_audio.value.text() == "50.0 ms"
    assert metrics.rtf.value.text() == f"{0.25 / 0.6:.3f}"
    assert metrics.audio.value.text() == "0.60 s"
    assert metrics.table.rowCount() == 1
    assert metrics.table.item(0, 1).text() == "3"
    assert metrics.chart.stage_names == ["decoder"]
    assert metrics.chart.totals_ms[0] == pytest.approx(3 * 42.0)


def test_playback_controls_follow_the_devices_and_the_audio(qtbot: Any) -> None:
    area = OutputArea(AudioOutput())
    qtbot.addWidget(area)
    playback = area.playback
    assert not playback._listed  # a graph pipeline never starts PortAudio
    area.show_streams(True)
    devices = playback.output.devices()
    assert not playback.play_button.isEnabled()  # nothing to play yet
    assert not playback.pause_button.isEnabled()
    if devices:
        assert playback.device_box.count() == len(devices)
        area.add_audio(ReceivedAudio("r", 0, 0, np.zeros(2205, np.float32), RATE, 0.0))
        assert playback.play_button.isEnabled() or playback.output.state == "playing"
    else:
        # No sound device here: the picker says so and why, and nothing can be played.
        assert playback.device_box.currentText().startswith("No output device")
        assert not playback.auto_play.isEnabled()
        area.add_audio(ReceivedAudio("r", 0, 0, np.zeros(2205, np.float32), RATE, 0.0))
        assert not playback.play_button.isEnabled()


def test_the_latency_chart_updates_its_bars_in_place(qtbot: Any) -> None:
    panel = MetricsPanel()
    qtbot.addWidget(panel)
    bars = list(panel.chart.bars)
    for count in (1, 3, 2):
        stages = tuple(
            StageTiming(f"stage-{i}", 1, 0.001, 0.002 * (i + 1), 0.0) for i in range(count)
        )
        panel.chart.show_stages(RequestMetrics("r", 0.1, None, 0.0, 0, stages))
        assert panel.chart.stage_names == [stage.stage for stage in stages]
        assert panel.chart.totals_ms == pytest.approx([1.0 + 2.0 * (i + 1) for i in range(count)])
    assert panel.chart.bars == bars
