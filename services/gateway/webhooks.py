"""Webhooks: a job with JobOptions.callback_url is POSTed, as JSON, to that URL once it has ended.

The job store's outbox (services.jobs.store.sql.webhooks) gets the delivery in the transaction that
ends the job, whoever ends it (a render worker's join or failure, CancelJob), so nothing is lost to a
crash. Every gateway replica runs a `WebhookSender`: it claims due deliveries with a lease, posts
each in its own task (at most callback_concurrency at once, each cut at callback_timeout_s, so a
receiver that hangs holds one slot, never the job or other deliveries), and records the attempt. A
gateway killed mid-post leaves a lease that expires; another claims the delivery again, with the
same delivery id (at least once: receivers deduplicate on `webhook-id`).

The gateway delivers, not the render workers: it has the public Job view (services.gateway.jobs),
the tenants' secrets and the outbound HTTP client and allow-lists it already uses for audio_uri, and
its replicas run whatever the render fleet's size (docs/decisions.md).

The URL is parsed once (services.gateway.urls: its rules refuse what two parsers could read
differently) and checked against callback_hosts / callback_http_hosts at SubmitJob; the sender parses
the stored URL with the same rules before each post and hands aiohttp that very object (`CheckedUrl`).

The request (Stripe's and Standard Webhooks' scheme): the body is the Job as protobuf JSON (without
its `webhook` field); `webhook-id` is the delivery id, `webhook-timestamp` Unix seconds, and
`webhook-signature` is `v1=` and the hex HMAC-SHA256, under the tenant's webhook secret, of
"<timestamp>.<body>". A receiver recomputes it, compares in constant time, and refuses old timestamps.
A 2xx is delivered; anything else (a redirect too: none is followed) is retried after
callback_backoff_s, doubled per failure up to callback_backoff_max_s (with jitter), until
callback_retry_window_s after the job ended; then GAVE_UP.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import hmac
import logging
import random
import ssl
import time
from collections.abc import Mapping

import aiohttp
from google.protobuf import json_format
from google.protobuf.timestamp_pb2 import Timestamp

from lipline.v1 import gateway_pb2
from services.gateway.jobs import job_to_proto
from services.gateway.settings import GatewaySettings
from services.gateway.urls import CheckedUrl, allowed_hosts, check_host, parse_url
from services.jobs.store.jobs import Delivery, DeliveryState, JobStore
from services.serving.auth import read_secret_file
from services.serving.background import cancel_and_wait
from services.serving.errors import FailedPrecondition, InvalidRequest, NotFound
from services.serving.metrics import Metrics
from services.serving.tenants import parse_webhook_secrets

_LOGGER = logging.getLogger(__name__)
ID_HEADER = "webhook-id"
TIMESTAMP_HEADER = "webhook-timestamp"
SIGNATURE_HEADER = "webhook-signature"
_STATES = {
    DeliveryState.PENDING: gateway_pb2.WebhookDelivery.PENDING,
    DeliveryState.DELIVERED: gateway_pb2.WebhookDelivery.DELIVERED,
    DeliveryState.GAVE_UP: gateway_pb2.WebhookDelivery.GAVE_UP,
}


def signature(secret: str, timestamp: str, body: bytes) -> str:
    """The webhook-signature header's value: `v1=` hex HMAC-SHA256 of "<timestamp>.<body>"."""
    return "v1=" + hmac.new(secret.encode(), timestamp.encode() + b"." + body, hashlib.sha256).hexdigest()


