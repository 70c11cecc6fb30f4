"""Bounded fuzzing of every decoder that reads bytes a client sent (Hypothesis).

Targets: `decode_audio` and `decode_avatar` on random bytes and on mutated real files (bytes flipped,
set, inserted, deleted, truncated, and 16/32-bit fields overwritten with sizes such as 0, 1, 30000 or
2**32-1, mostly in the header); `image_from_proto` on random `Image` messages; `unpack_generate_items`,
`PackedImages.from_pb` and `mel_from_bytes` on random messages, built from random field values and parsed
from random bytes with ``FromString``.

Property: whatever the input, only `LiplineError` subclasses (InvalidMedia, TooLarge...) escape, which
the server turns into INVALID_ARGUMENT / RESOURCE_EXHAUSTED; no other exception (an INTERNAL for
the client and a traceback in the log), no crash (a crash kills the test process), no hang (each
example has a deadline, and each test a pytest timeout), and memory stays bounded (each test's peak
RSS grows by less than `PEAK_BOUND`; the decoders run with small limits, so a correct decoder needs
a few MB).

Bound: `EXAMPLES` examples per test (default 500; 11 tests, so 5,500 examples), each within
`DEADLINE` (2 s; the slowest take ~10 ms), derandomized (the same examples every run, so CI never
flakes on a new random find). Measured: 8 s for the whole file on this 2-core machine, well inside
the 60 s budget. To fuzz longer by hand, with fresh random examples each run:

    LIPLINE_FUZZ_EXAMPLES=10000 .venv/bin/python -m pytest -q -p no:cacheprovider tests/unit/media/test_fuzz_decoders.py

(10,000 per test took 140 s here; the pytest timeout per test grows with the count). Found so far,
and fixed: a WAV naming a codec FFmpeg cannot decode (AttributeError, now InvalidMedia); a 5 KB PNG
whose IDAT claims 4 GB (OpenCV allocated it: 4 GB, 4.7 s); an 8 KB WAV whose LIST chunk claims
1.6 GB (FFmpeg zero-filled 845 MB). See test_decode_limits.py for their regression tests.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path

import cv2
import numpy as np
import pytest
from google.protobuf.message import DecodeError
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lipline.v1 import common_pb2, lipsync_pb2
from services.media.audio import decode_audio
from services.media.decode import decode_avatar
from services.media.packed import PackedImages
from services.media.wire import image_from_proto, mel_from_bytes, unpack_generate_items
from services.render.mp4 import Mp4Writer
from services.serving.errors import LiplineError
from tests.helpers.audio_files import can_encode, encode_tone

_BY_HAND = int(os.environ.get("LIPLINE_FUZZ_EXAMPLES", "0"))
EXAMPLES = _BY_HAND or 500
DEADLINE = timedelta(seconds=2)
PEAK_BOUND = 300 << 20  # bytes of peak RSS growth allowed per test
_TIMEOUT_S = max(60, EXAMPLES // 5)  # pytest-timeout per test: a hang inside one example fails here

FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=DEADLINE,
    derandomize=not _BY_HAND,
    database=None,  # no example database (Hypothesis keeps only a self-ignored .hypothesis/ cache)
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.function_scoped_fixture],
    print_blob=True,
)
pytestmark = pytest.mark.timeout(_TIMEOUT_S)

SAMPLES = Path(__file__).resolve().parents[3] / "samples"
AVATAR_LIMITS = {"max_frames": 30, "max_pixels": 320 * 320}


def _only_lipline_errors(call: Callable[[], object]) -> None:
    """The property: call() returns, or raises a LiplineError; anything else fails the example."""
    try:
        call()
    except LiplineError:
        pass


def _status(field: str) -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(field)


@pytest.fixture(autouse=True)
def bounded_memory() -> Iterator[None]:
    """Fails a test whose examples, together, raised the peak RSS by PEAK_BOUND or more."""
    try:
        with open("/proc/self/clear_refs", "w") as refs:
            refs.write("5")  # VmHWM := VmRSS
    except OSError:
        yield  # no way to reset the peak here: the other properties still hold
        return
    before = _status("VmRSS")
    yield
    growth = _status("VmHWM") - before
    assert growth < PEAK_BOUND, f"peak RSS grew by {growth >> 20} MB"


# --------------------------------------------------------------------------------------------------
# Seeds and mutations
# --------------------------------------------------------------------------------------------------


def _image(height: int, width: int) -> np.ndarray:
    y, x = np.mgrid[0:height, 0:width]
    return np.stack([x * 255 // (width - 1), y * 255 // (height - 1), (x ^ y) & 255], -1).astype(np.uint8)


def _mp4(path: Path) -> bytes:
    with Mp4Writer(path, 96, 80, 25.0, None, 16000, preset="ultrafast") as writer:
        for i in range(4):
            writer.write(np.roll(_image(80, 96), 7 * i, axis=1))
    return path.read_bytes()


def _avatar_seeds(tmp: Path) -> list[bytes]:
    image = _image(80, 96)
    seeds = [(SAMPLES / "avatar.jpg").read_bytes(), _mp4(tmp / "seed.mp4")]
    for ext, params in [
        (".png", []),
        (".jpg", [cv2.IMWRITE_JPEG_PROGRESSIVE, 1]),
        (".webp", []),
        (".bmp", []),
        (".gif", []),
    ]:
        seeds.append(cv2.imencode(ext, image, params)[1].tobytes())
    return seeds


def _audio_seeds() -> list[bytes]:
    return [
        encode_tone(fmt, 0.25, rate=16000, channels=1)
        for fmt in ("wav", "mp3", "flac", "m4a", "ogg")
        if can_encode(fmt)
    ]


# Values that turn a length, a count or a size field into a bomb, a zero or an overflow.
_INTERESTING = [0, 1, 2, 0x7F, 0xFF, 0x100, 0x7FFF, 0xFFFF, 30000, 0x10000, 0x7FFFFFFF, 0x80000000, 0xFFFFFFFF]


@st.composite
def mutated(draw: st.DrawFn, seeds: list[bytes]) -> bytes:
    """A seed with 1-8 mutations, most of them in its first 512 bytes (where the headers are)."""
    data = bytearray(draw(st.sampled_from(seeds)))
    for _ in range(draw(st.integers(1, 8))):
        end = max(len(data) - 1, 0)
        pos = draw(st.one_of(st.integers(0, min(end, 511)), st.integers(0, end)))
        op = draw(st.sampled_from(["flip", "set", "insert", "delete", "field", "field", "truncate"]))
        if op == "flip" and data:
            data[pos] ^= 1 << draw(st.integers(0, 7))
        elif op == "set" and data:
            data[pos] = draw(st.integers(0, 255))
        elif op == "insert":
            data[pos:pos] = draw(st.binary(min_size=1, max_size=16))
        elif op == "delete":
            del data[pos : pos + draw(st.integers(1, 16))]
        elif op == "field":
            value = draw(st.sampled_from(_INTERESTING))
            fmt = draw(st.sampled_from([">I", "<I", ">H", "<H"]))
            packed = struct.pack(fmt, value & (0xFFFF if "H" in fmt else 0xFFFFFFFF))
            data[pos : pos + len(packed)] = packed
        elif op == "truncate":
            del data[pos:]
    return bytes(data)


_random_bytes = st.binary(min_size=0, max_size=4096)


# --------------------------------------------------------------------------------------------------
# decode_audio
# --------------------------------------------------------------------------------------------------


@FUZZ
@given(data=_random_bytes)
def test_decode_audio_random_bytes(data: bytes) -> None:
    _only_lipline_errors(lambda: decode_audio(data, max_seconds=5.0))


_AUDIO_SEEDS = _audio_seeds()


@FUZZ
@given(data=mutated(_AUDIO_SEEDS), rate=st.sampled_from([16000, 48000]))
def test_decode_audio_mutated_files(data: bytes, rate: int) -> None:
    _only_lipline_errors(lambda: decode_audio(data, rate, max_seconds=5.0))


# --------------------------------------------------------------------------------------------------
# decode_avatar
# --------------------------------------------------------------------------------------------------


@FUZZ
@given(data=_random_bytes)
def test_decode_avatar_random_bytes(data: bytes) -> None:
    _only_lipline_errors(lambda: decode_avatar(data, **AVATAR_LIMITS))


@FUZZ
@given(data=st.data())
def test_decode_avatar_mutated_files(data: st.DataObject, avatar_seeds: list[bytes]) -> None:
    sample = data.draw(mutated(avatar_seeds))
    _only_lipline_errors(lambda: decode_avatar(sample, **AVATAR_LIMITS))


@FUZZ
@given(data=st.data())
def test_decode_avatar_mutated_files_default_limits(data: st.DataObject, avatar_seeds: list[bytes]) -> None:
    sample = data.draw(mutated(avatar_seeds))
    _only_lipline_errors(lambda: decode_avatar(sample))


@pytest.fixture(scope="module")
def avatar_seeds(tmp_path_factory: pytest.TempPathFactory) -> list[bytes]:
    return _avatar_seeds(tmp_path_factory.mktemp("seeds"))


# --------------------------------------------------------------------------------------------------
# image_from_proto
# --------------------------------------------------------------------------------------------------

_FORMATS = st.one_of(st.sampled_from(list(common_pb2.PixelFormat.values())), st.integers(0, 2**31 - 1))
_SIZES = st.one_of(st.integers(0, 64), st.integers(0, 2**32 - 1))
_ENCODED = [cv2.imencode(ext, _image(40, 56))[1].tobytes() for ext in (".png", ".jpg")]


@st.composite
def images(draw: st.DrawFn) -> common_pb2.Image:
    width, height = draw(_SIZES), draw(_SIZES)
    kind = draw(st.sampled_from(["random", "exact", "encoded"]))
    if kind == "exact" and width * height <= 4096:
        data = draw(st.binary(min_size=width * height * 3, max_size=width * height * 3))
    elif kind == "encoded":
        data = draw(mutated(_ENCODED))
    else:
        data = draw(_random_bytes)
    return common_pb2.Image(width=width, height=height, format=draw(_FORMATS), data=data)


@FUZZ
@given(msg=images())
def test_image_from_proto_random_messages(msg: common_pb2.Image) -> None:
    _only_lipline_errors(lambda: image_from_proto(msg, "item"))


@FUZZ
@given(wire=_random_bytes)
def test_image_from_proto_parsed_from_random_bytes(wire: bytes) -> None:
    try:
        msg = common_pb2.Image.FromString(wire)
    except DecodeError:
        return  # gRPC refuses such a message before any handler sees it
    _only_lipline_errors(lambda: image_from_proto(msg, "item"))


# --------------------------------------------------------------------------------------------------
# Generate items, generated faces, mel windows
# --------------------------------------------------------------------------------------------------

_INDICES = st.lists(st.integers(0, 2**32 - 1), max_size=6)
_MEL = 80 * 16 * 2


@st.composite
def generate_items(draw: st.DrawFn) -> lipsync_pb2.GenerateItems:
    frames = draw(_INDICES)
    crops = draw(st.one_of(st.just([0] * len(frames)), _INDICES))
    if draw(st.booleans()):  # the right byte count (random float16 bits: NaN and infinity too)
        mels = draw(st.binary(min_size=_MEL * len(frames), max_size=_MEL * len(frames)))
    else:
        mels = draw(st.binary(max_size=3 * _MEL))
    return lipsync_pb2.GenerateItems(frame_indices=frames, crop_indices=crops, mels=mels)


@st.composite
def generated_faces(draw: st.DrawFn) -> lipsync_pb2.GeneratedFaces:
    n = draw(st.integers(0, 4))
    widths = draw(st.lists(st.one_of(st.integers(0, 8), st.integers(0, 2**32 - 1)), min_size=n, max_size=n))
    heights = draw(st.lists(st.one_of(st.integers(0, 8), st.integers(0, 2**32 - 1)), min_size=n, max_size=n))
    indices = draw(st.one_of(st.just(list(range(n))), _INDICES))
    need = sum(w * h * 3 for w, h in zip(widths, heights))
    if need <= 4096 and draw(st.booleans()):
        data = draw(st.binary(min_size=need, max_size=need))
    else:
        data = draw(_random_bytes)
    return lipsync_pb2.GeneratedFaces(frame_indices=indices, widths=widths, heights=heights, data=data)


@FUZZ
@given(items=generate_items())
def test_unpack_generate_items_random_messages(items: lipsync_pb2.GenerateItems) -> None:
    _only_lipline_errors(lambda: unpack_generate_items(items))


@FUZZ
@given(faces=generated_faces())
def test_unpack_faces_random_messages(faces: lipsync_pb2.GeneratedFaces) -> None:
    _only_lipline_errors(lambda: PackedImages.from_pb(faces).arrays())


@FUZZ
@given(wire=_random_bytes, which=st.sampled_from(["items", "faces"]))
def test_unpack_parsed_from_random_bytes(wire: bytes, which: str) -> None:
    kind = lipsync_pb2.GenerateItems if which == "items" else lipsync_pb2.GeneratedFaces
    try:
        msg = kind.FromString(wire)
    except DecodeError:
        return
    _only_lipline_errors(lambda: unpack_generate_items(msg) if which == "items" else PackedImages.from_pb(msg).arrays())


@FUZZ
@given(data=st.one_of(st.binary(min_size=_MEL, max_size=_MEL), st.binary(max_size=2 * _MEL)))
def test_mel_from_bytes_random_bytes(data: bytes) -> None:
    _only_lipline_errors(lambda: mel_from_bytes(data))
