"""Idempotent creates, labels, lists and DeleteJob through real gateway processes (issue 21 items
1-3 and DeleteJob), on the SQLite and on the PostgreSQL job store.

One cluster with API keys for tenants acme and bob (one render worker), and a second gateway on the
same stores whose request-id window is 1 s, for what happens after the window. Jobs that only
need to exist for a list are written to the job store directly (cancelled at once: no worker
claims them), as an earlier gateway would have left them.
"""

from __future__ import annotations

import secrets
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest

from lipline.v1 import gateway_pb2
from services.gateway.client import LiplineClient
from services.jobs.store import open_job_store
from services.jobs.store.jobs import AvatarRecord, JobStore, NewJob
from services.local.cluster import LOCAL_FLAGS, LocalCluster
from services.local.process import ServiceProcess, start
from tests.integration.util import SAMPLES, cut_wav, eventually, start_cluster

SPEECH = (SAMPLES / "speech.wav").read_bytes()


@dataclass
class Api:
    cluster: LocalCluster
    store: JobStore
    acme: LiplineClient
    bob: LiplineClient
    acme_short: LiplineClient  # acme on the gateway whose request-id window is 1 s
    avatar: gateway_pb2.Avatar  # acme's


@pytest.fixture(scope="module")
def api(job_store_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Api]:
    workdir = tmp_path_factory.mktemp("api-ids")
    keys = {name: secrets.token_urlsafe(24) for name in ("acme", "bob")}
    (workdir / "api-keys").write_text("".join(f"{n}/ci:{k}\n" for n, k in keys.items()))
    gateway = [f"--api-keys-file={workdir / 'api-keys'}", "--segment-seconds=0.4"]
    with start_cluster(
        workdir / "cluster", job_store=job_store_url, extra_args={"gateway": gateway}, replicas={"render": 1}
    ) as cluster:
        args = [*cluster.processes["gateway"].args, "--request-id-window-s=1"]
        short: ServiceProcess = start("gateway-short", "gateway", args, cluster.workdir, base_args=LOCAL_FLAGS)
        store = open_job_store(job_store_url)
        clients: list[LiplineClient] = []
        try:
            short.wait_ready(cluster.start_timeout_s)
            clients = [
                LiplineClient(cluster.gateway_address, timeout=120, api_key=keys["acme"]),
                LiplineClient(cluster.gateway_address, timeout=120, api_key=keys["bob"]),
                LiplineClient(short.address, timeout=120, api_key=keys["acme"]),
            ]
            avatar = clients[0].create_avatar((SAMPLES / "avatar.jpg").read_bytes(), name="acme's")
            yield Api(cluster, store, *clients, avatar=avatar)
        finally:
            for client in clients:
                client.close()
            store.close()
            short.terminate()


def rid() -> str:
    return str(uuid.uuid4())


def code_of(call: Callable[[], object]) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.RpcError) as caught:
        call()
    return caught.value.code(), caught.value.details()


def submit_request(api: Api, request_id: str, seconds: float = 0.4, **labels: str) -> gateway_pb2.SubmitJobRequest:
    return gateway_pb2.SubmitJobRequest(
        avatar_id=api.avatar.id, audio=cut_wav(SPEECH, seconds), request_id=request_id, labels=labels
    )


def test_the_client_package_sends_request_ids_and_lists_and_deletes_jobs(api: Api) -> None:
    """The typed client (clients/python): a request_id it is given is sent (a repeat is the same job),
    list_jobs follows the pages with the label selector, delete_job removes a finished job."""
    audio, tag, fixed = cut_wav(SPEECH, 0.4), rid()[:8], rid()
    first = api.acme.submit_job(api.avatar.id, audio, request_id=fixed, labels={"client": tag})
    assert api.acme.submit_job(api.avatar.id, audio, request_id=fixed, labels={"client": tag}).id == first.id
    other = api.acme.submit_job(api.avatar.id, audio, labels={"client": tag})  # its own, generated id
    assert other.id != first.id
    listed = [job.id for job in api.acme.list_jobs(label_selector=f"client={tag}", page_size=1)]
    assert listed == [other.id, first.id]  # newest first, one page each
    for job in (first, other):
        api.acme.cancel_job(job.id)
        api.acme.wait(job.id)
        api.acme.delete_job(job.id)
    assert list(api.acme.list_jobs(label_selector=f"client={tag}")) == []


