"""Two replicas of each GPU stage behind one gateway: jobs are balanced over them.

On a GPU machine each replica would get its own GPU (LocalCluster(gpus=[...]) sets
CUDA_VISIBLE_DEVICES); here they share the CPU, which is enough to test the balancing.
"""

from __future__ import annotations

import concurrent.futures
from collections.abc import Iterator
from pathlib import Path

import pytest

from lipline.v1 import gateway_pb2
from services.gateway.client import LiplineClient
from services.local.cluster import LocalCluster
from services.media.probe import probe_media
from tests.integration.test_lifecycle import sample_sum, scrape
from tests.integration.util import cut_wav, start_cluster

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def replicated(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with start_cluster(tmp_path_factory.mktemp("scale-out"), replicas={"lipsync": 2, "superres": 2}) as cluster:
        yield cluster


def test_jobs_are_spread_over_replicas(
    replicated: LocalCluster, avatar_bytes: bytes, speech_bytes: bytes, tmp_path: Path
) -> None:
    assert [n for n in replicated.processes if n.startswith("lipsync")] == ["lipsync", "lipsync-1"]
    audio = cut_wav(speech_bytes, 1.0)
    with LiplineClient(replicated.gateway_address) as client:
        avatar = client.create_avatar(avatar_bytes)

        def one_job(i: int) -> gateway_pb2.Job:
            job = client.submit_job(avatar.id, audio, super_resolution=True)
            return client.wait(job.id)

        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            jobs = list(pool.map(one_job, range(4)))
        assert all(j.state == gateway_pb2.JOB_STATE_SUCCEEDED for j in jobs), [j.error for j in jobs]
        client.download(jobs[0].id, tmp_path / "out.mp4")
    assert probe_media(tmp_path / "out.mp4")["frames"] == jobs[0].total_frames
    for stage in ("lipsync", "superres"):
        items = [
            sample_sum(scrape(replicated, name), "lipline_stage_items_total", stage=stage)
            for name in replicated.replica_names(stage)
        ]
        # Round-robin per call: four jobs = four streams per stage, spread over both replicas.
        assert all(n > 0 for n in items), f"{stage} items per replica: {items}"
