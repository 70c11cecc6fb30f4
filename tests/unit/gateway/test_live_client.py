"""The live client's pieces (services.gateway.live_client): speech cut into paced chunks, latency on the
client's clock, and what it received written to an MP4 that decodes (real x264 and JPEG frames)."""

from __future__ import annotations

import time
from fractions import Fraction
from pathlib import Path

import av
import cv2
import numpy as np
import pytest

from lipline.v1 import session_pb2
from services.gateway.live_client import (
    LiveRecorder,
    frame_audio,
    pcm_chunks,
    pcm_of_audio,
    realtime_requests,
    write_mp4,
)
from services.media.probe import probe_media
from tests.helpers.audio_files import encode_tone

FPS, RATE, W, H = 25.0, 16000, 64, 48
SPAN = RATE // 25 * 2  # bytes of PCM per frame


def test_speech_becomes_pcm_at_the_sessions_rate_in_20_ms_chunks() -> None:
    pcm = pcm_of_audio(encode_tone("wav", 1.0, rate=44100, channels=2), 24000)
    assert len(pcm) == pytest.approx(24000 * 2, abs=64)
    chunks = pcm_chunks(pcm, 24000, 20)
    assert {len(c) for c in chunks[:-1]} == {960} and b"".join(chunks) == pcm
    assert np.abs(np.frombuffer(pcm, "<i2")).max() > 1000  # a tone, not silence


def test_requests_start_then_pace_the_chunks_in_real_time_and_end_the_utterance() -> None:
    recorder = LiveRecorder(FPS, RATE)
    recorder.finished.set()  # nothing to wait for after the last chunk
    started = time.monotonic()
    requests = list(realtime_requests("s1", "tok", [b"\0\0" * 320] * 6, recorder, chunk_s=0.02))
    assert time.monotonic() - started >= 0.1  # 6 chunks of 20 ms: the last leaves 100 ms after the first
    assert [r.WhichOneof("request") for r in requests] == ["start"] + ["audio"] * 6 + ["end_of_utterance"]
    assert (requests[0].start.session_id, requests[0].start.resume_token, requests[0].start.last_frame) == (
        "s1",
        "tok",
        -1,
    )
    # Paced by the clock from the start: chunk i never leaves before i x 20 ms (one that a busy machine
    # sent late is followed sooner by the next, which keeps its own slot).
    assert len(recorder.sent) == 6
    assert all(sent - started >= i * 0.02 for i, sent in enumerate(recorder.sent)), np.diff(recorder.sent)


