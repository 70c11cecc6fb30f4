"""Bad input gets a clear gRPC status with an actionable message, and the servers keep serving.

After every test an autouse fixture checks that every service's process is alive, report SERVING and
still answer a real call, so a request that crashed or wedged a server fails the test that sent it.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from typing import Any

import cv2
import grpc
import numpy as np
import pytest

from lipline.v1 import (
    audio_pb2,
    audio_pb2_grpc,
    common_pb2,
    gateway_pb2,
    lipsync_pb2,
    lipsync_pb2_grpc,
    superres_pb2,
    superres_pb2_grpc,
)
from services.gateway.client import LiplineClient
from services.local.cluster import LocalCluster
from services.media.wire import image_to_proto, mel_to_bytes, pack_generate_items
from tests.helpers.audio_files import encode_tone, multichannel_wav
from tests.helpers.video_files import encode_video
from tests.integration.util import assert_all_serving, eventually, rss_mb

MiB = 1 << 20
DEFAULT_MAX_MESSAGE = 64 * MiB  # ServiceSettings.max_message_bytes
DEFAULT_MAX_AUDIO = 50 * MiB  # GatewaySettings.max_audio_bytes
DEFAULT_MAX_AVATAR_FRAMES = 1500  # GatewaySettings.max_avatar_frames
DEFAULT_MAX_AVATAR_PIXELS = 1920 * 1080  # GatewaySettings.max_avatar_pixels


def expect_status(code: grpc.StatusCode, call: Callable[[], Any], *words: str) -> str:
    """Run `call`, require an RpcError with `code` whose details contain `words`; return the details."""
    with pytest.raises(grpc.RpcError) as err:
        result = call()
        if hasattr(result, "__iter__") and not isinstance(result, (bytes, str)):
            list(result)  # streaming responses: the status comes at the end of the stream
    details = err.value.details() or ""
    assert err.value.code() == code, (err.value.code(), details)
    assert "Traceback" not in details and 'File "' not in details, details
    for word in words:
        assert word.lower() in details.lower(), (word, details)
    return details


@pytest.fixture(scope="module")
def mclient(cluster: LocalCluster) -> Iterator[LiplineClient]:
    # Sends up to 128 MiB so the servers' 64 MiB limit is what gets tested.
    with LiplineClient(cluster.gateway_address, max_message_bytes=128 * MiB, timeout=120.0) as c:
        yield c


@pytest.fixture(scope="module")
def avatar(mclient: LiplineClient, avatar_bytes: bytes) -> gateway_pb2.Avatar:
    return mclient.create_avatar(avatar_bytes)


@pytest.fixture(autouse=True)
def still_serving(cluster: LocalCluster, mclient: LiplineClient, avatar: gateway_pb2.Avatar) -> Iterator[None]:
    yield
    assert_all_serving(cluster)
    assert mclient.stub.GetAvatar(gateway_pb2.GetAvatarRequest(avatar_id=avatar.id), timeout=10).id == avatar.id


def png(image: np.ndarray) -> bytes:
    ok, data = cv2.imencode(".png", image)
    assert ok
    return data.tobytes()


def submit(client: LiplineClient, avatar_id: str, audio: bytes, **options: Any) -> Callable[[], gateway_pb2.Job]:
    request = gateway_pb2.SubmitJobRequest(avatar_id=avatar_id, audio=audio, options=gateway_pb2.JobOptions(**options))
    return lambda: client.stub.SubmitJob(request, timeout=60)


# --------------------------------------------------------------------------------------------------
# Gateway: audio
# --------------------------------------------------------------------------------------------------


def test_empty_audio(mclient: LiplineClient, avatar: gateway_pb2.Avatar) -> None:
    expect_status(grpc.StatusCode.INVALID_ARGUMENT, submit(mclient, avatar.id, b""), "audio")


def test_corrupt_audio(mclient: LiplineClient, avatar: gateway_pb2.Avatar) -> None:
    noise = np.random.default_rng(1).integers(0, 256, 64 * 1024, dtype=np.uint8).tobytes()
    expect_status(grpc.StatusCode.INVALID_ARGUMENT, submit(mclient, avatar.id, noise), "audio", "WAV")


def test_truncated_audio(mclient: LiplineClient, avatar: gateway_pb2.Avatar) -> None:
    wav = encode_tone("wav", 1.0)
    expect_status(grpc.StatusCode.INVALID_ARGUMENT, submit(mclient, avatar.id, wav[:40]), "audio")


def test_audio_over_max_audio_bytes(mclient: LiplineClient, avatar: gateway_pb2.Avatar) -> None:
    too_big = bytes(DEFAULT_MAX_AUDIO + 1)  # fits in one message, over the audio limit
    expect_status(
        grpc.StatusCode.RESOURCE_EXHAUSTED, submit(mclient, avatar.id, too_big), "audio", str(DEFAULT_MAX_AUDIO)
    )


def test_audio_over_max_audio_seconds(mclient: LiplineClient, avatar: gateway_pb2.Avatar) -> None:
    long_wav = encode_tone("wav", 601.0, rate=8000, channels=1)  # 9.6 MB, over the 600 s limit
    expect_status(grpc.StatusCode.RESOURCE_EXHAUSTED, submit(mclient, avatar.id, long_wav), "600")


def test_message_over_gateway_limit(mclient: LiplineClient, avatar: gateway_pb2.Avatar) -> None:
    expect_status(grpc.StatusCode.RESOURCE_EXHAUSTED, submit(mclient, avatar.id, bytes(DEFAULT_MAX_MESSAGE + 1)))


@pytest.mark.parametrize("channels", [8, 16])
def test_multichannel_wav_renders(mclient: LiplineClient, avatar: gateway_pb2.Avatar, channels: int) -> None:
    # A 2 s WAV with 8 or 16 channels used to kill the gateway (SIGSEGV in the decoder); the autouse
    # fixture checks that every process is still alive and serving afterwards.
    job = mclient.submit_job(avatar.id, multichannel_wav(2.0, channels))
    done = mclient.wait(job.id)
    assert done.state == gateway_pb2.JOB_STATE_SUCCEEDED, done.error
    assert done.total_frames == 50


def test_too_many_channels_is_refused(mclient: LiplineClient, avatar: gateway_pb2.Avatar) -> None:
    expect_status(
        grpc.StatusCode.INVALID_ARGUMENT, submit(mclient, avatar.id, multichannel_wav(0.5, 64)), "64 channels"
    )


def test_bad_crf(mclient: LiplineClient, avatar: gateway_pb2.Avatar, speech_bytes: bytes) -> None:
    expect_status(grpc.StatusCode.INVALID_ARGUMENT, submit(mclient, avatar.id, speech_bytes, crf=52), "crf")


# --------------------------------------------------------------------------------------------------
# Gateway: avatars
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["grey", "noise"])
def test_avatar_without_face(mclient: LiplineClient, kind: str) -> None:
    if kind == "grey":
        image = np.full((240, 320, 3), 128, np.uint8)
    else:
        image = np.random.default_rng(2).integers(0, 256, (240, 320, 3), dtype=np.uint8)
    expect_status(grpc.StatusCode.INVALID_ARGUMENT, lambda: mclient.create_avatar(png(image)), "no face")


def test_corrupt_avatar(mclient: LiplineClient) -> None:
    noise = np.random.default_rng(3).integers(0, 256, 32 * 1024, dtype=np.uint8).tobytes()
    expect_status(grpc.StatusCode.INVALID_ARGUMENT, lambda: mclient.create_avatar(noise), "could not decode")


def test_truncated_avatar_jpeg(mclient: LiplineClient, avatar_bytes: bytes) -> None:
    expect_status(grpc.StatusCode.INVALID_ARGUMENT, lambda: mclient.create_avatar(avatar_bytes[:200]))


def test_empty_avatar(mclient: LiplineClient) -> None:
    expect_status(grpc.StatusCode.INVALID_ARGUMENT, lambda: mclient.create_avatar(b""), "empty")


def test_avatar_photo_fps_out_of_range(mclient: LiplineClient, avatar_bytes: bytes) -> None:
    expect_status(
        grpc.StatusCode.INVALID_ARGUMENT, lambda: mclient.create_avatar(avatar_bytes, photo_fps=100), "photo_fps"
    )


def gateway_log_lines(cluster: LocalCluster, text: str) -> list[str]:
    """The gateway's log lines (JSON) whose message contains `text`."""
    lines = cluster.processes["gateway"].log().splitlines()
    return [line for line in lines if line.startswith("{") and text in json.loads(line).get("msg", "")]