class CallbackRules:
    """Which callback URLs SubmitJob accepts, and the tenants' secrets (read at start, and again when
    the file changes: services.serving.secret_files)."""

    def __init__(self, settings: GatewaySettings) -> None:
        self.https_hosts = allowed_hosts(settings.callback_hosts, 443)
        self.http_hosts = allowed_hosts(settings.callback_http_hosts, 80)
        file = settings.webhook_secrets_file
        self.secrets: Mapping[str, str] = (
            parse_webhook_secrets(read_secret_file(file, "webhook secrets file"), file) if file else {}
        )

    def use_secrets(self, secrets: Mapping[str, str]) -> None:
        """A rotated secrets file: deliveries from now on are signed with these."""
        self.secrets = secrets

    def url(self, text: str) -> CheckedUrl:
        """`text` parsed (services.gateway.urls) and on its scheme's allow-list; InvalidRequest naming
        what to change. SubmitJob checks with it, and the sender again before each post: the object
        it posts to is the one checked, under the lists in force now."""
        url = parse_url(
            text, "callback_url", ("https", "http"), "only https:// (or http:// to hosts the operator lists) is allowed"
        )
        if url.scheme == "https":
            check_host(url, self.https_hosts, "callback_url", "callback_hosts", "ask its operator to allow it")
        else:
            check_host(url, self.http_hosts, "callback_url", "callback_http_hosts", "ask its operator to allow it")
        return CheckedUrl(url)

    def check(self, url: str, tenant: str) -> CheckedUrl:
        """`url`, parsed, when a job of `tenant` may call it back; InvalidRequest (a URL not allowed)
        or FailedPrecondition (the tenant has no secret) naming what to change."""
        target = self.url(url)
        if tenant not in self.secrets:
            raise FailedPrecondition(
                f"tenant {tenant!r} has no webhook secret to sign callbacks with; ask the operator to add one to webhook_secrets_file"
            )
        return target


def _timestamp(seconds: float) -> Timestamp:
    ts = Timestamp()
    ts.FromNanoseconds(int(seconds * 1e9))
    return ts


def delivery_to_proto(delivery: Delivery | None) -> gateway_pb2.WebhookDelivery:
    """GetJob's view of a delivery; None (the job has not ended) is PENDING with no attempts."""
    if delivery is None:
        return gateway_pb2.WebhookDelivery(state=gateway_pb2.WebhookDelivery.PENDING)
    out = gateway_pb2.WebhookDelivery(
        delivery_id=delivery.id,
        state=_STATES[delivery.state],
        attempts=delivery.attempts,
        last_status_code=delivery.last_status,
        last_error=delivery.last_error,
    )
    if delivery.delivered_time:
        out.delivered_time.CopyFrom(_timestamp(delivery.delivered_time))
    if delivery.state is DeliveryState.PENDING and delivery.attempts:
        out.next_attempt_time.CopyFrom(_timestamp(delivery.not_before))
    return out


@dataclasses.dataclass(frozen=True)
class Attempt:
    """How one POST went: `result` is lipline_webhook_attempts_total's label."""

    result: str  # delivered (2xx), failed (another status), timeout, unreachable
    status: int  # the HTTP status; 0 when none came
    error: str  # "" when delivered


def backoff_s(failures: int, first_s: float, max_s: float) -> float:
    """The wait after the `failures`-th failed attempt: first_s doubled per failure, capped, with
    jitter (0.5..1 of it) so receivers that come back are not hit by every gateway at once."""
    return min(max_s, first_s * 2 ** max(0, failures - 1)) * random.uniform(0.5, 1.0)