def test_a_retried_submit_makes_one_job_even_eight_at_once(api: Api) -> None:
    request = submit_request(api, rid(), order="o-1")
    first = api.acme.stub.SubmitJob(request)
    again = api.acme.stub.SubmitJob(request)
    assert again.id == first.id and dict(again.labels) == {"order": "o-1"}

    batch = rid()
    concurrent = submit_request(api, batch, batch=batch[:8])
    with ThreadPoolExecutor(8) as pool:
        made = list(pool.map(lambda _: api.acme.stub.SubmitJob(concurrent).id, range(8)))
    assert len(set(made)) == 1
    listed = api.acme.stub.ListJobs(gateway_pb2.ListJobsRequest(label_selector=f"batch={batch[:8]}")).jobs
    assert [j.id for j in listed] == made[:1]  # one job in the store, not eight

    code, details = code_of(lambda: api.acme.stub.SubmitJob(submit_request(api, request.request_id, seconds=0.6)))
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert f"request_id {request.request_id} was already used for a different job request" in details
    # The same id is bob's own: it makes bob's job, which acme cannot see.
    bobs = api.bob.stub.SubmitJob(gateway_pb2.SubmitJobRequest(request_id=request.request_id, **_bobs_request(api)))
    assert bobs.id != first.id
    code, _ = code_of(lambda: api.acme.stub.GetJob(gateway_pb2.GetJobRequest(job_id=bobs.id)))
    assert code == grpc.StatusCode.NOT_FOUND


def _bobs_request(api: Api) -> dict:
    avatar = api.bob.create_avatar((SAMPLES / "avatar.jpg").read_bytes(), name="bob's")
    return {"avatar_id": avatar.id, "audio": cut_wav(SPEECH, 0.4)}


def test_after_the_window_the_same_id_makes_a_new_job(api: Api) -> None:
    request = submit_request(api, rid())
    first = api.acme_short.stub.SubmitJob(request)
    # A repeat is the same job until the 1 s window has passed, then a new one (polled, not timed).
    again = eventually(lambda: (job := api.acme_short.stub.SubmitJob(request)).id != first.id and job, 30, "a new job")
    assert again.avatar_id == first.avatar_id


def test_bad_request_ids_and_labels_are_invalid_argument_saying_why(api: Api) -> None:
    for request, words in (
        (submit_request(api, "order-42"), "request_id 'order-42' is not a UUID"),
        (submit_request(api, rid(), **{"bad key": "v"}), "label key 'bad key' is not valid"),
        (submit_request(api, rid(), k="no spaces here"), "label 'k' has value 'no spaces here'"),
    ):
        code, details = code_of(lambda r=request: api.acme.stub.SubmitJob(r))  # type: ignore[misc]
        assert (code, words in details) == (grpc.StatusCode.INVALID_ARGUMENT, True), details
    for listing, words in (
        (gateway_pb2.ListJobsRequest(label_selector="order"), "is not key=value"),
        (gateway_pb2.ListJobsRequest(states=[0]), "states has 0, which is not a job state"),
        (gateway_pb2.ListJobsRequest(page_token="made-up"), "page_token is not one this API issued"),
    ):
        code, details = code_of(lambda r=listing: api.acme.stub.ListJobs(r))  # type: ignore[misc]
        assert (code, words in details) == (grpc.StatusCode.INVALID_ARGUMENT, True), details


def test_create_avatar_with_a_request_id_and_labels(api: Api) -> None:
    photo = (SAMPLES / "avatar.jpg").read_bytes()
    request_id = rid()

    def create(name: str) -> gateway_pb2.Avatar:
        first = gateway_pb2.CreateAvatarRequest(  # photo_fps 24: not the same upload as bob's other avatar
            name=name, photo_fps=24, data=photo, request_id=request_id, labels={"user": "u7"}
        )
        return api.bob.stub.CreateAvatar(iter([first]))

    avatar = create("with labels")
    assert dict(avatar.labels) == {"user": "u7"} and create("with labels") == avatar
    code, details = code_of(lambda: create("another name"))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "different avatar request" in details


def seed(store: JobStore, tenant: str, tag: str, count: int, start: int = 0) -> None:
    """`count` cancelled jobs of `tenant` labelled seed=tag, as if submitted earlier."""
    for i in range(start, start + count):
        job_id = f"{tag}{tenant}{i:04d}"
        store.create_job(
            NewJob(
                job_id, "0" * 24, f"tenant:{tenant}", b"", 0.4, 25.0, 10, [(0, 10)], tenant=tenant, labels={"seed": tag}
            )
        )
        store.cancel_job(job_id)