@pytest.mark.parametrize("video", ["1,501 frames at 128x128", "MPEG-TS growing from 64x64 to 2400x1600"])
def test_avatar_over_a_limit_met_only_while_decoding_answers_and_logs_once(
    mclient: LiplineClient, cluster: LocalCluster, video: str
) -> None:
    """Issue 29: a limit the container's header does not show is met while the gateway decodes the
    upload into DetectFaces' request stream; the call answers at once (it hung until the client's
    deadline, the gateway logging nothing) with the limit's status, and the gateway logs it once."""
    if video.startswith("1,501"):
        data = encode_video("mp4", (128, 128), DEFAULT_MAX_AVATAR_FRAMES + 1)
        code, words = grpc.StatusCode.RESOURCE_EXHAUSTED, (f"more than {DEFAULT_MAX_AVATAR_FRAMES} frames", "limit")
    else:
        data = encode_video("mpegts", (64, 64), 200) + encode_video("mpegts", (2400, 1600), 20)
        code, words = grpc.StatusCode.INVALID_ARGUMENT, (f"limited to {DEFAULT_MAX_AVATAR_PIXELS} pixels",)
    started = time.monotonic()
    details = expect_status(code, lambda: mclient.create_avatar(data, timeout=60), *words)
    print(f"{video}: {code.name} after {time.monotonic() - started:.1f} s")
    logged = eventually(lambda: gateway_log_lines(cluster, details), timeout=10, what="the gateway's log line")
    assert len(logged) == 1, logged
    assert json.loads(logged[0])["msg"] == f"CreateAvatar failed: {details}"