class WebhookSender:
    """A task on the gateway's event loop that delivers the outbox (see the module's doc)."""

    def __init__(self, jobs: JobStore, rules: CallbackRules, settings: GatewaySettings, metrics: Metrics) -> None:
        self._jobs, self._rules, self._s, self._metrics = jobs, rules, settings, metrics
        for result in ("delivered", "failed", "timeout", "unreachable", "gave_up"):
            metrics.webhook_attempts.labels(result)  # exported from 0, so a rate has data before the first
        # The lease outlives a post cut at the timeout, with time to record it.
        self._lease_s = 2 * settings.callback_timeout_s + 1.0
        self._slots = asyncio.Semaphore(settings.callback_concurrency)
        self._posts: set[asyncio.Task] = set()
        self._task: asyncio.Task | None = None
        self._session: aiohttp.ClientSession | None = None

    def start(self) -> None:
        if self._task is None:
            tls = ssl.create_default_context(cafile=self._s.callback_ca_file or None)
            self._session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=tls), trust_env=False)
            self._task = asyncio.create_task(self._run(), name="lipline-webhooks")

    async def close(self) -> None:
        task, self._task = self._task, None
        await cancel_and_wait(task)
        for post in list(self._posts):
            await cancel_and_wait(post)
        if self._session is not None:
            await self._session.close()

    async def _run(self) -> None:
        while True:
            await self._slots.acquire()
            try:
                delivery = await asyncio.to_thread(self._jobs.claim_delivery, self._lease_s)
            except Exception as exc:  # noqa: BLE001 - a store that is down now: the next round retries
                self._slots.release()
                _LOGGER.warning("webhooks: claiming a delivery failed (%s: %s)", type(exc).__name__, exc)
                await asyncio.sleep(self._s.callback_poll_s)
                continue
            if delivery is None:
                self._slots.release()
                await asyncio.sleep(self._s.callback_poll_s)
                continue
            post = asyncio.create_task(self._deliver(delivery), name=f"lipline-webhook-{delivery.id}")
            self._posts.add(post)
            post.add_done_callback(self._posts.discard)

    async def _deliver(self, delivery: Delivery) -> None:
        try:
            try:
                attempt = await self._attempt(delivery)
            except NotFound:  # DeleteJob took the row too: nothing to record, nothing to retry
                _LOGGER.info("webhook %s: its job %s was deleted; not sent", delivery.id, delivery.job_id)
                return
            delivered = attempt.result == "delivered"
            retry_after: float | None = None
            if not delivered:
                wait = backoff_s(delivery.attempts, self._s.callback_backoff_s, self._s.callback_backoff_max_s)
                if time.time() + wait < delivery.create_time + self._s.callback_retry_window_s:
                    retry_after = wait
            self._metrics.webhook_attempts.labels(attempt.result).inc()
            if not delivered and retry_after is None:
                self._metrics.webhook_attempts.labels("gave_up").inc()
            log = _LOGGER.info if delivered else _LOGGER.warning
            log(
                "webhook delivered" if delivered else "webhook attempt failed",
                extra={
                    "job_id": delivery.job_id,
                    "delivery_id": delivery.id,
                    "attempt": delivery.attempts,
                    "status": attempt.status,
                    "error": attempt.error,
                    "retry_in_s": retry_after,
                },
            )
            recorded = await asyncio.to_thread(
                self._jobs.finish_delivery, delivery, attempt.status, attempt.error, delivered, retry_after
            )
            if not recorded:
                _LOGGER.warning("webhook %s: the lease ran out before the attempt was recorded", delivery.id)
        except Exception:  # one delivery's trouble never stops the others; its lease expires
            _LOGGER.exception(
                "webhook %s: recording the attempt failed; it is retried once its lease expires", delivery.id
            )
        finally:
            self._slots.release()

    async def _attempt(self, delivery: Delivery) -> Attempt:
        """One POST of the job's current view (NotFound when the job is gone)."""
        job = await asyncio.to_thread(self._jobs.get_job, delivery.job_id)
        secret = self._rules.secrets.get(delivery.tenant)
        if secret is None:
            return Attempt(
                "failed", 0, f"tenant {delivery.tenant!r} has no webhook secret any more (webhook_secrets_file)"
            )
        try:
            target = self._rules.url(delivery.url)
        except InvalidRequest as exc:  # the operator's lists changed since SubmitJob
            return Attempt("failed", 0, f"the callback URL is not allowed any more: {exc}")
        body = json_format.MessageToJson(job_to_proto(job), indent=None).encode()
        timestamp = str(int(time.time()))
        headers = {
            "Content-Type": "application/json",
            "User-Agent": "lipline-webhooks",
            ID_HEADER: delivery.id,
            TIMESTAMP_HEADER: timestamp,
            SIGNATURE_HEADER: signature(secret, timestamp, body),
        }
        return await self._post(target, body, headers)

    async def _post(self, target: CheckedUrl, body: bytes, headers: Mapping[str, str]) -> Attempt:
        """One POST to a checked URL: aiohttp is handed that very object (no second parse)."""
        assert self._session is not None
        timeout = self._s.callback_timeout_s
        try:
            async with asyncio.timeout(timeout):
                async with self._session.post(
                    target.url, data=body, headers=headers, allow_redirects=False
                ) as response:
                    await response.content.read(64 * 1024)  # what the receiver says is not kept
                    if 200 <= response.status < 300:
                        return Attempt("delivered", response.status, "")
                    return Attempt("failed", response.status, f"the receiver answered HTTP {response.status}")
        except TimeoutError:
            return Attempt("timeout", 0, f"no answer within callback_timeout_s ({timeout:g} s)")
        except aiohttp.ClientError as exc:
            return Attempt("unreachable", 0, f"could not reach the receiver: {type(exc).__name__}: {exc}")
