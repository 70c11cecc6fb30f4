"""The audio stage in-process: Extract over gRPC with its windows checked byte for byte, decoder errors
through the worker processes, a decoder crash that fails only its own request, and first-come-first-
served extraction.

The gRPC tests share one server per worker setting (module scope): its event loop runs in a thread
and the tests call it with a plain channel. A spawned child imports the stage's modules anew (about
2 CPU-seconds), so pools are started as few times as possible.
"""

from __future__ import annotations

import asyncio
import logging
import pickle
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest

from lipline.v1 import audio_pb2, audio_pb2_grpc
from services.audio.extract import ClipExtractor, ExtractFn, decode_and_extract
from services.audio.service import AudioService
from services.audio.settings import AudioSettings
from services.media.audio import decode_audio
from services.media.mel import MelExtractor
from services.media.musetalk_wire import unpack_window
from services.media.whisper_mel import whisper_log_mel_segments
from services.media.wire import mel_to_bytes
from services.serving import errors
from services.serving.errors import InvalidMedia, TooLarge
from services.serving.metrics import Metrics
from tests.helpers.audio_files import encode_tone
from tests.helpers.crashing_extract import CRASH, crash_or_extract
from tests.helpers.running_service import RunningService
from tests.integration.util import eventually

REPO_ROOT = Path(__file__).resolve().parents[3]
MAX_SECONDS = 5.0  # the servers' max_audio_seconds: low, so a TooLarge is cheap to provoke
NOISE = np.random.default_rng(1).integers(0, 256, 16 * 1024, dtype=np.uint8).tobytes()


def clip(seconds: float, freq: float = 440.0) -> bytes:
    return encode_tone("wav", seconds, rate=22050, channels=1, freq=freq)


def expected_windows(data: bytes, fps: float = 25.0) -> list[bytes]:
    return [mel_to_bytes(w) for w in MelExtractor().run(decode_audio(data, 16000), fps)]


def decoder_error(data: bytes, max_seconds: float = MAX_SECONDS) -> errors.LiplineError:
    """What decoding `data` raises in this process: the error the service must pass on unchanged."""
    with pytest.raises(errors.LiplineError) as err:
        decode_audio(data, 16000, max_seconds)
    return err.value