@pytest.mark.parametrize("avatar_id", ["0123456789abcdef01234567", "../../etc", ""])
def test_unknown_avatar(mclient: LiplineClient, speech_bytes: bytes, avatar_id: str) -> None:
    stub = mclient.stub
    expect_status(
        grpc.StatusCode.NOT_FOUND, lambda: stub.GetAvatar(gateway_pb2.GetAvatarRequest(avatar_id=avatar_id)), "avatar"
    )
    expect_status(
        grpc.StatusCode.NOT_FOUND, lambda: stub.DeleteAvatar(gateway_pb2.DeleteAvatarRequest(avatar_id=avatar_id))
    )
    expect_status(grpc.StatusCode.NOT_FOUND, submit(mclient, avatar_id, speech_bytes), "avatar")


# --------------------------------------------------------------------------------------------------
# Gateway: jobs
# --------------------------------------------------------------------------------------------------


def test_unknown_job(mclient: LiplineClient) -> None:
    stub, job_id = mclient.stub, "doesnotexist0000"
    expect_status(grpc.StatusCode.NOT_FOUND, lambda: stub.GetJob(gateway_pb2.GetJobRequest(job_id=job_id)), job_id)
    expect_status(
        grpc.StatusCode.NOT_FOUND, lambda: stub.CancelJob(gateway_pb2.CancelJobRequest(job_id=job_id)), job_id
    )
    expect_status(grpc.StatusCode.NOT_FOUND, lambda: stub.WatchJob(gateway_pb2.WatchJobRequest(job_id=job_id)), job_id)
    expect_status(
        grpc.StatusCode.NOT_FOUND, lambda: stub.DownloadOutput(gateway_pb2.DownloadOutputRequest(job_id=job_id)), job_id
    )