def test_list_jobs_pages_250_jobs_while_new_ones_arrive(api: Api) -> None:
    tag = "p" + secrets.token_hex(4)
    seed(api.store, "acme", tag, 250)
    seed(api.store, "bob", tag, 3)
    request = gateway_pb2.ListJobsRequest(page_size=100, label_selector=f"seed={tag}")
    seen, pages = [], 0
    while True:
        page = api.acme.stub.ListJobs(request)
        seen += [j.id for j in page.jobs]
        pages += 1
        seed(api.store, "acme", tag, 5, start=1000 + 5 * pages)  # newer jobs arrive between pages
        if not page.next_page_token:
            break
        request.page_token = page.next_page_token
        code, details = code_of(lambda: api.bob.stub.ListJobs(request))  # acme's token is not bob's
        assert code == grpc.StatusCode.INVALID_ARGUMENT, details
    assert pages == 3 and seen == [f"{tag}acme{i:04d}" for i in reversed(range(250))]  # each once, newest first
    bobs = api.bob.stub.ListJobs(gateway_pb2.ListJobsRequest(label_selector=f"seed={tag}")).jobs
    assert [j.id for j in bobs] == [f"{tag}bob{i:04d}" for i in reversed(range(3))]
    none = gateway_pb2.ListJobsRequest(label_selector=f"seed={tag}", states=[gateway_pb2.JOB_STATE_SUCCEEDED])
    assert list(api.acme.stub.ListJobs(none).jobs) == []
    # A token is only good with the filters it was issued for.
    first = api.acme.stub.ListJobs(gateway_pb2.ListJobsRequest(page_size=2, label_selector=f"seed={tag}"))
    other = gateway_pb2.ListJobsRequest(page_size=2, label_selector="seed=other", page_token=first.next_page_token)
    assert code_of(lambda: api.acme.stub.ListJobs(other))[0] == grpc.StatusCode.INVALID_ARGUMENT


def test_list_avatars_pages_newest_first(api: Api) -> None:
    base = 2_000_000_000.0  # newer than anything else of acme's
    ids = [secrets.token_hex(12) for _ in range(5)]
    for i, avatar_id in enumerate(ids):
        api.store.put_avatar(AvatarRecord(avatar_id, f"n{i}", 25.0, 1, 64, 64, 1, base + i, tenant="acme"))
    first = api.acme.stub.ListAvatars(gateway_pb2.ListAvatarsRequest(page_size=3))
    second = api.acme.stub.ListAvatars(gateway_pb2.ListAvatarsRequest(page_size=3, page_token=first.next_page_token))
    assert [a.id for a in first.avatars] == ids[::-1][:3]
    assert [a.id for a in second.avatars][:2] == ids[::-1][3:]
    assert not set(ids) & {a.id for a in api.bob.list_avatars()}


def test_delete_job_removes_a_finished_job_and_its_files(api: Api) -> None:
    blob_dir: Path = api.cluster.blob_dir
    running = api.acme.submit_job(api.avatar.id, cut_wav(SPEECH, 4.0))
    code, details = code_of(lambda: api.acme.stub.DeleteJob(gateway_pb2.DeleteJobRequest(job_id=running.id)))
    assert code == grpc.StatusCode.FAILED_PRECONDITION and "cancel it first (CancelJob)" in details, details
    api.acme.stub.CancelJob(gateway_pb2.CancelJobRequest(job_id=running.id))

    job = api.acme.submit_job(api.avatar.id, cut_wav(SPEECH, 0.4))
    assert api.acme.wait(job.id).state == gateway_pb2.JOB_STATE_SUCCEEDED
    assert (blob_dir / "outputs" / f"{job.id}.mp4").exists()
    code, _ = code_of(lambda: api.bob.stub.DeleteJob(gateway_pb2.DeleteJobRequest(job_id=job.id)))
    assert code == grpc.StatusCode.NOT_FOUND
    for job_id in (job.id, running.id):
        api.acme.stub.DeleteJob(gateway_pb2.DeleteJobRequest(job_id=job_id))
        assert code_of(lambda j=job_id: api.acme.stub.GetJob(gateway_pb2.GetJobRequest(job_id=j)))[0] == (  # type: ignore[misc]
            grpc.StatusCode.NOT_FOUND
        )
        assert not (blob_dir / "outputs" / f"{job_id}.mp4").exists() and not list(
            (blob_dir / "jobs").glob(f"{job_id}*")
        )
    assert code_of(lambda: api.acme.stub.DeleteJob(gateway_pb2.DeleteJobRequest(job_id=job.id)))[0] == (
        grpc.StatusCode.NOT_FOUND
    )
