"""The musetalk tier end to end (issue 30, items 1, 3, 4, 6 and 9): avatars created with
model=musetalk (a photo and a template video prepared into the avatar's pack: latents and masks),
their jobs and live sessions, through real processes on 127.0.0.1 with the lipsync-musetalk stage (its
weight-free stand-in), once on SQLite and once on PostgreSQL: one cluster per store for the module.
A deployment without the stage refuses the tier FAILED_PRECONDITION; an unknown tier is INVALID_ARGUMENT.

What the stand-in makes is known (services/lipsync/musetalk/standin.py): the reference crop blurred
to its 32x32 latent detail, with a dark mouth as open as the audio is loud; the compositor blends it
through the avatar's alpha mask (the lower face only), and the gate (the clip's speech envelope) shows
the template's own mouth where the envelope is shut. So: the upper face and everything outside the
box is the template within the codec floor, silent frames are the template, speech frames are the
generated mouth, and its opening changes from frame to frame.
"""

from __future__ import annotations

import dataclasses
import json
import secrets
from collections.abc import Iterator
from pathlib import Path

import av
import cv2
import grpc
import numpy as np
import pytest

from lipline.v1 import gateway_pb2, session_pb2
from services.gateway.client import LiplineClient
from services.gateway.live_client import pcm_chunks, pcm_of_audio, run_session, write_mp4
from services.local.cluster import LocalCluster
from services.media.decode import decode_avatar
from services.media.probe import probe_media
from services.media.speech import gate_weights
from services.media.timeline import loop_frame
from services.render.mp4 import Mp4Writer
from tests.helpers.video_files import write_shifted_video
from tests.integration.test_live import Stream
from tests.integration.test_pipeline import expected_openings, mean_abs_diff
from tests.integration.util import SAMPLES, assert_audio_locked, cut_wav, start_cluster

FPS = 25
CRF = 12  # near-lossless: a template frame right after speech must not read as changed through the residual
CODEC_FLOOR = 3.0  # mean abs difference, levels: H.264 at this crf on the grainy photo (~1-2)
SILENT_FLOOR = 4.0  # the mouth of a template frame shown after speech frames (P-frames: ~2.5)


KEYS = {"acme": secrets.token_urlsafe(24), "bob": secrets.token_urlsafe(24)}
MAX_AUDIO_S = 6.0  # the gateway's limit, low so a refusal is cheap