def test_download_of_unfinished_job(mclient: LiplineClient, avatar: gateway_pb2.Avatar, cluster: LocalCluster) -> None:
    # 60 s of audio = 1,500 frames: seconds of work, so the job is surely not finished yet. It is
    # rendered as 75 segments (the session cluster's are 0.8 s): a cancel removes every one.
    job = mclient.submit_job(avatar.id, encode_tone("wav", 60.0, rate=16000, channels=1))
    stub = mclient.stub
    download = lambda: stub.DownloadOutput(gateway_pb2.DownloadOutputRequest(job_id=job.id))  # noqa: E731
    expect_status(grpc.StatusCode.FAILED_PRECONDITION, download, "SUCCEEDED")

    def rendering() -> gateway_pb2.Job | None:  # cancel mid-render, with the part files open
        now = stub.GetJob(gateway_pb2.GetJobRequest(job_id=job.id))
        return now if now.frames_done >= 50 else None

    now = eventually(rendering, timeout=60, what="50 frames of the job", every=0.05)
    assert now.state == gateway_pb2.JOB_STATE_RUNNING and now.frames_done < now.total_frames
    cancelled = stub.CancelJob(gateway_pb2.CancelJobRequest(job_id=job.id), timeout=30)
    assert cancelled.state == gateway_pb2.JOB_STATE_CANCELLED
    assert cancelled.error_code == grpc.StatusCode.CANCELLED.value[0]
    assert mclient.wait(job.id).state == gateway_pb2.JOB_STATE_CANCELLED
    expect_status(grpc.StatusCode.FAILED_PRECONDITION, download, "CANCELLED")
    # Workers drop the job's segments within a heartbeat; nothing of it is left in the blob store.
    job_blobs = cluster.blob_dir / "jobs" / job.id
    eventually(
        lambda: not job_blobs.exists() or not any(job_blobs.rglob("*")),
        timeout=10,
        what=f"the blobs of job {job.id} to be removed",
    )
    assert not (cluster.blob_dir / "outputs" / f"{job.id}.mp4").exists()


# --------------------------------------------------------------------------------------------------
# Stages called directly with malformed messages
# --------------------------------------------------------------------------------------------------


def extract(stub: audio_pb2_grpc.AudioServiceStub, audio: bytes, fps: float) -> list[audio_pb2.ExtractResponse]:
    return list(
        stub.Extract(
            iter([audio_pb2.ExtractRequest(options=audio_pb2.ExtractOptions(fps=fps), data=audio)]), timeout=60
        )
    )


def test_audio_stage_fps(audio_stub: audio_pb2_grpc.AudioServiceStub) -> None:
    wav = encode_tone("wav", 1.0, rate=16000, channels=1)
    responses = extract(audio_stub, wav, 0)  # unset = 25 fps
    assert responses[0].total_frames == 25 == sum(len(r.windows) for r in responses)
    assert responses[0].duration_seconds == pytest.approx(1.0)
    expect_status(grpc.StatusCode.INVALID_ARGUMENT, lambda: extract(audio_stub, wav, 1000), "fps")
    expect_status(grpc.StatusCode.INVALID_ARGUMENT, lambda: extract(audio_stub, wav, -5), "fps")


def test_audio_stage_bad_audio(audio_stub: audio_pb2_grpc.AudioServiceStub) -> None:
    expect_status(grpc.StatusCode.INVALID_ARGUMENT, lambda: extract(audio_stub, b"", 25), "audio")
    expect_status(grpc.StatusCode.INVALID_ARGUMENT, lambda: extract(audio_stub, b"RIFF" + bytes(100), 25), "audio")


