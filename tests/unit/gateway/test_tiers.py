"""Model tiers at the gateway (services.gateway.tiers, the ListAvatars filter): which names a request
may give, which tier a deployment serves, and that a page token keeps its filter."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from lipline.v1 import gateway_pb2
from services.gateway.avatars import avatar_to_proto
from services.gateway.lists import list_avatars
from services.gateway.pages import PageTokens
from services.gateway.settings import GatewaySettings
from services.gateway.tiers import check_model, require_served
from services.jobs.avatars import content_hash
from services.jobs.store.jobs import AvatarRecord
from services.serving.errors import FailedPrecondition, InvalidRequest
from tests.helpers.stores import Stores, temp_stores


@pytest.fixture
def stores(tmp_path: Path) -> Iterator[Stores]:
    with temp_stores(tmp_path) as s:
        yield s


def test_a_model_name_is_a_known_tier_and_empty_is_wav2lip() -> None:
    assert (
        check_model("") == "wav2lip" and check_model("wav2lip") == "wav2lip" and check_model("musetalk") == "musetalk"
    )
    with pytest.raises(InvalidRequest, match="model 'MuseTalk' is not a model tier; use one of wav2lip, musetalk"):
        check_model("MuseTalk")
    with pytest.raises(InvalidRequest, match="model filter 'x+' is not"):
        check_model("x" * 1000, "model filter")


def test_a_tier_is_served_where_the_gateway_has_its_stage() -> None:
    require_served(GatewaySettings(), "wav2lip")
    with pytest.raises(
        FailedPrecondition, match="does not serve the 'musetalk' model tier: it runs no lipsync-musetalk"
    ):
        require_served(GatewaySettings(), "musetalk")
    require_served(GatewaySettings(lipsync_musetalk_address="k8s:///lipline-lipsync-musetalk:50068"), "musetalk")


def test_another_tiers_upload_of_the_same_bytes_is_another_avatar() -> None:
    wav2lip = content_hash(b"photo", 25.0)
    assert wav2lip == content_hash(b"photo", 25.0, "wav2lip")  # Wav2Lip avatars keep their hash
    assert content_hash(b"photo", 25.0, "musetalk") not in (wav2lip, content_hash(b"photo", 25.0, "other"))


def test_avatars_report_their_tier_and_list_by_it_with_the_filter_bound_to_the_token(stores: Stores) -> None:
    for i, model in enumerate(["musetalk", "wav2lip", "musetalk", "musetalk"]):
        stores.jobs.put_avatar(
            AvatarRecord(f"{i:024x}", "n", 25.0, 1, 8, 8, 1, float(i), tenant="acme", content_hash=str(i), model=model)
        )
    pages = PageTokens(b"k" * 32)

    def page(**fields: object) -> gateway_pb2.ListAvatarsResponse:
        request = gateway_pb2.ListAvatarsRequest(**fields)  # type: ignore[arg-type]
        return asyncio.run(list_avatars(stores.jobs, pages, "acme", request, 4 << 20))

    first = page(page_size=2, model="musetalk")
    assert [a.id for a in first.avatars] == [f"{3:024x}", f"{2:024x}"] and {a.model for a in first.avatars} == {
        "musetalk"
    }
    rest = page(page_size=2, model="musetalk", page_token=first.next_page_token)
    assert [a.id for a in rest.avatars] == [f"{0:024x}"] and not rest.next_page_token
    with pytest.raises(InvalidRequest):  # the token was issued for the musetalk filter
        page(page_size=2, page_token=first.next_page_token)
    assert [a.model for a in page().avatars] == ["musetalk", "musetalk", "wav2lip", "musetalk"]
    with pytest.raises(InvalidRequest, match="model filter 'sadtalker' is not a model tier"):
        page(model="sadtalker")
    assert avatar_to_proto(stores.jobs.get_avatar(f"{1:024x}", "acme")).model == "wav2lip"


def test_jobs_and_sessions_report_their_avatars_tier() -> None:
    from services.gateway.jobs import job_to_proto
    from services.gateway.sessions import SessionRequest, resolve_session
    from services.jobs.store.jobs import Job, JobState

    avatar = AvatarRecord("a" * 24, "n", 25.0, 1, 64, 48, 1, 1.0, model="musetalk")
    request = SessionRequest("a" * 24, 0, 0, 0, 0.0, 0, 0, False, 0.0, 0.0)
    assert resolve_session(request, avatar, GatewaySettings(), "s1").model == "musetalk"
    job = Job(
        "j1", "a" * 24, "o", JobState.QUEUED, "queued", b"", 1.0, 25.0, 25, 0, 1, 0, "", 0, [], {}, 1.0, 0.0, 0.0, "", 0, 1,
        model="musetalk",
    )  # fmt: skip
    assert job_to_proto(job).model == "musetalk"
