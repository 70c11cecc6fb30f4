"""Memory follows the frames in flight, not the avatar's length (issue 17, item 3).

A 30- and a 150-frame static 720p video avatar, each created and rendered (1 s of speech) on real
processes; the peak RSS increase of the gateway, the lipsync stage and the render worker for the
long one must be within 2x the short one's. On main every frame was held at once (2.6 MB each in
BGR at 720p), so the long avatar cost ~LONG/SHORT times as much. bench/avatar_memory.py is the same measurement at 1080p.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from bench.avatar_memory import PROCESSES, measure, speech_wav, static_video
from lipline.v1 import gateway_pb2
from services.local.cluster import LocalCluster
from tests.integration.util import start_cluster

SHORT, LONG = 30, 150  # holding every frame at once (as on main) would cost the long one 5x
FLOOR_MIB = 40.0  # allocator noise below which a difference means nothing


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with start_cluster(tmp_path_factory.mktemp("avatar-memory"), replicas={"render": 1}) as c:
        yield c


def test_long_avatars_cost_about_what_short_ones_cost(cluster: LocalCluster) -> None:
    audio = speech_wav(1.0)
    short = measure(cluster, static_video(SHORT, 1280, 720), audio)
    long = measure(cluster, static_video(LONG, 1280, 720), audio)
    assert (short["frames"], long["frames"]) == (SHORT, LONG)
    assert short["job_state"] == long["job_state"] == gateway_pb2.JOB_STATE_SUCCEEDED
    for name in PROCESSES:
        a, b = short["peak_increase_mib"][name], long["peak_increase_mib"][name]
        assert b <= 2 * max(a, FLOOR_MIB), (name, short, long)