@pytest.mark.parametrize("channels", [8, 16])
def test_audio_stage_multichannel_wav(audio_stub: audio_pb2_grpc.AudioServiceStub, channels: int) -> None:
    responses = extract(audio_stub, multichannel_wav(2.0, channels), 25)  # used to kill the audio stage
    assert responses[0].total_frames == 50 == sum(len(r.windows) for r in responses)


def test_audio_stage_message_over_limit(audio_stub: audio_pb2_grpc.AudioServiceStub) -> None:
    expect_status(grpc.StatusCode.RESOURCE_EXHAUSTED, lambda: extract(audio_stub, bytes(DEFAULT_MAX_MESSAGE + 1), 25))


FACE = np.full((96, 96, 3), 100, np.uint8)
MEL = mel_to_bytes(np.zeros((80, 16), np.float32))


def generate(stub: lipsync_pb2_grpc.LipSyncServiceStub, *requests: lipsync_pb2.GenerateRequest) -> list:
    return list(stub.Generate(iter(requests), timeout=60))


def crop_request(image: common_pb2.Image, index: int = 0) -> lipsync_pb2.GenerateRequest:
    return lipsync_pb2.GenerateRequest(crops=[lipsync_pb2.ReferenceCrop(crop_index=index, image=image)])


def item_request(crop_index: int = 0, mel: bytes = MEL) -> lipsync_pb2.GenerateRequest:
    return lipsync_pb2.GenerateRequest(items=pack_generate_items([0], [crop_index], [mel]))


def test_lipsync_generate_valid(lipsync_stub: lipsync_pb2_grpc.LipSyncServiceStub) -> None:
    (response,) = generate(lipsync_stub, crop_request(image_to_proto(FACE)), item_request())
    assert response.model.name == "procedural"
    assert list(response.faces.frame_indices) == [0] and list(response.faces.widths) == [96]


def test_lipsync_item_names_unsent_crop(lipsync_stub: lipsync_pb2_grpc.LipSyncServiceStub) -> None:
    expect_status(grpc.StatusCode.INVALID_ARGUMENT, lambda: generate(lipsync_stub, item_request(7)), "crop 7")
    expect_status(
        grpc.StatusCode.INVALID_ARGUMENT,
        lambda: generate(lipsync_stub, crop_request(image_to_proto(FACE)), item_request(1)),
        "crop 1",
    )


def test_lipsync_bad_images(lipsync_stub: lipsync_pb2_grpc.LipSyncServiceStub) -> None:
    good = image_to_proto(FACE)
    short = common_pb2.Image(width=96, height=96, format=common_pb2.PIXEL_FORMAT_BGR24, data=good.data[:-1])
    expect_status(
        grpc.StatusCode.INVALID_ARGUMENT, lambda: generate(lipsync_stub, crop_request(short), item_request()), "BGR24"
    )
    small = image_to_proto(FACE[:64, :64])
    expect_status(
        grpc.StatusCode.INVALID_ARGUMENT, lambda: generate(lipsync_stub, crop_request(small), item_request()), "96x96"
    )
    bad_png = common_pb2.Image(width=96, height=96, format=common_pb2.PIXEL_FORMAT_PNG, data=b"not a png")
    expect_status(
        grpc.StatusCode.INVALID_ARGUMENT, lambda: generate(lipsync_stub, crop_request(bad_png), item_request()), "PNG"
    )
    unknown = common_pb2.Image(width=96, height=96, format=99, data=good.data)
    expect_status(
        grpc.StatusCode.INVALID_ARGUMENT,
        lambda: generate(lipsync_stub, crop_request(unknown), item_request()),
        "format",
    )


