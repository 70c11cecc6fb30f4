"""Fixtures of the integration tests: real service processes on 127.0.0.1 (services.local.LocalCluster).

One default cluster (procedural lip sync, Lanczos super-resolution) is shared by the whole session:
starting every service's process (the GPU stages import torch) costs several seconds on a small CI machine, and
every test that uses it must leave it serving (that is part of what the tests check). Tests that need
other flags (a Wav2Lip checkpoint, a process to SIGTERM) start their own with `util.start_cluster`.

When a test that uses a cluster fails, the tail of every service's log is attached to its report.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from lipline.v1 import audio_pb2_grpc, lipsync_pb2_grpc, superres_pb2_grpc
from services.gateway.client import LiplineClient
from services.local.cluster import LocalCluster
from tests.helpers.postgres import PostgresServer, missing_reason
from tests.integration.util import SAMPLES, cut_wav, logs_of, stage_channel, start_cluster

SPEECH_SECONDS = 2.4  # speech, a silent gap (0.56-0.96 s), more speech


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> Iterator[None]:
    outcome = yield
    report = outcome.get_result()
    if report.failed:
        for value in getattr(item, "funcargs", {}).values():
            if isinstance(value, LocalCluster):
                report.sections.append(("service logs", logs_of(value)))


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    # Segments of 0.8 s: the 2.4 s test speech is rendered as 3 segments (by the two workers) joined
    # by a stream copy, so every pipeline test (frame count, mouth per frame, background) covers the join.
    gateway = ["--segment-seconds=0.8"]
    with start_cluster(tmp_path_factory.mktemp("cluster"), extra_args={"gateway": gateway}) as c:
        yield c


@pytest.fixture
def client(cluster: LocalCluster) -> Iterator[LiplineClient]:
    with LiplineClient(cluster.gateway_address, timeout=120.0) as c:
        yield c


@pytest.fixture(scope="module")
def audio_stub(cluster: LocalCluster) -> Iterator[audio_pb2_grpc.AudioServiceStub]:
    with stage_channel(cluster, "audio") as channel:
        yield audio_pb2_grpc.AudioServiceStub(channel)


@pytest.fixture(scope="module")
def lipsync_stub(cluster: LocalCluster) -> Iterator[lipsync_pb2_grpc.LipSyncServiceStub]:
    with stage_channel(cluster, "lipsync") as channel:
        yield lipsync_pb2_grpc.LipSyncServiceStub(channel)


@pytest.fixture(scope="module")
def superres_stub(cluster: LocalCluster) -> Iterator[superres_pb2_grpc.SuperResServiceStub]:
    with stage_channel(cluster, "superres") as channel:
        yield superres_pb2_grpc.SuperResServiceStub(channel)


@pytest.fixture(scope="session")
def avatar_bytes() -> bytes:
    return (SAMPLES / "avatar.jpg").read_bytes()


@pytest.fixture(scope="session")
def speech_bytes() -> bytes:
    """The first SPEECH_SECONDS of samples/speech.wav (22.05 kHz mono PCM WAV)."""
    return cut_wav((SAMPLES / "speech.wav").read_bytes(), SPEECH_SECONDS)


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def job_store_url(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A job store URL, once an SQLite file and once a real PostgreSQL server: a module whose cluster
    fixture takes it runs every test that uses that cluster on both (the SQL of the two differs)."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path_factory.mktemp('sqlite') / 'jobs.db'}"
        return
    reason = missing_reason()
    if reason:
        pytest.skip(reason)
    with PostgresServer() as server:
        yield server.url