@pytest.fixture(scope="module")
def tier(job_store_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """A cluster serving the musetalk tier (the stand-in), one render worker and one live worker; two
    tenants (API keys acme and bob)."""
    workdir = tmp_path_factory.mktemp("musetalk-tier")
    (workdir / "api-keys").write_text("".join(f"{name}:{key}\n" for name, key in KEYS.items()))
    replicas = {"lipsync-musetalk": 1, "render": 1, "live": 1}
    gateway = [  # the 2.4 s speech in 3 segments: the join is covered
        "--segment-seconds=0.8",
        f"--api-keys-file={workdir / 'api-keys'}",
        f"--max-audio-seconds={MAX_AUDIO_S}",
    ]
    with start_cluster(
        workdir / "cluster", job_store=job_store_url, replicas=replicas, extra_args={"gateway": gateway}
    ) as cluster:
        yield cluster


@pytest.fixture(scope="module")
def tier_client(tier: LocalCluster) -> Iterator[LiplineClient]:
    with LiplineClient(tier.gateway_address, timeout=180.0, api_key=KEYS["acme"]) as c:
        yield c


@pytest.fixture(scope="module")
def bob(tier: LocalCluster) -> Iterator[LiplineClient]:
    with LiplineClient(tier.gateway_address, timeout=60.0, api_key=KEYS["bob"]) as c:
        yield c


def stored_meta(cluster: LocalCluster, avatar_id: str) -> dict:
    return json.loads((cluster.blob_dir / "avatars" / avatar_id / "meta.json").read_text())


@dataclasses.dataclass
class Render:
    job: gateway_pb2.Job
    info: dict
    frames: list[np.ndarray]  # decoded BGR


def render(client: LiplineClient, avatar_id: str, audio: bytes, out: Path, **options: object) -> Render:
    job = client.wait(client.submit_job(avatar_id, audio, crf=CRF, **options).id)  # type: ignore[arg-type]
    assert job.state == gateway_pb2.JOB_STATE_SUCCEEDED, job.error
    client.download(job.id, out)
    with av.open(str(out)) as container:
        frames = [f.to_ndarray(format="bgr24") for f in container.decode(video=0)]
    return Render(job, probe_media(out), frames)


def regions(box: list[int]) -> tuple[tuple[slice, slice], tuple[slice, slice]]:
    """(upper face, mouth) of a MuseTalk box: the rows above its middle less the mask's blur, and the
    stand-in's mouth (centre at 196/256 of the box, 30/256 to each side)."""
    x1, y1, x2, y2 = box
    w, h = x2 - x1, y2 - y1
    upper = (slice(y1, y1 + int(0.35 * h)), slice(x1, x2))
    mouth = (
        slice(y1 + int(176 / 256 * h), y1 + int(216 / 256 * h)),
        slice(x1 + int(98 / 256 * w), x1 + int(158 / 256 * w)),
    )
    return upper, mouth


def encoded_alone(image: np.ndarray, folder: Path) -> np.ndarray:
    """The template as the pipeline encodes it (the compositor's I420, x264 at CRF) with nothing pasted:
    the codec floor's reference."""
    path = folder / "template.mp4"
    with Mp4Writer(path, image.shape[1], image.shape[0], FPS, None, 16_000, crf=CRF) as writer:
        writer.write(image)
    with av.open(str(path)) as container:
        return next(f.to_ndarray(format="bgr24") for f in container.decode(video=0))


@pytest.fixture(scope="module")
def photo(tier_client: LiplineClient) -> gateway_pb2.Avatar:
    avatar = tier_client.create_avatar((SAMPLES / "avatar.jpg").read_bytes(), "photo", model="musetalk")
    assert avatar.model == "musetalk"
    return avatar


@pytest.fixture(scope="module")
def photo_renders() -> dict[bool, Render]:
    """The photo's renders by super_resolution, made once per cluster by `photo_job`."""
    return {}


@pytest.fixture(params=[False, True], ids=["no-sr", "sr"])
def photo_job(
    request: pytest.FixtureRequest,
    photo_renders: dict[bool, Render],
    tier_client: LiplineClient,
    photo: gateway_pb2.Avatar,
    speech_bytes: bytes,
    tmp_path_factory: pytest.TempPathFactory,
) -> Render:
    # A function-scoped parameter: as a module-scoped one, pytest interleaved it with the store's and
    # started the tier's cluster again for each switch (five starts instead of two).
    if request.param not in photo_renders:
        out = tmp_path_factory.mktemp("musetalk-job") / "out.mp4"
        photo_renders[request.param] = render(tier_client, photo.id, speech_bytes, out, super_resolution=request.param)
    return photo_renders[request.param]


# --------------------------------------------------------------------------------------------------
# Avatars of the tier
# --------------------------------------------------------------------------------------------------


def pack(cluster: LocalCluster, avatar_id: str) -> tuple[dict, np.ndarray, np.ndarray, list[str]]:
    """The avatar's meta, latents and masks as stored, and its blobs' names."""
    folder = cluster.blob_dir / "avatars" / avatar_id
    names = sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())
    meta = json.loads((folder / "meta.json").read_text())
    return meta, np.load(folder / "musetalk" / "latents.npy"), np.load(folder / "musetalk" / "masks.npy"), names


def test_a_photo_avatar_of_the_tier_is_prepared_stored_and_listed_by_it(
    tier: LocalCluster, tier_client: LiplineClient, photo: gateway_pb2.Avatar
) -> None:
    data = (SAMPLES / "avatar.jpg").read_bytes()
    avatar = photo
    assert (avatar.model, avatar.frame_count, avatar.faces_found) == ("musetalk", 1, 1)
    meta, latents, masks, names = pack(tier, avatar.id)
    assert names == ["meta.json", "musetalk/latents.npy", "musetalk/masks.npy", "source"]  # no Wav2Lip crops
    assert meta["model"] == "musetalk" and meta["prep"]["box_source"] == "face-detector"
    assert meta["prep"]["model"] == "face-detector+musetalk-standin+ellipse"
    assert latents.shape == (1, 8, 32, 32) and latents.dtype == np.float16 and np.isfinite(latents).all()
    assert masks.shape == (1, 256, 256) and masks.dtype == np.uint8 and masks[0, 160:].max() == 255
    x1, y1, x2, y2 = meta["boxes"][0]
    assert x1 < 223 < x2 and y1 < 118 < y2 and len(meta["mask_boxes"][0]) == 4
    assert tier_client.get_avatar(avatar.id).model == "musetalk"
    assert (
        tier_client.create_avatar(data, "again", model="musetalk").id == avatar.id
    )  # the same upload, the same avatar
    plain = tier_client.create_avatar(data, "photo")  # the same bytes for the default tier: another avatar
    assert plain.id != avatar.id and plain.model == "wav2lip"
    assert avatar.id in [a.id for a in tier_client.list_avatars(model="musetalk")]
    assert plain.id not in [a.id for a in tier_client.list_avatars(model="musetalk")]
    assert {a.id for a in tier_client.list_avatars()} >= {avatar.id, plain.id}