def test_poisoned_generate_stream_fails_alone(
    lipsync_stub: lipsync_pb2_grpc.LipSyncServiceStub,
    mclient: LiplineClient,
    avatar: gateway_pb2.Avatar,
    speech_bytes: bytes,
) -> None:
    # A stream asking for a 65535x65535 paste size, sent while three normal jobs run, used to fail
    # all three (its item failed the shared batch). Now it fails alone, at the edge.
    jobs = [mclient.submit_job(avatar.id, speech_bytes) for _ in range(3)]
    poisoned = crop_request(image_to_proto(FACE))
    poisoned.crops[0].paste_width = poisoned.crops[0].paste_height = 65535
    for _ in range(3):
        expect_status(
            grpc.StatusCode.INVALID_ARGUMENT, lambda: generate(lipsync_stub, poisoned, item_request()), "paste size"
        )
        nan_mel = np.zeros((80, 16), np.float32)
        nan_mel[3, 4] = np.nan
        expect_status(
            grpc.StatusCode.INVALID_ARGUMENT,
            lambda: generate(lipsync_stub, crop_request(image_to_proto(FACE)), item_request(mel=mel_to_bytes(nan_mel))),
            "NaN",
        )
    for job in jobs:
        done = mclient.wait(job.id)
        assert done.state == gateway_pb2.JOB_STATE_SUCCEEDED, done.error


def test_lipsync_bad_mel(lipsync_stub: lipsync_pb2_grpc.LipSyncServiceStub) -> None:
    mel = b"\0" * 100
    expect_status(
        grpc.StatusCode.INVALID_ARGUMENT,
        lambda: generate(lipsync_stub, crop_request(image_to_proto(FACE)), item_request(mel=mel)),
        "mel",
    )


def test_lipsync_detect_faces_bad_streams(lipsync_stub: lipsync_pb2_grpc.LipSyncServiceStub) -> None:
    def detect(*requests: lipsync_pb2.DetectFacesRequest) -> list:
        return list(lipsync_stub.DetectFaces(iter(requests), timeout=60))

    def frames(*shapes: tuple[int, int]) -> lipsync_pb2.DetectFacesRequest:
        return lipsync_pb2.DetectFacesRequest(
            frames=[
                lipsync_pb2.IndexedFrame(index=i, image=image_to_proto(np.zeros((h, w, 3), np.uint8)))
                for i, (h, w) in enumerate(shapes)
            ]
        )

    expect_status(grpc.StatusCode.INVALID_ARGUMENT, lambda: detect(), "no frames")
    expect_status(grpc.StatusCode.INVALID_ARGUMENT, lambda: detect(frames((64, 64), (32, 64))), "same size")
    bad_pads = frames((64, 64))
    bad_pads.options.pads.extend([1, 2, 3])
    expect_status(grpc.StatusCode.INVALID_ARGUMENT, lambda: detect(bad_pads), "pads")
    (ok,) = detect(frames((64, 64)))
    assert [f.found for f in ok.faces] == [False]


@pytest.mark.parametrize(
    ("pads", "field", "bound"),
    [
        ([-10000, 10, 0, 0], "pads.top", "0..64"),
        ([0, 65, 0, 0], "pads.bottom", "0..64"),
        ([0, 10, -1, 0], "pads.left", "0..80"),
        ([0, 0, 0, 81], "pads.right", "0..80"),
    ],
)
def test_lipsync_detect_faces_pads_out_of_range(
    lipsync_stub: lipsync_pb2_grpc.LipSyncServiceStub, pads: list[int], field: str, bound: str
) -> None:
    # On main pads of -10000 answered OK with a degenerate box (issue 17, item 9).
    request = lipsync_pb2.DetectFacesRequest(
        frames=[lipsync_pb2.IndexedFrame(index=0, image=image_to_proto(np.zeros((64, 80, 3), np.uint8)))]
    )
    request.options.pads.extend(pads)
    expect_status(
        grpc.StatusCode.INVALID_ARGUMENT,
        lambda: list(lipsync_stub.DetectFaces(iter([request]), timeout=60)),
        field,
        bound,
    )


