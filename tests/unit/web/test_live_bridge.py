"""The live WebSocket's pieces that need no server: the start message, the origin check, the frame layout."""

from __future__ import annotations

import json
import struct

import pytest
from aiohttp.test_utils import make_mocked_request

from lipline.v1 import session_pb2
from services.web.live_bridge import StartError, frame_message, parse_start, response_message, trusted_origin
from services.web.settings import WebSettings


def test_a_start_message_is_read_with_its_defaults() -> None:
    start = parse_start(json.dumps({"type": "start", "api_key": " k ", "avatar_id": "a1"}))
    assert start == {
        "type": "start",
        "api_key": "k",
        "avatar_id": "a1",
        "codec": session_pb2.VIDEO_CODEC_H264,
        "sample_rate": 16000,
        "max_height": 0,
    }
    assert parse_start(json.dumps({"type": "start", "avatar_id": "a", "codec": "jpeg"}))["codec"] == (
        session_pb2.VIDEO_CODEC_JPEG
    )


def test_a_resume_message_becomes_the_converse_start_of_its_session() -> None:
    resume = parse_start(
        json.dumps({"type": "resume", "api_key": "k", "session_id": "s1", "resume_token": "t", "last_frame": 41})
    )
    assert resume["type"] == "resume" and resume["api_key"] == "k"
    assert resume["start"] == session_pb2.ConverseStart(session_id="s1", resume_token="t", last_frame=41)
    assert (
        parse_start(json.dumps({"type": "resume", "session_id": "s1", "resume_token": "t"}))["start"].last_frame == -1
    )


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ('{"type": "resume", "resume_token": "t"}', "session_id is missing"),
        ('{"type": "resume", "session_id": "s", "resume_token": ""}', "resume_token is missing"),
        ('{"type": "resume", "session_id": "s", "resume_token": "t", "last_frame": -2}', "last_frame is the index"),
        ('{"type": "resume", "session_id": "s", "resume_token": "t", "last_frame": true}', "last_frame is the index"),
        ("not json", "must be JSON"),
        ('{"type": "clear"}', '"type": "start"'),
        ('{"type": "start"}', "pick an avatar"),
        ('{"type": "start", "avatar_id": "a", "codec": "vp9"}', "codec must be one of h264, jpeg"),
        ('{"type": "start", "avatar_id": "a", "sample_rate": "fast"}', "whole numbers"),
    ],
)
def test_a_bad_start_message_says_what_to_fix(text: str, says: str) -> None:
    with pytest.raises(StartError, match=says):
        parse_start(text)


@pytest.mark.parametrize(
    ("origin", "public", "allowed", "ok"),
    [
        # A DNS-rebinding page: its Origin names the Host it sends, and it is still refused.
        ("http://page.example:8080", (), (), False),
        ("http://page.example:8080", ("https://try.example.com",), (), False),
        ("https://try.example.com", ("https://try.example.com",), (), True),
        ("https://TRY.example.com", ("https://try.example.com",), (), True),
        ("http://evil.example", ("https://try.example.com",), (), False),
        ("", ("https://try.example.com",), (), False),  # a browser always sends Origin on a WebSocket
        ("https://app.example", ("https://try.example.com",), ("https://app.example",), True),
        # No public origin configured: the loopback ones of the port the connection came to (80 here).
        ("http://127.0.0.1", (), (), True),
        ("http://localhost", (), (), True),
        ("http://localhost:8080", (), (), False),
    ],
)
def test_only_the_pages_public_origins_or_a_listed_one_may_open_the_socket_whatever_the_host(
    origin: str, public: tuple[str, ...], allowed: tuple[str, ...], ok: bool
) -> None:
    settings = WebSettings(public_origins=public, allowed_origins=allowed)
    headers = {"Host": "page.example:8080", **({"Origin": origin} if origin else {})}
    request = make_mocked_request("GET", "/api/live", headers=headers)  # its socket: 127.0.0.1:80
    assert trusted_origin(request, settings) is ok


def test_a_frame_is_its_json_header_then_its_picture_then_its_audio() -> None:
    frame = session_pb2.VideoFrame(
        index=7, keyframe=True, data=b"\x00\x00\x01\x65pic", audio=b"\x01\x02" * 3, speech=True, utterance=2
    )
    message = frame_message(frame)
    (n,) = struct.unpack_from("<I", message)
    header = json.loads(message[4 : 4 + n])
    assert header == {"index": 7, "keyframe": True, "speech": True, "utterance": 2, "video_bytes": 7}
    assert message[4 + n : 4 + n + 7] == frame.data and message[4 + n + 7 :] == frame.audio
    assert response_message(session_pb2.ConverseResponse(frame=frame)) == message


def test_events_stats_and_ready_go_as_json_with_their_proto_names() -> None:
    event = session_pb2.SessionEvent(kind=session_pb2.SessionEvent.PLAYBACK_FINISHED, utterance=3, interrupted=True)
    assert response_message(session_pb2.ConverseResponse(event=event)) == {
        "type": "event",
        "kind": "PLAYBACK_FINISHED",
        "utterance": "3",
        "frame": "0",
        "position_seconds": 0.0,
        "interrupted": True,
    }
    assert response_message(session_pb2.ConverseResponse(ready=session_pb2.Ready(next_frame=5))) == {
        "type": "ready",
        "next_frame": 5,
    }