@dataclasses.dataclass
class Video:
    avatar: gateway_pb2.Avatar
    frames: list[np.ndarray]  # the template as decoded


@pytest.fixture(scope="module")
def video(tier_client: LiplineClient, tmp_path_factory: pytest.TempPathFactory) -> Video:
    """A template video avatar of the tier: the photo moving right 4 px a frame, then a grey frame (no face)."""
    folder = tmp_path_factory.mktemp("musetalk-video")
    photo = cv2.imread(str(SAMPLES / "avatar.jpg"))
    shifted = write_shifted_video(folder / "shifted.mp4", photo, frames=6, step=4)
    with Mp4Writer(folder / "template.mp4", photo.shape[1], photo.shape[0], FPS, None, 16_000, crf=10) as writer:
        for frame in [*shifted, np.full_like(shifted[0], 90)]:
            writer.write(frame)
    data = (folder / "template.mp4").read_bytes()
    return Video(tier_client.create_avatar(data, "video", model="musetalk"), decode_avatar(data)[0])


def test_a_video_avatar_of_the_tier_keeps_a_row_per_face_and_passes_faceless_frames(
    tier: LocalCluster, video: Video
) -> None:
    avatar = video.avatar
    assert (avatar.model, avatar.frame_count, avatar.faces_found, avatar.fps) == ("musetalk", 7, 6, 25.0)
    meta, latents, masks, _ = pack(tier, avatar.id)
    assert meta["boxes"][6] is None and meta["mask_boxes"][6] is None
    assert latents.shape == (6, 8, 32, 32) and masks.shape == (6, 256, 256)
    lefts = [meta["boxes"][i][0] for i in range(6)]
    assert lefts == sorted(lefts) and lefts[-1] > lefts[0]  # the boxes follow the moving face
    assert np.isfinite(latents).all() and all(m[160:].max() == 255 for m in masks)  # a face and an alpha per row


def test_an_unknown_tier_is_invalid_argument(tier_client: LiplineClient) -> None:
    with pytest.raises(grpc.RpcError) as err:
        tier_client.create_avatar((SAMPLES / "avatar.jpg").read_bytes(), model="sadtalker")
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "model 'sadtalker' is not a model tier; use one of wav2lip, musetalk" in err.value.details()
    with pytest.raises(grpc.RpcError) as err:
        tier_client.list_avatars(model="sadtalker")
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_a_deployment_without_the_stage_refuses_the_tier_before_the_upload(client: LiplineClient) -> None:
    """The shared cluster runs no lipsync-musetalk stage (the registry's optional stage is off by default)."""
    with pytest.raises(grpc.RpcError) as err:
        client.create_avatar((SAMPLES / "avatar.jpg").read_bytes(), model="musetalk")
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "does not serve the 'musetalk' model tier: it runs no lipsync-musetalk stage" in err.value.details()
    assert client.create_avatar((SAMPLES / "avatar.jpg").read_bytes()).model == "wav2lip"


# --------------------------------------------------------------------------------------------------
# Jobs on the tier
# --------------------------------------------------------------------------------------------------


def test_a_photo_job_renders_the_whole_audio_with_the_tiers_model(photo_job: Render, speech_bytes: bytes) -> None:
    job, info = photo_job.job, photo_job.info
    assert (info["video_codec"], info["audio_codec"]) == ("h264", "aac")
    assert info["frames"] == len(photo_job.frames) == round(job.audio_seconds * FPS) == job.total_frames
    assert abs(info["video_duration"] - job.audio_seconds) < 1.0 / FPS
    assert abs(info["audio_duration"] - job.audio_seconds) < 0.03
    assert job.model == "musetalk"
    expected = ["musetalk-standin", "lanczos"] if job.options.super_resolution else ["musetalk-standin"]
    assert [m.name for m in job.models] == expected