def test_lipsync_detect_faces_frame_indices_in_order(lipsync_stub: lipsync_pb2_grpc.LipSyncServiceStub) -> None:
    image = image_to_proto(np.zeros((64, 64, 3), np.uint8))
    request = lipsync_pb2.DetectFacesRequest(
        frames=[lipsync_pb2.IndexedFrame(index=0, image=image), lipsync_pb2.IndexedFrame(index=4000000000, image=image)]
    )
    expect_status(
        grpc.StatusCode.INVALID_ARGUMENT,
        lambda: list(lipsync_stub.DetectFaces(iter([request]), timeout=60)),
        "frame index 4000000000",
        "1",
    )


def upscale(stub: superres_pb2_grpc.SuperResServiceStub, *items: superres_pb2.UpscaleItem) -> list:
    return list(stub.Upscale(iter([superres_pb2.UpscaleRequest(items=list(items))]), timeout=60))


def test_superres_bad_items(superres_stub: superres_pb2_grpc.SuperResServiceStub) -> None:
    good = image_to_proto(FACE)
    (ok,) = upscale(superres_stub, superres_pb2.UpscaleItem(index=3, image=good, out_width=120, out_height=130))
    assert ok.model.name == "lanczos"
    assert [(i.index, i.image.width, i.image.height) for i in ok.items] == [(3, 120, 130)]
    wrong = common_pb2.Image(width=97, height=96, format=common_pb2.PIXEL_FORMAT_BGR24, data=good.data)
    expect_status(
        grpc.StatusCode.INVALID_ARGUMENT,
        lambda: upscale(superres_stub, superres_pb2.UpscaleItem(index=5, image=wrong)),
        "item 5",
        "bytes",
    )
    expect_status(
        grpc.StatusCode.INVALID_ARGUMENT,
        lambda: upscale(superres_stub, superres_pb2.UpscaleItem(index=6, image=good, out_width=5000, out_height=96)),
        "item 6",
    )
    empty = common_pb2.Image(width=0, height=0, format=common_pb2.PIXEL_FORMAT_BGR24)
    expect_status(
        grpc.StatusCode.INVALID_ARGUMENT,
        lambda: upscale(superres_stub, superres_pb2.UpscaleItem(index=7, image=empty)),
        "item 7",
    )


# --------------------------------------------------------------------------------------------------
# Decompression bombs against the running processes: refused from the header, memory unchanged
# --------------------------------------------------------------------------------------------------


def test_png_bomb_avatar_is_refused_fast_and_costs_no_memory(mclient: LiplineClient, cluster: LocalCluster) -> None:
    from tests.helpers.bombs import png_claiming

    bomb = png_claiming(30000, 30000)  # 3 MiB that decode to 2.7 GB
    pid = cluster.processes["gateway"].process.pid
    before = rss_mb(pid)
    started = time.monotonic()
    expect_status(grpc.StatusCode.RESOURCE_EXHAUSTED, lambda: mclient.create_avatar(bomb), "30000x30000", "limit")
    assert time.monotonic() - started < 5.0  # from the header: decoding it would take far longer (and 2.7 GB)
    assert rss_mb(pid) - before < 100


def test_png_bomb_item_to_upscale_is_refused_from_its_header(
    superres_stub: superres_pb2_grpc.SuperResServiceStub, cluster: LocalCluster
) -> None:
    from tests.helpers.bombs import png_claiming

    item = superres_pb2.UpscaleItem(
        index=9,
        image=common_pb2.Image(
            width=16000, height=16000, format=common_pb2.PIXEL_FORMAT_PNG, data=png_claiming(16000, 16000)
        ),
    )
    pid = cluster.processes["superres"].process.pid
    before = rss_mb(pid)
    started = time.monotonic()
    expect_status(
        grpc.StatusCode.INVALID_ARGUMENT, lambda: upscale(superres_stub, item), "item 9", "16000x16000", "2048"
    )
    assert time.monotonic() - started < 5.0  # from the header, not by decoding
    assert rss_mb(pid) - before < 100
