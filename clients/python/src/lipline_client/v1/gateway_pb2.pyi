import datetime

from google.protobuf import timestamp_pb2 as _timestamp_pb2
from lipline_client.v1 import common_pb2 as _common_pb2
from lipline_client.v1 import session_pb2 as _session_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class JobState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    JOB_STATE_UNSPECIFIED: _ClassVar[JobState]
    JOB_STATE_QUEUED: _ClassVar[JobState]
    JOB_STATE_RUNNING: _ClassVar[JobState]
    JOB_STATE_SUCCEEDED: _ClassVar[JobState]
    JOB_STATE_FAILED: _ClassVar[JobState]
    JOB_STATE_CANCELLED: _ClassVar[JobState]
JOB_STATE_UNSPECIFIED: JobState
JOB_STATE_QUEUED: JobState
JOB_STATE_RUNNING: JobState
JOB_STATE_SUCCEEDED: JobState
JOB_STATE_FAILED: JobState
JOB_STATE_CANCELLED: JobState

class CreateAvatarRequest(_message.Message):
    __slots__ = ("name", "photo_fps", "data", "request_id", "labels", "model")
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    NAME_FIELD_NUMBER: _ClassVar[int]
    PHOTO_FPS_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    name: str
    photo_fps: float
    data: bytes
    request_id: str
    labels: _containers.ScalarMap[str, str]
    model: str
    def __init__(self, name: _Optional[str] = ..., photo_fps: _Optional[float] = ..., data: _Optional[bytes] = ..., request_id: _Optional[str] = ..., labels: _Optional[_Mapping[str, str]] = ..., model: _Optional[str] = ...) -> None: ...

class Avatar(_message.Message):
    __slots__ = ("id", "name", "frame_count", "fps", "width", "height", "faces_found", "create_time", "labels", "model")
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    FRAME_COUNT_FIELD_NUMBER: _ClassVar[int]
    FPS_FIELD_NUMBER: _ClassVar[int]
    WIDTH_FIELD_NUMBER: _ClassVar[int]
    HEIGHT_FIELD_NUMBER: _ClassVar[int]
    FACES_FOUND_FIELD_NUMBER: _ClassVar[int]
    CREATE_TIME_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    id: str
    name: str
    frame_count: int
    fps: float
    width: int
    height: int
    faces_found: int
    create_time: _timestamp_pb2.Timestamp
    labels: _containers.ScalarMap[str, str]
    model: str
    def __init__(self, id: _Optional[str] = ..., name: _Optional[str] = ..., frame_count: _Optional[int] = ..., fps: _Optional[float] = ..., width: _Optional[int] = ..., height: _Optional[int] = ..., faces_found: _Optional[int] = ..., create_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., labels: _Optional[_Mapping[str, str]] = ..., model: _Optional[str] = ...) -> None: ...

class GetAvatarRequest(_message.Message):
    __slots__ = ("avatar_id",)
    AVATAR_ID_FIELD_NUMBER: _ClassVar[int]
    avatar_id: str
    def __init__(self, avatar_id: _Optional[str] = ...) -> None: ...

class ListAvatarsRequest(_message.Message):
    __slots__ = ("page_size", "page_token", "model")
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    page_size: int
    page_token: str
    model: str
    def __init__(self, page_size: _Optional[int] = ..., page_token: _Optional[str] = ..., model: _Optional[str] = ...) -> None: ...

class ListAvatarsResponse(_message.Message):
    __slots__ = ("avatars", "next_page_token", "unreadable_avatar_ids")
    AVATARS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    UNREADABLE_AVATAR_IDS_FIELD_NUMBER: _ClassVar[int]
    avatars: _containers.RepeatedCompositeFieldContainer[Avatar]
    next_page_token: str
    unreadable_avatar_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, avatars: _Optional[_Iterable[_Union[Avatar, _Mapping]]] = ..., next_page_token: _Optional[str] = ..., unreadable_avatar_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class DeleteAvatarRequest(_message.Message):
    __slots__ = ("avatar_id",)
    AVATAR_ID_FIELD_NUMBER: _ClassVar[int]
    avatar_id: str
    def __init__(self, avatar_id: _Optional[str] = ...) -> None: ...

class DeleteAvatarResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class JobOptions(_message.Message):
    __slots__ = ("super_resolution", "crf", "loop", "callback_url")
    class LoopMode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        PING_PONG: _ClassVar[JobOptions.LoopMode]
        WRAP: _ClassVar[JobOptions.LoopMode]
    PING_PONG: JobOptions.LoopMode
    WRAP: JobOptions.LoopMode
    SUPER_RESOLUTION_FIELD_NUMBER: _ClassVar[int]
    CRF_FIELD_NUMBER: _ClassVar[int]
    LOOP_FIELD_NUMBER: _ClassVar[int]
    CALLBACK_URL_FIELD_NUMBER: _ClassVar[int]
    super_resolution: bool
    crf: int
    loop: JobOptions.LoopMode
    callback_url: str
    def __init__(self, super_resolution: _Optional[bool] = ..., crf: _Optional[int] = ..., loop: _Optional[_Union[JobOptions.LoopMode, str]] = ..., callback_url: _Optional[str] = ...) -> None: ...