def test_the_upper_face_is_the_template_and_the_mouth_follows_the_gate(
    photo_job: Render, photo: gateway_pb2.Avatar, tier: LocalCluster, speech_bytes: bytes, tmp_path: Path
) -> None:
    frames = photo_job.frames
    template = encoded_alone(decode_avatar((SAMPLES / "avatar.jpg").read_bytes())[0][0], tmp_path)
    box = stored_meta(tier, photo.id)["boxes"][0]
    (upper, mouth) = regions(box)
    x1, y1, x2, y2 = box
    outside = np.ones(template.shape[:2], bool)
    outside[y1:y2, x1:x2] = False
    gate = gate_weights(expected_openings(speech_bytes))
    assert len(gate) == len(frames)
    silent, speech = np.flatnonzero(gate == 0), np.flatnonzero(gate == 1)
    assert len(silent) >= 5 and len(speech) >= 10, (silent, speech)
    for i, frame in enumerate(frames):
        assert mean_abs_diff(frame[upper], template[upper]) < CODEC_FLOOR, i
        assert mean_abs_diff(frame[outside], template[outside]) < CODEC_FLOOR, i
    mouths = np.array([mean_abs_diff(f[mouth], template[mouth]) for f in frames])
    # silence: the template's own mouth, up to x264's residual in the P-frames after speech (~2.5)
    assert mouths[silent].max() < SILENT_FLOOR, mouths[silent]
    assert mouths[speech].min() > 3 * SILENT_FLOOR, mouths[speech]  # speech: the generated one (13-62)
    darkness = np.array([float(f[mouth].mean()) for f in frames])[speech]
    assert darkness.max() - darkness.min() > 10.0, darkness  # it opens and closes with the audio


def test_a_template_video_job_loops_and_passes_faceless_frames(
    tier_client: LiplineClient, video: Video, speech_bytes: bytes, tmp_path: Path
) -> None:
    """Ping-pong (the default) over the 7 frames; the loop modes' mapping itself is the Wav2Lip path's
    (services/media/timeline.py), tested there."""
    avatar, decoded = video.avatar, video.frames
    out = render(tier_client, avatar.id, speech_bytes, tmp_path / "out.mp4")
    assert out.info["frames"] == round(out.job.audio_seconds * FPS) > 2 * avatar.frame_count
    assert [m.name for m in out.job.models] == ["musetalk-standin"]
    body = (slice(300, None), slice(None))  # far below the face: only the template's own motion
    for i, frame in enumerate(out.frames):
        source = loop_frame(i, 7, "ping_pong")
        diffs = [mean_abs_diff(frame[body], t[body]) for t in decoded]
        assert int(np.argmin(diffs)) == source, (i, [round(d, 2) for d in diffs])
        if source == 6:  # no face: the frame passes through whole
            assert mean_abs_diff(frame, decoded[6]) < 2.0 and frame.std() < 2.0, i  # grey, no face pasted


# --------------------------------------------------------------------------------------------------
# Tenants, limits and bad input, as for Wav2Lip avatars
# --------------------------------------------------------------------------------------------------


def code_of(call) -> tuple[grpc.StatusCode, str]:  # type: ignore[no-untyped-def]
    with pytest.raises(grpc.RpcError) as caught:
        call()
    return caught.value.code(), caught.value.details()


def test_another_tenant_finds_none_of_it_and_bad_or_long_audio_is_refused(
    tier_client: LiplineClient, bob: LiplineClient, photo: gateway_pb2.Avatar, speech_bytes: bytes
) -> None:
    for call in (
        lambda: bob.get_avatar(photo.id),
        lambda: bob.submit_job(photo.id, speech_bytes),
        lambda: bob.create_session(photo.id),
    ):
        code, details = code_of(call)
        assert code == grpc.StatusCode.NOT_FOUND and photo.id in details, details
    assert photo.id not in {a.id for a in bob.list_avatars(model="musetalk")}
    long = (SAMPLES / "speech.wav").read_bytes()  # 7.7 s, over the gateway's 6 s
    code, details = code_of(lambda: tier_client.submit_job(photo.id, long))
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED and "limit is 6 s" in details, details
    code, details = code_of(lambda: tier_client.submit_job(photo.id, b"not audio at all" * 100))
    assert code == grpc.StatusCode.INVALID_ARGUMENT, details


# --------------------------------------------------------------------------------------------------
# Live sessions on the tier
# --------------------------------------------------------------------------------------------------

RATE = 16000


