from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class PixelFormat(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    PIXEL_FORMAT_UNSPECIFIED: _ClassVar[PixelFormat]
    PIXEL_FORMAT_BGR24: _ClassVar[PixelFormat]
    PIXEL_FORMAT_JPEG: _ClassVar[PixelFormat]
    PIXEL_FORMAT_PNG: _ClassVar[PixelFormat]
PIXEL_FORMAT_UNSPECIFIED: PixelFormat
PIXEL_FORMAT_BGR24: PixelFormat
PIXEL_FORMAT_JPEG: PixelFormat
PIXEL_FORMAT_PNG: PixelFormat

class Image(_message.Message):
    __slots__ = ("width", "height", "format", "data")
    WIDTH_FIELD_NUMBER: _ClassVar[int]
    HEIGHT_FIELD_NUMBER: _ClassVar[int]
    FORMAT_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    width: int
    height: int
    format: PixelFormat
    data: bytes
    def __init__(self, width: _Optional[int] = ..., height: _Optional[int] = ..., format: _Optional[_Union[PixelFormat, str]] = ..., data: _Optional[bytes] = ...) -> None: ...

class Box(_message.Message):
    __slots__ = ("x1", "y1", "x2", "y2")
    X1_FIELD_NUMBER: _ClassVar[int]
    Y1_FIELD_NUMBER: _ClassVar[int]
    X2_FIELD_NUMBER: _ClassVar[int]
    Y2_FIELD_NUMBER: _ClassVar[int]
    x1: int
    y1: int
    x2: int
    y2: int
    def __init__(self, x1: _Optional[int] = ..., y1: _Optional[int] = ..., x2: _Optional[int] = ..., y2: _Optional[int] = ...) -> None: ...

class MelWindow(_message.Message):
    __slots__ = ("frame_index", "data")
    FRAME_INDEX_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    frame_index: int
    data: bytes
    def __init__(self, frame_index: _Optional[int] = ..., data: _Optional[bytes] = ...) -> None: ...

class ModelInfo(_message.Message):
    __slots__ = ("name", "backend", "precision")
    NAME_FIELD_NUMBER: _ClassVar[int]
    BACKEND_FIELD_NUMBER: _ClassVar[int]
    PRECISION_FIELD_NUMBER: _ClassVar[int]
    name: str
    backend: str
    precision: str
    def __init__(self, name: _Optional[str] = ..., backend: _Optional[str] = ..., precision: _Optional[str] = ...) -> None: ...