def recorded(frames: list[tuple[int, bytes, bool]], sent_every_s: float = 0.02, lag_s: float = 0.25) -> LiveRecorder:
    """A recorder that saw `frames` (index, data, speech), each speech frame `lag_s` after its audio's end was sent."""
    recorder = LiveRecorder(FPS, RATE)
    recorder.sent = [i * sent_every_s for i in range(200)]
    speech_seen = 0
    for index, data, speech in frames:
        audio = bytes([index % 256, 0]) * (SPAN // 2)
        recorder.take(
            session_pb2.ConverseResponse(
                frame=session_pb2.VideoFrame(index=index, data=data, audio=audio, speech=speech, keyframe=index == 0)
            )
        )
        if speech:
            speech_seen += 1
            recorder.arrived[-1] = (
                speech_seen * 0.04 - sent_every_s + lag_s
            )  # the chunk ending at (j+1)/fps went out at that time - 20 ms
    return recorder


def test_latency_is_from_a_frames_audio_sent_to_the_frame_received_and_gaps_are_counted() -> None:
    recorder = recorded([(i, b"", i >= 2) for i in (0, 1, 2, 3, 4, 6, 7)])
    assert recorder.latencies() == pytest.approx([0.25] * 5)
    assert recorder.missing() == 1  # frame 5 never came
    recorder.take(
        session_pb2.ConverseResponse(stats=session_pb2.SessionStats(frames_skipped=1, latency_p95_seconds=0.3))
    )
    finished = session_pb2.SessionEvent(
        kind=session_pb2.SessionEvent.PLAYBACK_FINISHED, frame=9
    )  # the utterance's last frame is 8
    recorder.take(session_pb2.ConverseResponse(event=finished))
    assert not recorder.finished.is_set()  # the event came ahead of the last frame
    recorder.take(session_pb2.ConverseResponse(frame=session_pb2.VideoFrame(index=8, audio=b"\0" * SPAN, speech=True)))
    assert recorder.finished.is_set()
    summary = recorder.summary()
    assert "8 frames (6 speech), 1 missing" in summary and "skipped 1" in summary
    audio = frame_audio(recorder)
    assert len(audio) == 9 * SPAN and audio[5 * SPAN : 6 * SPAN] == b"\0" * SPAN  # the missing frame is silence


def test_a_skipped_slots_audio_sent_with_the_next_frame_is_not_doubled() -> None:
    recorder = LiveRecorder(FPS, RATE)
    for index, spans in ((0, 1), (1, 1), (3, 2), (4, 1)):  # slot 2 skipped: its audio came with frame 3
        audio = bytes([index, 1]) * (spans * SPAN // 2)
        recorder.take(session_pb2.ConverseResponse(frame=session_pb2.VideoFrame(index=index, audio=audio, speech=True)))
    audio = frame_audio(recorder)
    assert len(audio) == 5 * SPAN and audio[2 * SPAN : 4 * SPAN] == bytes([3, 1]) * SPAN


def h264_frames(count: int) -> list[bytes]:
    """Annex B access units from libx264 with zerolatency, as a live worker sends them."""
    context = av.CodecContext.create("libx264", "w")
    context.width, context.height, context.pix_fmt = W, H, "yuv420p"
    context.time_base, context.framerate = Fraction(1, 25), Fraction(25)
    context.options = {"preset": "ultrafast", "tune": "zerolatency", "x264-params": "keyint=25:bframes=0"}
    context.open()
    out = []
    for i in range(count):
        image = np.zeros((H, W, 3), np.uint8)
        image[:, : (i * 3) % W] = 200  # something moves
        frame = av.VideoFrame.from_ndarray(image, format="bgr24").reformat(format="yuv420p")
        frame.pts = i
        (packet,) = context.encode(frame)
        out.append(bytes(packet))
    return out


@pytest.mark.parametrize("codec", [session_pb2.VIDEO_CODEC_H264, session_pb2.VIDEO_CODEC_JPEG])
def test_what_was_received_is_written_to_an_mp4_that_decodes_with_its_gaps_kept(tmp_path: Path, codec: int) -> None:
    indices = [i for i in range(50) if i != 20]  # frame 20 was skipped
    if codec == session_pb2.VIDEO_CODEC_H264:
        units = h264_frames(50)
        data = [units[i] for i in indices]
    else:
        data = [cv2.imencode(".jpg", np.full((H, W, 3), i * 4, np.uint8))[1].tobytes() for i in indices]
    recorder = recorded([(i, d, True) for i, d in zip(indices, data)])
    path = tmp_path / "live.mp4"
    write_mp4(path, recorder, codec, W, H)
    info = probe_media(path)
    assert (info["video_codec"], info["audio_codec"], info["width"], info["height"]) == ("h264", "aac", W, H)
    assert info["frames"] == 49
    assert info["audio_duration"] == pytest.approx(2.0, abs=0.05)  # 50 frames of audio, the skipped one as silence
    with av.open(str(path)) as container:
        times = [f.time for f in container.decode(video=0)]
    assert times[19] == pytest.approx(0.76) and times[20] == pytest.approx(0.84)  # the gap stays a gap


def test_nothing_received_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="no frames"):
        write_mp4(tmp_path / "x.mp4", LiveRecorder(FPS, RATE), session_pb2.VIDEO_CODEC_H264, W, H)
