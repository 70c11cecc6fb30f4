"""CreateAvatar for the musetalk tier through the gateway (issue 30 items 1 and 4): real processes on
127.0.0.1 with the lipsync-musetalk stage (the weight-free stand-in), once on SQLite and once on
PostgreSQL. A photo and a template video are prepared into the avatar's pack (latents and masks, flat
in memory), the avatar reports its tier and lists by it; a deployment without the stage refuses the
tier FAILED_PRECONDITION; an unknown tier is INVALID_ARGUMENT (the tier's jobs and live sessions:
test_musetalk_tier.py).

The MuseTalk box of a detected face is services/lipsync/musetalk/dwpose.py's rule (its own branch):
the tests that prepare faces are skipped without it."""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Iterator
from pathlib import Path

import cv2
import grpc
import numpy as np
import pytest

from services.gateway.client import LiplineClient
from services.local.cluster import LocalCluster
from services.render.mp4 import Mp4Writer
from tests.helpers.video_files import write_shifted_video
from tests.integration.util import SAMPLES, start_cluster

needs_boxes = pytest.mark.skipif(
    importlib.util.find_spec("services.lipsync.musetalk.dwpose") is None,
    reason="the MuseTalk box rules (musetalk-dwpose's module)",
)


@pytest.fixture(scope="module")
def tier(job_store_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """A cluster serving the musetalk tier; no render workers or superres (no job renders here)."""
    replicas = {"lipsync-musetalk": 1, "render": 0, "superres": 0}
    with start_cluster(tmp_path_factory.mktemp("musetalk"), job_store=job_store_url, replicas=replicas) as cluster:
        yield cluster


@pytest.fixture
def tier_client(tier: LocalCluster) -> Iterator[LiplineClient]:
    with LiplineClient(tier.gateway_address, timeout=120.0) as c:
        yield c


def pack(cluster: LocalCluster, avatar_id: str) -> tuple[dict, np.ndarray, np.ndarray, list[str]]:
    """The avatar's meta, latents and masks as stored, and its blobs' names."""
    folder = cluster.blob_dir / "avatars" / avatar_id
    names = sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())
    meta = json.loads((folder / "meta.json").read_text())
    return meta, np.load(folder / "musetalk" / "latents.npy"), np.load(folder / "musetalk" / "masks.npy"), names


@needs_boxes
def test_a_photo_avatar_of_the_tier_is_prepared_stored_and_listed_by_it(
    tier: LocalCluster, tier_client: LiplineClient
) -> None:
    data = (SAMPLES / "avatar.jpg").read_bytes()
    avatar = tier_client.create_avatar(data, "photo", model="musetalk")
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
    assert [a.id for a in tier_client.list_avatars(model="musetalk")] == [avatar.id]
    assert {a.id for a in tier_client.list_avatars()} >= {avatar.id, plain.id}


@needs_boxes
def test_a_video_avatar_of_the_tier_keeps_a_row_per_face_and_passes_faceless_frames(
    tier: LocalCluster, tier_client: LiplineClient, tmp_path: Path
) -> None:
    photo = cv2.imread(str(SAMPLES / "avatar.jpg"))
    frames = write_shifted_video(tmp_path / "v.mp4", photo, frames=6, step=4)
    with Mp4Writer(tmp_path / "w.mp4", photo.shape[1], photo.shape[0], 25.0, None, 16_000, crf=12) as writer:
        for frame in [*frames, np.full_like(frames[0], 90), frames[0]]:
            writer.write(frame)
    avatar = tier_client.create_avatar((tmp_path / "w.mp4").read_bytes(), "video", model="musetalk")
    assert (avatar.model, avatar.frame_count, avatar.faces_found, avatar.fps) == ("musetalk", 8, 7, 25.0)
    meta, latents, masks, _ = pack(tier, avatar.id)
    assert meta["boxes"][6] is None and meta["mask_boxes"][6] is None and meta["boxes"][7] is not None
    assert latents.shape == (7, 8, 32, 32) and masks.shape == (7, 256, 256)
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
