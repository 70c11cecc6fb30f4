"""A render worker whose lipsync channel follows an address file (`file://`, the stand-in for the
EndpointSlice watch, which needs an API server): while jobs run, a third lipsync replica added to the
file gets items within 2 s, and a replica removed from it gets no new stream."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from lipline.v1 import gateway_pb2
from services.gateway.client import LiplineClient
from services.local.cluster import LocalCluster
from tests.integration.test_lifecycle import sample_sum, scrape
from tests.integration.util import SAMPLES, cut_wav, eventually, start_cluster

pytestmark = pytest.mark.slow


def items(cluster: LocalCluster, name: str) -> float:
    return sample_sum(scrape(cluster, name), "lipline_stage_items_total", stage="lipsync")


@pytest.fixture
def discovered(tmp_path: Path) -> Iterator[tuple[LocalCluster, Path]]:
    # Render replicas 0 at first: the worker starts once the lipsync addresses are in the file.
    with start_cluster(
        tmp_path, replicas={"lipsync": 2, "render": 0}, extra_args={"gateway": ["--segment-seconds=0.4"]}
    ) as cluster:
        path = tmp_path / "lipsync-addresses.txt"
        path.write_text("".join(cluster.processes[n].address + "\n" for n in cluster.replica_names("lipsync")))
        cluster.replicas["render"] = 1
        cluster.extra_args["render"] = [f"--lipsync-address=file://{path}"]  # after store_args': it wins
        cluster.start_service("render", wait=True)
        yield cluster, path


def test_replicas_follow_the_address_file(discovered: tuple[LocalCluster, Path]) -> None:
    cluster, path = discovered
    audio = cut_wav((SAMPLES / "speech.wav").read_bytes(), 2.4)
    stop = threading.Event()
    errors: list[str] = []

    with LiplineClient(cluster.gateway_address, timeout=120.0) as client:
        avatar = client.create_avatar((SAMPLES / "avatar.jpg").read_bytes())

        def submit_jobs() -> None:  # keep the worker busy, a job at a time, until told to stop
            while not stop.is_set():
                job = client.wait(client.submit_job(avatar.id, audio).id)
                if job.state != gateway_pb2.JOB_STATE_SUCCEEDED:
                    errors.append(f"{job.id}: {job.error}")

        jobs = threading.Thread(target=submit_jobs, daemon=True)
        jobs.start()
        try:
            eventually(
                lambda: items(cluster, "lipsync") > 0 and items(cluster, "lipsync-1") > 0, 60, "both replicas used"
            )

            # A third replica: started, then added to the file while jobs run.
            cluster.replicas["lipsync"] = 3
            cluster._start("lipsync-2", cluster.extra_args.get("lipsync", []), "lipsync")
            cluster._wait_ready("lipsync-2")
            assert items(cluster, "lipsync-2") == 0
            added = time.monotonic()
            with path.open("a") as f:
                f.write(cluster.processes["lipsync-2"].address + "\n")
            eventually(lambda: items(cluster, "lipsync-2") > 0, 10, "the new replica's first items", every=0.05)
            took = time.monotonic() - added  # ~0.5 s when idle: the file is polled; the bound above is load's
            print(f"the added replica got its first items after {took:.2f} s")

            # Remove lipsync-1: after the in-flight segment (well within 2 s) it gets nothing new.
            path.write_text("".join(cluster.processes[n].address + "\n" for n in ("lipsync", "lipsync-2")))
            time.sleep(2.0)
            before = items(cluster, "lipsync-1")
            others = items(cluster, "lipsync") + items(cluster, "lipsync-2")
            time.sleep(3.0)
            assert items(cluster, "lipsync-1") == before, "a removed replica got a new stream"
            assert items(cluster, "lipsync") + items(cluster, "lipsync-2") > others, "jobs stopped running"
        finally:
            stop.set()
            jobs.join(120)
    assert not errors, errors
    log = cluster.processes["render"].log()
    assert "stage addresses changed" in log