@pytest.fixture(scope="module", autouse=True)
def children_import_the_tests() -> Iterator[None]:
    """Spawned children take the parent's sys.path; put the repository on it so they can import
    tests.helpers.crashing_extract (pytest's importlib mode imports the tests without it)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.syspath_prepend(str(REPO_ROOT))
        yield


class RunningAudio:
    """An AudioService on 127.0.0.1:<ephemeral>, its event loop in a thread of its own."""

    def __init__(self, processes: int, work: ExtractFn) -> None:
        self.settings = AudioSettings(
            host="127.0.0.1",
            port=0,
            metrics_port=-1,
            grace_s=1.0,
            max_audio_seconds=MAX_SECONDS,
            extract_processes=processes,
        )
        self.service = RunningService(lambda: AudioService(self.settings, Metrics("audio"), work=work), "audio-service")

    def __enter__(self) -> RunningAudio:
        self.stub = audio_pb2_grpc.AudioServiceStub(self.service.__enter__())
        return self

    def __exit__(self, *exc: object) -> None:
        self.service.__exit__(*exc)

    def extract(
        self, data: bytes, fps: float = 25.0, max_seconds: float = 0.0, whisper: bool = False
    ) -> list[audio_pb2.ExtractResponse]:
        options = audio_pb2.ExtractOptions(fps=fps, max_seconds=max_seconds, whisper=whisper)
        requests = [audio_pb2.ExtractRequest(options=options, data=data[:1024])]
        requests += [audio_pb2.ExtractRequest(data=data[i : i + 64 * 1024]) for i in range(1024, len(data), 64 * 1024)]
        return list(self.stub.Extract(iter(requests), timeout=60))

    def error(self, data: bytes, max_seconds: float = 0.0) -> grpc.RpcError:
        with pytest.raises(grpc.RpcError) as err:
            self.extract(data, max_seconds=max_seconds)
        return err.value


@pytest.fixture(scope="module", params=[0, 2], ids=["thread", "2-processes"])
def audio(request: pytest.FixtureRequest) -> Iterator[RunningAudio]:
    # The process pool runs the crashing work function (it holds each good clip briefly, then extracts
    # it for real), so the same server also answers the crash test; in-process a crash would kill pytest.
    work = crash_or_extract if request.param else decode_and_extract
    with RunningAudio(request.param, work) as running:
        yield running


def test_whisper_windows_follow_the_mel_windows_when_asked(audio: RunningAudio) -> None:
    """The musetalk tier's features: the clip's whisper log-mel (upstream's 30 s windows) as the
    lipsync-musetalk stage takes it, after every mel window; none unless asked."""
    data = clip(1.3, freq=300.0)
    responses = audio.extract(data, whisper=True)
    assert not any(r.whisper_windows for r in audio.extract(data))
    windows = [w for r in responses for w in r.whisper_windows]
    assert [w.data for r in responses for w in r.windows] == expected_windows(data)
    assert not responses[-1].windows and len(windows) == 1 and windows[0] == responses[-1].whisper_windows[0]
    samples = decode_audio(data, 16000)
    expected = whisper_log_mel_segments(samples).astype(np.float16)
    assert np.array_equal(unpack_window(windows[0]).full_columns(), expected[0].astype(np.float32))
    assert windows[0].positions == len(samples) * 50 // 16000 == 65


def test_windows_match_the_mel_pipeline_byte_for_byte(audio: RunningAudio) -> None:
    data = clip(1.3, freq=300.0)
    responses = audio.extract(data, fps=30.0)
    got = [w.data for r in responses for w in r.windows]
    assert got == expected_windows(data, fps=30.0)
    assert [w.frame_index for r in responses for w in r.windows] == list(range(len(got)))
    assert responses[0].total_frames == len(got) == 39  # round(1.3 s * 30 fps)
    assert responses[0].duration_seconds == pytest.approx(1.3, abs=1e-3)


def test_decoder_errors_keep_their_status_and_message(audio: RunningAudio) -> None:
    err = audio.error(NOISE)
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert err.details() == str(decoder_error(NOISE)) and "could not decode audio" in err.details()

    too_long = clip(MAX_SECONDS + 1.0)
    err = audio.error(too_long)
    assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    expected = decoder_error(too_long)
    assert isinstance(expected, TooLarge) and err.details() == str(expected)


def test_the_callers_lower_limit_applies(audio: RunningAudio) -> None:
    # The gateway sends its max_audio_seconds as ExtractOptions.max_seconds; the stage's own (here
    # MAX_SECONDS) caps any caller, so a higher one changes nothing.
    data = clip(2.0)
    err = audio.error(data, max_seconds=1.5)
    assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and err.details() == str(decoder_error(data, 1.5))
    assert len(audio.extract(data, max_seconds=2.0)) >= 1
    err = audio.error(clip(MAX_SECONDS + 1.0), max_seconds=10 * MAX_SECONDS)
    assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED


# Only with worker processes: a crash in the server's own process (extract_processes 0) would end it.
@pytest.mark.parametrize("audio", [2], indirect=True, ids=["2-processes"])
def test_a_decoder_crash_fails_only_its_request_and_the_server_stays_up(audio: RunningAudio) -> None:
    err = audio.error(CRASH + bytes(100))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "decoder process died" in err.details() and "SIGSEGV" in err.details() and "re-encode" in err.details()
    data = clip(0.5)
    assert [w.data for r in audio.extract(data) for w in r.windows] == expected_windows(data)


def test_a_crash_breaks_the_pool_but_only_the_culprit_fails(caplog: pytest.LogCaptureFixture) -> None:
    """3 good clips and 1 crashing one at once on 2 processes: the breakage fails every pending future
    of the pool; the good ones succeed on their retry and the pool is replaced once."""
    goods = [clip(0.4 + 0.1 * i, freq=200.0 + 100 * i) for i in range(4)]
    clips = ClipExtractor(2, crash_or_extract)

    async def main() -> list[object]:
        await clips.warm()
        uploads = [goods[0], goods[1], CRASH + b"EXIT", goods[2]]
        results = await asyncio.gather(*(clips.extract(u, 25.0, MAX_SECONDS) for u in uploads), return_exceptions=True)
        results.append(await clips.extract(goods[3], 25.0, MAX_SECONDS))  # the replaced pool serves
        return results

    try:
        with caplog.at_level(logging.WARNING, logger="services.audio.extract"):
            results = asyncio.run(main())
    finally:
        clips.close()
    crashed = results.pop(2)
    assert isinstance(crashed, InvalidMedia), crashed
    assert "decoder process died on this upload (exit code 1)" in str(crashed)
    for data, result in zip([goods[0], goods[1], goods[2], goods[3]], results, strict=True):
        assert isinstance(result, tuple), result
        windows, samples, _ = result
        assert [mel_to_bytes(w) for w in windows] == expected_windows(data)
        assert samples == len(decode_audio(data, 16000))
    replaced = [r for r in caplog.records if "started a new pool" in r.getMessage()]
    assert len(replaced) == 1, [r.getMessage() for r in caplog.records]


def _gone(pid: int) -> bool:
    """The process has exited (absent, or a zombie its new parent has not reaped yet)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def test_a_decoder_child_exits_when_its_parent_is_killed(tmp_path: Path) -> None:
    """A parent killed with SIGKILL cannot shut its pool down: its child must not wait on for ever."""
    parent_script = (
        "import asyncio, time\n"
        "from services.audio.extract import ClipExtractor\n"
        "clips = ClipExtractor(1)\n"
        "asyncio.run(clips.warm())\n"
        "print(*clips._executor._processes, flush=True)\n"
        "time.sleep(120)\n"
    )
    parent = subprocess.Popen([sys.executable, "-c", parent_script], stdout=subprocess.PIPE, text=True)
    try:
        (child,) = [int(pid) for pid in parent.stdout.readline().split()]
        assert not _gone(child)
    finally:
        parent.send_signal(signal.SIGKILL)
        parent.wait()
    eventually(lambda: _gone(child), timeout=30, what=f"decoder child {child} to exit after its parent")


def test_one_thread_extracts_clips_first_come_first_served() -> None:
    """The longest clip is sent first: in arrival order it is also done first, where clips that share
    the CPU (asyncio.to_thread) would finish shortest first."""
    uploads = [clip(seconds) for seconds in (3.0, 2.0, 1.0, 0.3)]
    clips = ClipExtractor(0)
    done: list[int] = []

    async def main() -> None:
        await clips.warm()
        tasks = [asyncio.create_task(clips.extract(u, 25.0, MAX_SECONDS)) for u in uploads]
        for i, task in enumerate(tasks):
            task.add_done_callback(lambda _, i=i: done.append(i))
        for task, data in zip(tasks, uploads, strict=True):
            windows, _, _ = await task
            assert len(windows) == len(expected_windows(data))

    try:
        asyncio.run(main())
    finally:
        clips.close()
    assert done == [0, 1, 2, 3]


@pytest.mark.parametrize(
    "cls", [c for c in vars(errors).values() if isinstance(c, type) and issubclass(c, errors.LiplineError)]
)
def test_domain_errors_cross_process_boundaries(cls: type[errors.LiplineError]) -> None:
    copy = pickle.loads(pickle.dumps(cls("the message; what to do")))
    assert type(copy) is cls and str(copy) == "the message; what to do" and copy.code == cls.code


@pytest.mark.parametrize("processes", [-1, 65])
def test_extract_processes_is_checked(processes: int) -> None:
    with pytest.raises(ValueError, match="extract_processes"):
        AudioSettings(extract_processes=processes).validate()
