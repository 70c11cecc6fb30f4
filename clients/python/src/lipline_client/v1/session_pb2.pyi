import datetime

from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class VideoCodec(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    VIDEO_CODEC_UNSPECIFIED: _ClassVar[VideoCodec]
    VIDEO_CODEC_H264: _ClassVar[VideoCodec]
    VIDEO_CODEC_JPEG: _ClassVar[VideoCodec]

class SessionState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    SESSION_STATE_UNSPECIFIED: _ClassVar[SessionState]
    SESSION_STATE_ACTIVE: _ClassVar[SessionState]
    SESSION_STATE_CLOSED: _ClassVar[SessionState]
    SESSION_STATE_FAILED: _ClassVar[SessionState]
VIDEO_CODEC_UNSPECIFIED: VideoCodec
VIDEO_CODEC_H264: VideoCodec
VIDEO_CODEC_JPEG: VideoCodec
SESSION_STATE_UNSPECIFIED: SessionState
SESSION_STATE_ACTIVE: SessionState
SESSION_STATE_CLOSED: SessionState
SESSION_STATE_FAILED: SessionState

class AudioFormat(_message.Message):
    __slots__ = ("sample_rate",)
    SAMPLE_RATE_FIELD_NUMBER: _ClassVar[int]
    sample_rate: int
    def __init__(self, sample_rate: _Optional[int] = ...) -> None: ...

class VideoFormat(_message.Message):
    __slots__ = ("codec", "max_height", "fps", "crf", "jpeg_quality")
    CODEC_FIELD_NUMBER: _ClassVar[int]
    MAX_HEIGHT_FIELD_NUMBER: _ClassVar[int]
    FPS_FIELD_NUMBER: _ClassVar[int]
    CRF_FIELD_NUMBER: _ClassVar[int]
    JPEG_QUALITY_FIELD_NUMBER: _ClassVar[int]
    codec: VideoCodec
    max_height: int
    fps: float
    crf: int
    jpeg_quality: int
    def __init__(self, codec: _Optional[_Union[VideoCodec, str]] = ..., max_height: _Optional[int] = ..., fps: _Optional[float] = ..., crf: _Optional[int] = ..., jpeg_quality: _Optional[int] = ...) -> None: ...

class SessionLimits(_message.Message):
    __slots__ = ("max_session_seconds", "idle_timeout_seconds")
    MAX_SESSION_SECONDS_FIELD_NUMBER: _ClassVar[int]
    IDLE_TIMEOUT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    max_session_seconds: float
    idle_timeout_seconds: float
    def __init__(self, max_session_seconds: _Optional[float] = ..., idle_timeout_seconds: _Optional[float] = ...) -> None: ...

class CreateSessionRequest(_message.Message):
    __slots__ = ("avatar_id", "audio", "video", "super_resolution", "limits")
    AVATAR_ID_FIELD_NUMBER: _ClassVar[int]
    AUDIO_FIELD_NUMBER: _ClassVar[int]
    VIDEO_FIELD_NUMBER: _ClassVar[int]
    SUPER_RESOLUTION_FIELD_NUMBER: _ClassVar[int]
    LIMITS_FIELD_NUMBER: _ClassVar[int]
    avatar_id: str
    audio: AudioFormat
    video: VideoFormat
    super_resolution: bool
    limits: SessionLimits
    def __init__(self, avatar_id: _Optional[str] = ..., audio: _Optional[_Union[AudioFormat, _Mapping]] = ..., video: _Optional[_Union[VideoFormat, _Mapping]] = ..., super_resolution: _Optional[bool] = ..., limits: _Optional[_Union[SessionLimits, _Mapping]] = ...) -> None: ...

class Session(_message.Message):
    __slots__ = ("id", "avatar_id", "state", "resume_token", "audio", "video", "width", "height", "super_resolution", "limits", "create_time", "error", "error_code", "model")
    ID_FIELD_NUMBER: _ClassVar[int]
    AVATAR_ID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    RESUME_TOKEN_FIELD_NUMBER: _ClassVar[int]
    AUDIO_FIELD_NUMBER: _ClassVar[int]
    VIDEO_FIELD_NUMBER: _ClassVar[int]
    WIDTH_FIELD_NUMBER: _ClassVar[int]
    HEIGHT_FIELD_NUMBER: _ClassVar[int]
    SUPER_RESOLUTION_FIELD_NUMBER: _ClassVar[int]
    LIMITS_FIELD_NUMBER: _ClassVar[int]
    CREATE_TIME_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    id: str
    avatar_id: str
    state: SessionState
    resume_token: str
    audio: AudioFormat
    video: VideoFormat
    width: int
    height: int
    super_resolution: bool
    limits: SessionLimits
    create_time: _timestamp_pb2.Timestamp
    error: str
    error_code: int
    model: str
    def __init__(self, id: _Optional[str] = ..., avatar_id: _Optional[str] = ..., state: _Optional[_Union[SessionState, str]] = ..., resume_token: _Optional[str] = ..., audio: _Optional[_Union[AudioFormat, _Mapping]] = ..., video: _Optional[_Union[VideoFormat, _Mapping]] = ..., width: _Optional[int] = ..., height: _Optional[int] = ..., super_resolution: _Optional[bool] = ..., limits: _Optional[_Union[SessionLimits, _Mapping]] = ..., create_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., error: _Optional[str] = ..., error_code: _Optional[int] = ..., model: _Optional[str] = ...) -> None: ...

class GetSessionRequest(_message.Message):
    __slots__ = ("session_id",)
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    def __init__(self, session_id: _Optional[str] = ...) -> None: ...

class CloseSessionRequest(_message.Message):
    __slots__ = ("session_id",)
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    def __init__(self, session_id: _Optional[str] = ...) -> None: ...

class ConverseStart(_message.Message):
    __slots__ = ("session_id", "resume_token", "last_frame", "ack_window")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    RESUME_TOKEN_FIELD_NUMBER: _ClassVar[int]
    LAST_FRAME_FIELD_NUMBER: _ClassVar[int]
    ACK_WINDOW_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    resume_token: str
    last_frame: int
    ack_window: int
    def __init__(self, session_id: _Optional[str] = ..., resume_token: _Optional[str] = ..., last_frame: _Optional[int] = ..., ack_window: _Optional[int] = ...) -> None: ...

class AudioChunk(_message.Message):
    __slots__ = ("pcm",)
    PCM_FIELD_NUMBER: _ClassVar[int]
    pcm: bytes
    def __init__(self, pcm: _Optional[bytes] = ...) -> None: ...

class EndOfUtterance(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class Clear(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class FrameAck(_message.Message):
    __slots__ = ("frame",)
    FRAME_FIELD_NUMBER: _ClassVar[int]
    frame: int
    def __init__(self, frame: _Optional[int] = ...) -> None: ...

class ConverseRequest(_message.Message):
    __slots__ = ("start", "audio", "end_of_utterance", "clear", "ack")
    START_FIELD_NUMBER: _ClassVar[int]
    AUDIO_FIELD_NUMBER: _ClassVar[int]
    END_OF_UTTERANCE_FIELD_NUMBER: _ClassVar[int]
    CLEAR_FIELD_NUMBER: _ClassVar[int]
    ACK_FIELD_NUMBER: _ClassVar[int]
    start: ConverseStart
    audio: AudioChunk
    end_of_utterance: EndOfUtterance
    clear: Clear
    ack: FrameAck
    def __init__(self, start: _Optional[_Union[ConverseStart, _Mapping]] = ..., audio: _Optional[_Union[AudioChunk, _Mapping]] = ..., end_of_utterance: _Optional[_Union[EndOfUtterance, _Mapping]] = ..., clear: _Optional[_Union[Clear, _Mapping]] = ..., ack: _Optional[_Union[FrameAck, _Mapping]] = ...) -> None: ...

class VideoFrame(_message.Message):
    __slots__ = ("index", "keyframe", "data", "audio", "speech", "utterance")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    KEYFRAME_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    AUDIO_FIELD_NUMBER: _ClassVar[int]
    SPEECH_FIELD_NUMBER: _ClassVar[int]
    UTTERANCE_FIELD_NUMBER: _ClassVar[int]
    index: int
    keyframe: bool
    data: bytes
    audio: bytes
    speech: bool
    utterance: int
    def __init__(self, index: _Optional[int] = ..., keyframe: _Optional[bool] = ..., data: _Optional[bytes] = ..., audio: _Optional[bytes] = ..., speech: _Optional[bool] = ..., utterance: _Optional[int] = ...) -> None: ...

class SessionEvent(_message.Message):
    __slots__ = ("kind", "utterance", "frame", "position_seconds", "interrupted")
    class Kind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        KIND_UNSPECIFIED: _ClassVar[SessionEvent.Kind]
        PLAYBACK_STARTED: _ClassVar[SessionEvent.Kind]
        PLAYBACK_FINISHED: _ClassVar[SessionEvent.Kind]
    KIND_UNSPECIFIED: SessionEvent.Kind
    PLAYBACK_STARTED: SessionEvent.Kind
    PLAYBACK_FINISHED: SessionEvent.Kind
    KIND_FIELD_NUMBER: _ClassVar[int]
    UTTERANCE_FIELD_NUMBER: _ClassVar[int]
    FRAME_FIELD_NUMBER: _ClassVar[int]
    POSITION_SECONDS_FIELD_NUMBER: _ClassVar[int]
    INTERRUPTED_FIELD_NUMBER: _ClassVar[int]
    kind: SessionEvent.Kind
    utterance: int
    frame: int
    position_seconds: float
    interrupted: bool
    def __init__(self, kind: _Optional[_Union[SessionEvent.Kind, str]] = ..., utterance: _Optional[int] = ..., frame: _Optional[int] = ..., position_seconds: _Optional[float] = ..., interrupted: _Optional[bool] = ...) -> None: ...

class SessionStats(_message.Message):
    __slots__ = ("latency_p50_seconds", "latency_p95_seconds", "queued_audio_seconds", "frames_speech", "frames_idle", "frames_skipped", "frames_dropped")
    LATENCY_P50_SECONDS_FIELD_NUMBER: _ClassVar[int]
    LATENCY_P95_SECONDS_FIELD_NUMBER: _ClassVar[int]
    QUEUED_AUDIO_SECONDS_FIELD_NUMBER: _ClassVar[int]
    FRAMES_SPEECH_FIELD_NUMBER: _ClassVar[int]
    FRAMES_IDLE_FIELD_NUMBER: _ClassVar[int]
    FRAMES_SKIPPED_FIELD_NUMBER: _ClassVar[int]
    FRAMES_DROPPED_FIELD_NUMBER: _ClassVar[int]
    latency_p50_seconds: float
    latency_p95_seconds: float
    queued_audio_seconds: float
    frames_speech: int
    frames_idle: int
    frames_skipped: int
    frames_dropped: int
    def __init__(self, latency_p50_seconds: _Optional[float] = ..., latency_p95_seconds: _Optional[float] = ..., queued_audio_seconds: _Optional[float] = ..., frames_speech: _Optional[int] = ..., frames_idle: _Optional[int] = ..., frames_skipped: _Optional[int] = ..., frames_dropped: _Optional[int] = ...) -> None: ...

class Ready(_message.Message):
    __slots__ = ("session", "next_frame")
    SESSION_FIELD_NUMBER: _ClassVar[int]
    NEXT_FRAME_FIELD_NUMBER: _ClassVar[int]
    session: Session
    next_frame: int
    def __init__(self, session: _Optional[_Union[Session, _Mapping]] = ..., next_frame: _Optional[int] = ...) -> None: ...

class ConverseResponse(_message.Message):
    __slots__ = ("ready", "frame", "event", "stats")
    READY_FIELD_NUMBER: _ClassVar[int]
    FRAME_FIELD_NUMBER: _ClassVar[int]
    EVENT_FIELD_NUMBER: _ClassVar[int]
    STATS_FIELD_NUMBER: _ClassVar[int]
    ready: Ready
    frame: VideoFrame
    event: SessionEvent
    stats: SessionStats
    def __init__(self, ready: _Optional[_Union[Ready, _Mapping]] = ..., frame: _Optional[_Union[VideoFrame, _Mapping]] = ..., event: _Optional[_Union[SessionEvent, _Mapping]] = ..., stats: _Optional[_Union[SessionStats, _Mapping]] = ...) -> None: ...