def test_a_live_session_speaks_with_the_generated_mouth_at_the_sessions_fps(
    tier_client: LiplineClient, photo: gateway_pb2.Avatar, tier: LocalCluster, tmp_path: Path
) -> None:
    audio = cut_wav((SAMPLES / "speech.wav").read_bytes(), 2.0)
    session, recorder = run_session(tier_client, photo.id, audio, write=print)
    assert session.model == "musetalk" and session.video.fps == FPS
    frames = recorder.frames
    indices = [f.index for f in frames]
    assert frames and frames[0].keyframe and all(b > a for a, b in zip(indices, indices[1:]))
    # consecutive timestamps: a slot without a frame is one the worker skipped (late, on a loaded
    # machine) or dropped, and counted as such (the last stats, sent once a second, may precede a second of them)
    gaps = indices[-1] - indices[0] + 1 - len(frames)
    stats = recorder.stats[-1]
    assert gaps <= stats.frames_skipped + stats.frames_dropped + FPS, (gaps, stats)  # stats: once a second
    speech = [f.index for f in frames if f.speech]
    assert len(speech) + gaps >= 2 * FPS - 1, (len(speech), gaps)  # every slot of the 2 s: shown or skipped
    assert_audio_locked(frames, 2 * RATE // FPS)  # each frame carries its 40 ms (those skipped ride on the next)
    path = tmp_path / "live.mp4"
    write_mp4(path, recorder, session.video.codec, session.width, session.height)
    with av.open(str(path)) as container:
        pictures = [f.to_ndarray(format="bgr24") for f in container.decode(video=0)]
    template = decode_avatar((SAMPLES / "avatar.jpg").read_bytes())[0][0]
    upper, mouth = regions(stored_meta(tier, photo.id)["boxes"][0])
    by_index = dict(zip((f.index for f in frames), pictures))
    for index, picture in by_index.items():  # the live codec (crf 23, ultrafast): a little looser
        assert mean_abs_diff(picture[upper], template[upper]) < 2 * CODEC_FLOOR, index
    mouths = [mean_abs_diff(by_index[i][mouth], template[mouth]) for i in speech]
    idle = [mean_abs_diff(p[mouth], template[mouth]) for i, p in by_index.items() if i not in set(speech)]
    assert max(mouths) > 5 * max(idle + [1.0]), (max(mouths), max(idle))  # the generated mouth, only in speech


def test_clear_ends_the_speech_frames_and_the_session_resumes_with_its_token(
    tier_client: LiplineClient, photo: gateway_pb2.Avatar
) -> None:
    session = tier_client.create_session(photo.id)
    speech = pcm_of_audio((SAMPLES / "speech.wav").read_bytes(), RATE)
    talk = Stream(tier_client, session)
    talk.wait(lambda: talk.ready is not None, "Ready")
    for chunk in pcm_chunks(speech, RATE, 100):  # 7.7 s queued at once (the worker holds up to 10 s)
        talk.requests.put(session_pb2.ConverseRequest(audio=session_pb2.AudioChunk(pcm=chunk)))
    talk.wait(lambda: sum(f.speech for f in talk.frames) >= 10, "speech frames")
    talk.requests.put(session_pb2.ConverseRequest(clear=session_pb2.Clear()))
    talk.wait(lambda: any(e.interrupted for e in talk.events), "PLAYBACK_FINISHED(interrupted)")
    cleared_at = next(e.frame for e in talk.events if e.interrupted)  # the session frame the Clear took effect at
    talk.wait(lambda: talk.frames[-1].index >= cleared_at + 10, "frames after the Clear")
    after = [f for f in talk.frames if f.index >= cleared_at]
    assert after and not any(f.speech for f in after), [(f.index, f.speech) for f in after]  # not one speech frame
    talk.cut()
    last = talk.frames[-1].index
    again = Stream(tier_client, session, last_frame=last)  # the resume: the token, the last frame seen
    again.wait(lambda: again.ready is not None and len(again.frames) > 3, "frames after the resume")
    assert again.ready.next_frame > last and again.frames[0].keyframe and again.frames[0].index > last
    again.say(speech[:RATE])  # 0.5 s
    again.wait(lambda: again.finished, "the utterance after the resume played")
    started, finished = (
        next(e.frame for e in again.events if e.kind == kind)
        for kind in (session_pb2.SessionEvent.PLAYBACK_STARTED, session_pb2.SessionEvent.PLAYBACK_FINISHED)
    )
    seen = len(again.stats)
    again.wait(lambda: len(again.stats) > seen, "the stats after the utterance")  # counts up to date
    indices = [f.index for f in again.frames]
    assert all(b > a for a, b in zip(indices, indices[1:]))
    # Its slots are speech frames, or frames the worker skipped (late: a loaded machine) and counted.
    shown = [f for f in again.frames if started <= f.index < finished]
    assert [f.index for f in again.frames if f.speech] == [f.index for f in shown]  # speech there, only there
    assert finished - started - len(shown) <= again.stats[-1].frames_skipped + again.stats[-1].frames_dropped
    again.cut()
    assert tier_client.close_session(session.id).state == session_pb2.SESSION_STATE_CLOSED