class WebhookDelivery(_message.Message):
    __slots__ = ("delivery_id", "state", "attempts", "last_status_code", "last_error", "delivered_time", "next_attempt_time")
    class State(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        STATE_UNSPECIFIED: _ClassVar[WebhookDelivery.State]
        PENDING: _ClassVar[WebhookDelivery.State]
        DELIVERED: _ClassVar[WebhookDelivery.State]
        GAVE_UP: _ClassVar[WebhookDelivery.State]
    STATE_UNSPECIFIED: WebhookDelivery.State
    PENDING: WebhookDelivery.State
    DELIVERED: WebhookDelivery.State
    GAVE_UP: WebhookDelivery.State
    DELIVERY_ID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    LAST_STATUS_CODE_FIELD_NUMBER: _ClassVar[int]
    LAST_ERROR_FIELD_NUMBER: _ClassVar[int]
    DELIVERED_TIME_FIELD_NUMBER: _ClassVar[int]
    NEXT_ATTEMPT_TIME_FIELD_NUMBER: _ClassVar[int]
    delivery_id: str
    state: WebhookDelivery.State
    attempts: int
    last_status_code: int
    last_error: str
    delivered_time: _timestamp_pb2.Timestamp
    next_attempt_time: _timestamp_pb2.Timestamp
    def __init__(self, delivery_id: _Optional[str] = ..., state: _Optional[_Union[WebhookDelivery.State, str]] = ..., attempts: _Optional[int] = ..., last_status_code: _Optional[int] = ..., last_error: _Optional[str] = ..., delivered_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., next_attempt_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class SubmitJobRequest(_message.Message):
    __slots__ = ("avatar_id", "audio", "options", "request_id", "labels", "audio_uri")
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    AVATAR_ID_FIELD_NUMBER: _ClassVar[int]
    AUDIO_FIELD_NUMBER: _ClassVar[int]
    OPTIONS_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    AUDIO_URI_FIELD_NUMBER: _ClassVar[int]
    avatar_id: str
    audio: bytes
    options: JobOptions
    request_id: str
    labels: _containers.ScalarMap[str, str]
    audio_uri: str
    def __init__(self, avatar_id: _Optional[str] = ..., audio: _Optional[bytes] = ..., options: _Optional[_Union[JobOptions, _Mapping]] = ..., request_id: _Optional[str] = ..., labels: _Optional[_Mapping[str, str]] = ..., audio_uri: _Optional[str] = ...) -> None: ...

class Job(_message.Message):
    __slots__ = ("id", "avatar_id", "state", "progress", "frames_done", "total_frames", "stage", "error", "error_code", "audio_seconds", "elapsed_seconds", "eta_seconds", "realtime_factor", "output_bytes", "models", "options", "create_time", "stage_seconds", "output_sha256", "labels", "webhook", "output_expire_time", "output_expired", "model")
    class StageSecondsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    ID_FIELD_NUMBER: _ClassVar[int]
    AVATAR_ID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    PROGRESS_FIELD_NUMBER: _ClassVar[int]
    FRAMES_DONE_FIELD_NUMBER: _ClassVar[int]
    TOTAL_FRAMES_FIELD_NUMBER: _ClassVar[int]
    STAGE_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    AUDIO_SECONDS_FIELD_NUMBER: _ClassVar[int]
    ELAPSED_SECONDS_FIELD_NUMBER: _ClassVar[int]
    ETA_SECONDS_FIELD_NUMBER: _ClassVar[int]
    REALTIME_FACTOR_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_BYTES_FIELD_NUMBER: _ClassVar[int]
    MODELS_FIELD_NUMBER: _ClassVar[int]
    OPTIONS_FIELD_NUMBER: _ClassVar[int]
    CREATE_TIME_FIELD_NUMBER: _ClassVar[int]
    STAGE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_SHA256_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    WEBHOOK_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_EXPIRE_TIME_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_EXPIRED_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    id: str
    avatar_id: str
    state: JobState
    progress: float
    frames_done: int
    total_frames: int
    stage: str
    error: str
    error_code: int
    audio_seconds: float
    elapsed_seconds: float
    eta_seconds: float
    realtime_factor: float
    output_bytes: int
    models: _containers.RepeatedCompositeFieldContainer[_common_pb2.ModelInfo]
    options: JobOptions
    create_time: _timestamp_pb2.Timestamp
    stage_seconds: _containers.ScalarMap[str, float]
    output_sha256: str
    labels: _containers.ScalarMap[str, str]
    webhook: WebhookDelivery
    output_expire_time: _timestamp_pb2.Timestamp
    output_expired: bool
    model: str
    def __init__(self, id: _Optional[str] = ..., avatar_id: _Optional[str] = ..., state: _Optional[_Union[JobState, str]] = ..., progress: _Optional[float] = ..., frames_done: _Optional[int] = ..., total_frames: _Optional[int] = ..., stage: _Optional[str] = ..., error: _Optional[str] = ..., error_code: _Optional[int] = ..., audio_seconds: _Optional[float] = ..., elapsed_seconds: _Optional[float] = ..., eta_seconds: _Optional[float] = ..., realtime_factor: _Optional[float] = ..., output_bytes: _Optional[int] = ..., models: _Optional[_Iterable[_Union[_common_pb2.ModelInfo, _Mapping]]] = ..., options: _Optional[_Union[JobOptions, _Mapping]] = ..., create_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., stage_seconds: _Optional[_Mapping[str, float]] = ..., output_sha256: _Optional[str] = ..., labels: _Optional[_Mapping[str, str]] = ..., webhook: _Optional[_Union[WebhookDelivery, _Mapping]] = ..., output_expire_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., output_expired: _Optional[bool] = ..., model: _Optional[str] = ...) -> None: ...

class GetJobRequest(_message.Message):
    __slots__ = ("job_id",)
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    def __init__(self, job_id: _Optional[str] = ...) -> None: ...

class CancelJobRequest(_message.Message):
    __slots__ = ("job_id",)
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    def __init__(self, job_id: _Optional[str] = ...) -> None: ...

class ListJobsRequest(_message.Message):
    __slots__ = ("page_size", "page_token", "states", "create_after", "create_before", "label_selector")
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    STATES_FIELD_NUMBER: _ClassVar[int]
    CREATE_AFTER_FIELD_NUMBER: _ClassVar[int]
    CREATE_BEFORE_FIELD_NUMBER: _ClassVar[int]
    LABEL_SELECTOR_FIELD_NUMBER: _ClassVar[int]
    page_size: int
    page_token: str
    states: _containers.RepeatedScalarFieldContainer[JobState]
    create_after: _timestamp_pb2.Timestamp
    create_before: _timestamp_pb2.Timestamp
    label_selector: str
    def __init__(self, page_size: _Optional[int] = ..., page_token: _Optional[str] = ..., states: _Optional[_Iterable[_Union[JobState, str]]] = ..., create_after: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., create_before: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., label_selector: _Optional[str] = ...) -> None: ...

class ListJobsResponse(_message.Message):
    __slots__ = ("jobs", "next_page_token", "unreadable_job_ids")
    JOBS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    UNREADABLE_JOB_IDS_FIELD_NUMBER: _ClassVar[int]
    jobs: _containers.RepeatedCompositeFieldContainer[Job]
    next_page_token: str
    unreadable_job_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, jobs: _Optional[_Iterable[_Union[Job, _Mapping]]] = ..., next_page_token: _Optional[str] = ..., unreadable_job_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class DeleteJobRequest(_message.Message):
    __slots__ = ("job_id",)
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    def __init__(self, job_id: _Optional[str] = ...) -> None: ...

class DeleteJobResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class WatchJobRequest(_message.Message):
    __slots__ = ("job_id",)
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    def __init__(self, job_id: _Optional[str] = ...) -> None: ...

class JobEvent(_message.Message):
    __slots__ = ("job",)
    JOB_FIELD_NUMBER: _ClassVar[int]
    job: Job
    def __init__(self, job: _Optional[_Union[Job, _Mapping]] = ...) -> None: ...

class DownloadOutputRequest(_message.Message):
    __slots__ = ("job_id", "chunk_bytes")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    CHUNK_BYTES_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    chunk_bytes: int
    def __init__(self, job_id: _Optional[str] = ..., chunk_bytes: _Optional[int] = ...) -> None: ...

class GetOutputUrlRequest(_message.Message):
    __slots__ = ("job_id",)
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    def __init__(self, job_id: _Optional[str] = ...) -> None: ...

class GetOutputUrlResponse(_message.Message):
    __slots__ = ("url", "expire_time")
    URL_FIELD_NUMBER: _ClassVar[int]
    EXPIRE_TIME_FIELD_NUMBER: _ClassVar[int]
    url: str
    expire_time: _timestamp_pb2.Timestamp
    def __init__(self, url: _Optional[str] = ..., expire_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class DownloadOutputResponse(_message.Message):
    __slots__ = ("data", "total_bytes")
    DATA_FIELD_NUMBER: _ClassVar[int]
    TOTAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    data: bytes
    total_bytes: int
    def __init__(self, data: _Optional[bytes] = ..., total_bytes: _Optional[int] = ...) -> None: ...
