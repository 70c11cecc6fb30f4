"""FaceLink: a live worker's one long-lived Generate stream (and Upscale stream) for all its sessions.

Why one stream per worker, not per session: the lipsync stage's cost is per message, not per frame
(one replica answers ~2,600-3,000 messages a second whatever they carry; docs/architecture.md,
section 10, and docs/decisions.md), so a worker with 100 speaking sessions must send one message per tick holding
a frame of each of them, not 100 messages. The stage's batcher then merges that message with every
other worker's.

What the link does:

- `register(session, crops)` gives the session's reference crops stream-wide crop indices (allocated
  per stream, reused after `unregister`, so sessions never collide; sessions of one avatar may share
  them, `shared_as`) and sends them once, in the next message; a stream that is opened again (the
  replica went away, UNAVAILABLE, GOAWAY) sends every registered session's crops first, before any item.
- A stage closes each connection after its max age (GOAWAY, then a grace, then it cuts the calls
  still open): the link replaces its stream every `max_stream_age_s`, make-before-break (the new
  stream sends the crops, then takes the items; the old one half-closes and answers what it has in
  flight), so with that age below the stage's grace no item is ever cut; it also moves the worker's
  stream from replica to replica (round-robin), spreading workers over them.
- `submit(...)` queues one item and returns a future of its face. A send loop flushes every
  `flush_interval_s` (default one frame, 1/fps), and at once when `max_items_per_message` are queued:
  one GenerateRequest per tick carries every queued item (split only by what a message holds for
  all its items: `raw_size`, and whether items carry a speech value).
- The stage answers each request's items in order (its responses cut one request's faces by bytes,
  never reorder them), so faces are matched to the items sent, in order, and each face's
  (frame index, crop index) is checked against its item: a mismatch is a broken stream.
- A stream error fails only the items in flight on it (StageFailed: retryable or not, from the
  status code); queued items wait for the next stream, which opens after a back-off. Each item has a
  deadline (its due time plus `late_frames` frames): a late face is useless live, so the future fails
  with FaceLate and the session skips that frame. A session that unregisters has its futures
  cancelled and its faces dropped when they come back.
- Overload sheds, it does not collapse: an item is sent only while the stage can still answer it by
  its deadline, by the stream's round-trip estimate (a moving average of message round trips, and at
  least the age of the oldest unanswered message: the wait of whatever queues at the stage now). An
  item it cannot make fails with FaceLate at once, before it costs the stage anything (`shed`). Without
  this, a link asking more of a replica than it answers (400 sessions on one H200 replica) queued
  everything at the stage, every face came back late and none was shown.
- Sessions that asked for super-resolution get 96x96 faces from Generate (`raw_size`) and the link
  sends them on to one Upscale stream (same ordering and failure rules) as each response arrives.
- Sessions of a `musetalk` avatar (docs/architecture.md section 12.7) go to the lipsync-musetalk
  stage over the worker's one MuseTalkService.Generate stream, by the same rules: their avatar's
  latents (`ReferenceLatent`, registered like crops, shared per avatar) go once per stream as a
  LatentBank; each session has its own audio window index, and a message carries, per session in it,
  one AudioWindow made at send time from the session's utterance (`WindowSource`: the whisper stream,
  services/live/whisper_stream.py) for all its items in that message, then the items (latent, window,
  offset). Their 256x256 faces come back as Wav2Lip's do (superres scales them to the box).

Torch-free (grpc.aio, numpy): the live worker image installs no torch.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import logging
import time
from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import Any, Protocol

import grpc
import numpy as np

from lipline.v1 import lipsync_pb2, lipsync_pb2_grpc, superres_pb2, superres_pb2_grpc
from services.live.whisper_stream import FrameWindow
from services.media.musetalk_wire import LATENT_SHAPE, pack_items, pack_latents, pack_window
from services.media.packed import PackedImages
from services.media.wire import MAX_IMAGE_SIDE, MEL_BANDS, MEL_STEP, image_from_proto, image_to_proto, mel_to_bytes
from services.serving.channels import StageFailed
from services.serving.errors import FailedPrecondition, InvalidMedia, InvalidRequest, TooLarge

_LOGGER = logging.getLogger(__name__)

CROP_SIZE = 96  # Wav2Lip's reference crop: 96 x 96 BGR
ROUND_TRIP_WEIGHT = 0.2  # of a new sample in a stream's moving average of message round trips
# A stage refuses a message whose faces add up to more (services/inference/request_bounds.py, the
# model stages' own package: the live worker does not import it; a test checks the two agree).
MAX_RETURNED_BYTES_PER_MESSAGE = 256 << 20
UINT32 = 1 << 32
FLOAT16_MAX = 65504.0  # mel windows travel as float16

StubProvider = Callable[[], Any]
LATENTS_PER_MESSAGE = 64  # 16 KiB each: 1 MiB per LatentBank message


class FaceLate(TimeoutError):
    """The face did not come back by its deadline: the session skips the frame (never delays it)."""


@dataclasses.dataclass(frozen=True)
class ReferenceFace:
    """One of a session's reference crops: the avatar frame's face box resized to 96 x 96, and the
    size its generated face is pasted back at (the box's)."""

    image: np.ndarray  # (96, 96, 3) uint8 BGR
    paste_width: int
    paste_height: int


@dataclasses.dataclass(frozen=True)
class ReferenceLatent:
    """One frame of a `musetalk` avatar as its sessions register it: the latents of its 256x256 crop
    (the avatar pack's row) and the size its generated face is pasted back at (the box's)."""

    latents: np.ndarray  # (8, 32, 32) float16
    paste_width: int
    paste_height: int


class WindowSource(Protocol):
    """Where a musetalk item's audio comes from: its utterance's features, asked at send time for the
    window of the frames (of the utterance) that one message carries."""

    def frame_window(self, frames: Sequence[int]) -> FrameWindow: ...


def avatar_reference_latents(
    boxes: Sequence[Sequence[int] | None], latents: np.ndarray, rows: Mapping[int, int]
) -> tuple[list[ReferenceLatent], dict[int, int]]:
    """A musetalk avatar's latents as its sessions register them: (the ReferenceLatents, template
    frame -> latent index to `submit_musetalk` with), as `avatar_reference_faces` for crops."""
    refs: list[ReferenceLatent] = []
    index: dict[int, int] = {}
    for frame, box in enumerate(boxes):
        if box is None or frame not in rows:
            continue
        x1, y1, x2, y2 = (int(v) for v in box)
        index[frame] = len(refs)
        refs.append(ReferenceLatent(np.asarray(latents[rows[frame]]), x2 - x1, y2 - y1))
    return refs, index


def avatar_reference_faces(
    boxes: Sequence[Sequence[int] | None], crops: np.ndarray, crop_row: Mapping[int, int]
) -> tuple[list[ReferenceFace], dict[int, int]]:
    """An avatar's crops as its sessions register them: (the ReferenceFaces, template frame -> crop
    index to `submit` with). Template frames without a face have no crop (they pass through).

    Takes a LocalAvatar's parts (services/jobs/avatar_cache.py: `meta.boxes`, `crops`, `crop_row`),
    as the render workers' segments send them; register with `shared_as` the avatar's id.
    """
    faces: list[ReferenceFace] = []
    index: dict[int, int] = {}
    for frame, box in enumerate(boxes):
        if box is None or frame not in crop_row:
            continue
        x1, y1, x2, y2 = (int(v) for v in box)
        index[frame] = len(faces)
        faces.append(ReferenceFace(crops[crop_row[frame]], x2 - x1, y2 - y1))
    return faces, index


@dataclasses.dataclass(frozen=True)
class FaceLinkSettings:
    """How the link batches and times out; the defaults suit 25 fps sessions."""

    fps: float = 25.0
    #: seconds between sends; None = one frame (1 / fps)
    flush_interval_s: float | None = None
    #: a message is sent at once when this many items are queued (Wav2Lip's batch; under the stage's
    #: max_pending_per_stream, 512 by default, which also bounds the items in flight on the stream)
    max_items_per_message: int = 128
    #: a face may come back this many frames after its due time, then the future fails with FaceLate
    late_frames: float = 2.0
    #: when `submit` is given no due time: it is due this long after submission
    default_due_s: float = 0.3
    #: crop indices one stream may hold (the stage's max_crops_per_stream)
    max_crops: int = 4096
    #: reference crops per message (27 KB each at 96 x 96)
    crops_per_message: int = 128
    backoff_initial_s: float = 0.05
    backoff_max_s: float = 2.0
    #: a call is replaced (make-before-break) after this long; None = never. Keep it below the stage's
    #: max_connection_age_grace_s (default its grace_s, 20 s) so the stage never cuts a call with items in flight
    max_stream_age_s: float | None = 15.0
    #: a replaced call has this long to answer what it has in flight
    drain_s: float = 5.0

    def __post_init__(self) -> None:
        problems = []
        if self.fps <= 0 or (self.flush_interval_s is not None and self.flush_interval_s <= 0):
            problems.append(f"fps ({self.fps}) and flush_interval_s ({self.flush_interval_s}) must be > 0")
        if self.max_items_per_message < 1 or self.crops_per_message < 1 or self.max_crops < 1:
            problems.append("max_items_per_message, crops_per_message and max_crops must be >= 1")
        if self.late_frames < 0 or self.default_due_s < 0 or self.drain_s < 0:
            problems.append("late_frames, default_due_s and drain_s must be >= 0")
        if self.max_stream_age_s is not None and self.max_stream_age_s <= 0:
            problems.append(f"max_stream_age_s must be > 0 (or None: never), got {self.max_stream_age_s}")
        if not 0 < self.backoff_initial_s <= self.backoff_max_s:
            problems.append("backoff_initial_s must be > 0 and <= backoff_max_s")
        if problems:
            raise ValueError("; ".join(problems))

    @property
    def interval_s(self) -> float:
        return self.flush_interval_s if self.flush_interval_s is not None else 1.0 / self.fps

    @property
    def late_s(self) -> float:
        return self.late_frames / self.fps


@dataclasses.dataclass
class FaceLinkCounters:
    """Plain counters for the worker's metrics (Prometheus lives in services/serving/metrics.py)."""

    generate_messages: int = 0  # GenerateRequest messages with items
    generate_items: int = 0
    crop_messages: int = 0  # GenerateRequest messages with crops only
    crops_sent: int = 0
    upscale_messages: int = 0
    upscale_items: int = 0
    faces: int = 0  # futures resolved with a face
    late: int = 0  # futures failed with FaceLate (shed ones included)
    shed: int = 0  # items failed with FaceLate before they were sent: the stage could not answer them in time
    failed: int = 0  # futures failed by a stream error
    dropped: int = 0  # faces that came back for an unregistered session (or a late item)
    streams_opened: int = 0  # Generate and Upscale streams, first ones included
    stream_errors: int = 0


Reference = ReferenceFace | ReferenceLatent


class _CropSet:
    """Reference crops (or a musetalk avatar's latents) under their stream indices: one session's, or
    shared by the sessions of one avatar (`register(..., shared_as=avatar)`): a popular avatar costs
    its crops once per stream."""

    def __init__(self, share_key: Hashable | None, crops: Sequence[Reference], indices: list[int]) -> None:
        self.share_key = share_key
        self.crops = list(crops)
        self.indices = indices  # crop i -> stream crop index
        self.users = 0  # sessions registered with it
        self.musetalk = isinstance(self.crops[0], ReferenceLatent)  # the tier (its stream)


class _Session:
    def __init__(self, key: Hashable, crops: _CropSet, super_resolution: bool, window_index: int = -1) -> None:
        self.key = key
        self.crops = crops
        self.indices = crops.indices  # session crop i -> stream crop index
        self.super_resolution = super_resolution
        self.window_index = window_index  # musetalk: its audio window's index on the stream
        self.active = True
        self.pending: set[_Item] = set()


class _Item:
    """One frame of one session on its way through Generate (and Upscale)."""

    __slots__ = (
        "crop_index",
        "deadline",
        "frame_index",
        "future",
        "mel",
        "raw_face",
        "session",
        "session_crop",
        "source",
        "source_frame",
        "speech",
        "submitted",
        "timer",
        "upscale_index",
    )

    def __init__(
        self,
        session: _Session,
        frame_index: int,
        session_crop: int,
        mel: bytes,
        speech: float | None,
        future: asyncio.Future,
        submitted: float,
    ) -> None:
        self.session = session
        self.frame_index = frame_index
        self.session_crop = session_crop  # an index into the session's crops
        self.crop_index = session.indices[session_crop]  # stream-wide
        self.mel = mel
        self.raw_face: np.ndarray | None = None  # with super-resolution: Generate's 96x96 face, for Upscale
        self.speech = speech
        self.future = future
        self.submitted = submitted
        self.deadline = 0.0
        self.timer: asyncio.TimerHandle | None = None
        self.upscale_index = 0
        self.source: WindowSource | None = None  # musetalk: its utterance's features
        self.source_frame = 0  # musetalk: the frame's index in its utterance

    @property
    def live(self) -> bool:
        return self.session.active and not self.future.done()


def _provider(stub: object) -> StubProvider:
    """A zero-argument stub provider (a DiscoveredChannel's `stub(...)` per stream, or one fixed stub)."""
    return stub if callable(stub) else (lambda: stub)


def _as_stage_failure(stage: str, errors: Sequence[BaseException]) -> StageFailed:
    """The failure of a call's loops as one StageFailed: the stage's status, or ours (a stream that
    ended, answers that do not match); anything else is a bug, logged, and fails the stream INTERNAL."""
    for exc in errors:
        if isinstance(exc, StageFailed):
            return exc
        if isinstance(exc, grpc.aio.AioRpcError):
            return StageFailed(stage, exc)
    for exc in errors:
        if not isinstance(exc, Exception):
            raise exc  # KeyboardInterrupt, SystemExit
    for exc in errors:
        if isinstance(
            exc, asyncio.InvalidStateError
        ):  # a write after the stage ended the stream, and no status to say why
            return _stream_failure(stage, grpc.StatusCode.UNAVAILABLE, "the stage ended the stream")
    _LOGGER.error("face link stream failed unexpectedly", exc_info=errors[0])
    return _stream_failure(stage, grpc.StatusCode.INTERNAL, f"the face link failed: {errors[0]!r}")


def _stream_failure(stage: str, code: grpc.StatusCode, details: str) -> StageFailed:
    """A StageFailed for a failure seen on the client side (the stream ended early, answers that do
    not match the requests), typed like a status the stage could have sent."""
    return StageFailed(stage, grpc.aio.AioRpcError(code, grpc.aio.Metadata(), grpc.aio.Metadata(), details))


class _Call:
    """One opened stream: its gRPC call, its items in flight (in send order), the crop sets sent on it."""

    def __init__(self, call: Any, opened: float) -> None:
        self.call = call
        self.opened = opened
        self.in_flight: collections.deque[list[_Item]] = collections.deque()
        self.sent_at: collections.deque[float] = collections.deque()  # when each in_flight batch was written
        self.cursor = 0  # items of in_flight[0] already answered
        self.sent: set[_CropSet] = set()
        self.answered = False
        self.ready = asyncio.Event()  # its first messages (the crops of every registered session) are written
        self.active = asyncio.Event()  # it is the stream's current call: it takes the queued items
        self.retiring = False  # a successor took over: send nothing more, half-close, answer what is in flight
        self.tasks: list[asyncio.Task] = []


class _OrderedStream:
    """One long-lived bidi stream to a model stage whose answers keep request order.

    Items are queued, sent per tick (or at once when `interval_s` is 0) in messages built by the
    link, remembered in send order per call and matched to the faces as they come back. The stream
    is opened when there is work, opened again after an error with a back-off, and replaced every
    `max_stream_age_s` make-before-break: the successor sends every session's crops first, then
    takes the items, while the old call half-closes and answers what it has in flight. (A stage cuts
    a connection `max_connection_age_grace_s` after its max age; a call younger than that grace,
    replaced before the cut, loses nothing: its successor starts on the new connection.)
    """

    def __init__(self, link: FaceLink, stage: str, interval_s: float) -> None:
        self.link = link
        self.stage = stage
        self.interval_s = interval_s
        self.queue: list[_Item] = []
        self.current: _Call | None = None
        self.kick = asyncio.Event()  # work queued (or a full message, on a ticked stream)
        self.task: asyncio.Task | None = None
        self.draining: set[asyncio.Task] = set()
        self.calls: set[_Call] = set()  # every call not yet ended (the current one, a successor, retired ones)
        self.round_trip_s = 0.0  # moving average of a message's round trip (write to its last face)

    def answer_wait_s(self, call: _Call, now: float) -> float:
        """How long an item written on `call` now will likely wait for its face: the moving average of
        round trips, and at least the age of the oldest unanswered message (what queues at the stage
        now); 0 with nothing in flight (an empty pipe: anything sent is answered as fast as it can be)."""
        if not call.sent_at:
            return 0.0
        return max(self.round_trip_s, now - call.sent_at[0])

    def answered(self, round_trip_s: float) -> None:
        self.round_trip_s += ROUND_TRIP_WEIGHT * (round_trip_s - self.round_trip_s)

    def start(self) -> None:
        self.task = asyncio.create_task(self._run(), name=f"face-link-{self.stage}")

    async def close(self) -> None:
        tasks = [t for t in (self.task, *self.draining) if t is not None]
        tasks += [t for call in self.calls for t in call.tasks]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for call in self.calls:
            call.call.cancel()
        self.calls.clear()

    def put(self, item: _Item) -> None:
        self.queue.append(item)
        if self.interval_s == 0 or len(self.queue) >= self.link.settings.max_items_per_message:
            self.kick.set()

    def wake(self) -> None:
        """Something other than items needs sending (new crops): open the stream if it is not."""
        if self.current is None:
            self.kick.set()

    # --- the calls -------------------------------------------------------------------------------

    async def _run(self) -> None:
        settings = self.link.settings
        backoff = settings.backoff_initial_s
        while True:
            if not self.queue and not self.link.wants_stream(self):
                self.kick.clear()
                await self.kick.wait()
                continue
            opened = time.monotonic()
            try:
                call = self._open()
            except StageFailed as error:
                self._count_failure(error)
                answered = False
            else:
                self._promote(call)
                _, answered = await self._serve(call)
            # A stream that answered, or lived a while, was healthy: its successor backs off afresh.
            if answered or time.monotonic() - opened > settings.backoff_max_s:
                backoff = settings.backoff_initial_s
            await asyncio.sleep(backoff)
            backoff = min(settings.backoff_max_s, backoff * 2)

    def _open(self) -> _Call:
        try:
            grpc_call = self.link.open_call(self)
        except grpc.aio.AioRpcError as exc:  # a discovered channel with no address yet
            raise StageFailed(self.stage, exc) from exc
        self.link.counters.streams_opened += 1
        call = _Call(grpc_call, asyncio.get_running_loop().time())
        self.calls.add(call)
        call.tasks = [
            asyncio.create_task(self._send(call), name=f"face-link-{self.stage}-send"),
            asyncio.create_task(self._receive(call), name=f"face-link-{self.stage}-receive"),
        ]
        return call

    def _promote(self, call: _Call) -> None:
        self.current = call
        call.active.set()

    async def _serve(self, call: _Call) -> tuple[StageFailed, bool]:
        """Run `call` as the current one, replacing it when it is old, until the current one fails:
        (its failure, whether it had answered)."""
        loop = asyncio.get_running_loop()
        max_age = self.link.settings.max_stream_age_s
        while True:
            timer = asyncio.ensure_future(
                asyncio.sleep(max(0.0, call.opened + max_age - loop.time()) if max_age else 1e9)
            )
            try:
                await asyncio.wait([*call.tasks, timer], return_when=asyncio.FIRST_COMPLETED)
            finally:
                timer.cancel()
            if any(t.done() for t in call.tasks):
                return await self._end(call), call.answered
            if max_age is None:  # no age limit: the timer (1e9 s) fired first, keep the call
                continue
            try:
                successor = self._open()
            except StageFailed as error:  # keep the current call; try again in a second
                self._count_failure(error)
                call.opened = loop.time() - max_age + 1.0
                continue
            ready = asyncio.ensure_future(successor.ready.wait())
            try:
                await asyncio.wait([*call.tasks, *successor.tasks, ready], return_when=asyncio.FIRST_COMPLETED)
            finally:
                ready.cancel()
            if any(t.done() for t in call.tasks):  # the current call failed during the handover
                await self._end(successor)
                return await self._end(call), call.answered
            if not successor.ready.is_set():  # the successor failed before it was ready: keep the current one
                await self._end(successor)
                call.opened = loop.time() - max_age + 1.0
                continue
            self._promote(successor)
            self._retire(call)
            call = successor

    def _retire(self, call: _Call) -> None:
        call.retiring = True
        self.kick.set()  # its sender stops waiting for the tick, half-closes
        task = asyncio.create_task(self._drain(call), name=f"face-link-{self.stage}-drain")
        self.draining.add(task)
        task.add_done_callback(self.draining.discard)

    async def _drain(self, call: _Call) -> None:
        """A retired call: its answers still come back; an error fails what is left in flight on it."""
        done, pending = await asyncio.wait(call.tasks, timeout=self.link.settings.drain_s)
        if pending or any(not t.cancelled() and t.exception() is not None for t in done):
            await self._end(call)
        else:
            call.call.cancel()
            self.calls.discard(call)

    async def _end(self, call: _Call) -> StageFailed:
        """Stop a call: cancel its loops and the RPC, fail its items in flight; the failure, as StageFailed."""
        for task in call.tasks:
            task.cancel()
        results = await asyncio.gather(*call.tasks, return_exceptions=True)
        call.call.cancel()
        self.calls.discard(call)
        if self.current is call:
            self.current = None
        errors = [r for r in results if isinstance(r, BaseException) and not isinstance(r, asyncio.CancelledError)]
        error = (
            _as_stage_failure(self.stage, errors)
            if errors
            else _stream_failure(self.stage, grpc.StatusCode.UNAVAILABLE, "the stream was stopped")
        )
        if errors or call.in_flight:
            self._count_failure(error)
        for batch in call.in_flight:
            for item in batch:
                self.link.fail(item, error)
        call.in_flight.clear()
        call.sent_at.clear()
        return error

    def _count_failure(self, error: StageFailed) -> None:
        self.link.counters.stream_errors += 1
        _LOGGER.warning(
            "%s stream failed; its items in flight fail, the link opens it again",
            self.stage,
            extra={"error": str(error)},
        )

    # --- one call's loops ------------------------------------------------------------------------

    async def _send(self, call: _Call) -> None:
        for request in self.link.crop_requests(self, call):  # every registered session's crops, first
            await call.call.write(request)
        call.ready.set()
        await call.active.wait()
        loop = asyncio.get_running_loop()
        settings = self.link.settings
        next_tick = loop.time()
        while True:
            if self.interval_s == 0:  # send as soon as items are queued
                if not self.queue and not call.retiring:
                    self.kick.clear()
                    await self.kick.wait()
                    await asyncio.sleep(0)  # let the caller queue the rest of its run
                ticked = True
            else:
                now = loop.time()
                if now < next_tick and len(self.queue) < settings.max_items_per_message and not call.retiring:
                    self.kick.clear()
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self.kick.wait(), next_tick - now)
                ticked = loop.time() >= next_tick
                if ticked:
                    next_tick += self.interval_s
                    if (
                        next_tick < loop.time()
                    ):  # a late tick (a slow write): keep the cadence, drop the backlog of ticks
                        next_tick = loop.time() + self.interval_s
            if call.retiring:
                await call.call.done_writing()
                return
            queued = self.queue
            try:
                requests = self.link.build_requests(self, call, whole=ticked)
            except Exception:
                # Items taken off the queue but not written: they fail with the stream (`_end`), not late.
                kept = set(self.queue)
                call.in_flight.append([item for item in queued if item not in kept])
                call.sent_at.append(loop.time())
                raise
            # In flight before they are written: a write that fails fails them with the stream.
            sent = loop.time()
            for _, batch in requests:
                if batch:
                    call.in_flight.append(batch)
                    call.sent_at.append(sent)
            for request, _ in requests:
                await call.call.write(request)

    async def _receive(self, call: _Call) -> None:
        while True:
            response = await call.call.read()
            if response is grpc.aio.EOF:  # (an error status raises from read)
                if call.retiring and not call.in_flight:
                    return
                raise _stream_failure(self.stage, grpc.StatusCode.UNAVAILABLE, "the stage ended the stream")
            call.answered = True
            try:
                faces = self.link.parse_response(self, response)
            except InvalidMedia as exc:
                raise _stream_failure(self.stage, grpc.StatusCode.INTERNAL, f"a malformed response: {exc}") from exc
            for keys, face in faces:
                if not call.in_flight:
                    raise _stream_failure(
                        self.stage, grpc.StatusCode.INTERNAL, f"a face came back for {keys} with no item in flight"
                    )
                item = call.in_flight[0][call.cursor]
                expected = self.link.item_keys(self, item)
                if keys != expected:
                    raise _stream_failure(
                        self.stage, grpc.StatusCode.INTERNAL, f"a face came back for {keys} where {expected} was next"
                    )
                call.cursor += 1
                if call.cursor == len(call.in_flight[0]):
                    call.in_flight.popleft()
                    self.answered(asyncio.get_running_loop().time() - call.sent_at.popleft())
                    call.cursor = 0
                self.link.deliver(self, item, face)


class FaceLink:
    """Faces for every session of a live worker over one Generate stream (and one Upscale stream).

    Use: `link = FaceLink(lipsync_stub_provider, superres_stub_provider)`, `await link.start()`;
    per session `register`, then `submit` per speech frame (awaiting the futures), `unregister` at
    its end; `await link.close()` at shutdown. All methods run on the event loop's thread.
    """

    def __init__(
        self,
        lipsync: StubProvider | lipsync_pb2_grpc.LipSyncServiceStub,
        superres: StubProvider | superres_pb2_grpc.SuperResServiceStub | None = None,
        settings: FaceLinkSettings | None = None,
        metadata: tuple[tuple[str, str], ...] = (),
        on_message: Callable[[str, int], None] | None = None,
        musetalk: StubProvider | lipsync_pb2_grpc.MuseTalkServiceStub | None = None,
    ) -> None:
        """`lipsync`, `superres`, `musetalk` (lipsync-musetalk: None where the deployment runs none): a
        stub, or a provider called once per stream opened (so a stream that is opened again lands on
        the stage's current channel). `on_message(stage, items)` is called per message sent with items
        (for an items-per-message histogram)."""
        self.settings = settings or FaceLinkSettings()
        self.counters = FaceLinkCounters()
        self.models: dict[str, dict[str, str]] = {}  # stage -> its ModelInfo, from its first response
        self._lipsync = _provider(lipsync)
        self._superres = _provider(superres) if superres is not None else None
        self._musetalk = _provider(musetalk) if musetalk is not None else None
        self._metadata = metadata
        self._on_message = on_message
        self._sessions: dict[Hashable, _Session] = {}
        self._crop_sets: dict[_CropSet, None] = {}  # in registration order
        self._shared: dict[Hashable, _CropSet] = {}
        self._free_crops: collections.deque[int] = collections.deque()
        self._next_crop = 0
        self._upscale_counter = 0
        self._free_windows: collections.deque[int] = collections.deque()
        self._next_window = 0
        self._generate: _OrderedStream | None = None
        self._upscale: _OrderedStream | None = None
        self._muse: _OrderedStream | None = None

    # --- lifecycle -----------------------------------------------------------------------------

    async def start(self) -> None:
        self._generate = _OrderedStream(self, "lipsync", self.settings.interval_s)
        self._generate.start()
        if self._superres is not None:
            self._upscale = _OrderedStream(self, "superres", 0.0)
            self._upscale.start()
        if self._musetalk is not None:
            self._muse = _OrderedStream(self, "lipsync-musetalk", self.settings.interval_s)
            self._muse.start()

    async def close(self) -> None:
        for stream in (self._generate, self._upscale, self._muse):
            if stream is not None:
                await stream.close()
        for session in list(self._sessions.values()):
            self.unregister(session.key)

    async def __aenter__(self) -> FaceLink:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # --- sessions ------------------------------------------------------------------------------

    @property
    def sessions(self) -> int:
        return len(self._sessions)

    @property
    def crops_in_use(self) -> int:
        return self._next_crop - len(self._free_crops)

    def register(
        self,
        session_key: Hashable,
        crops: Sequence[ReferenceFace] | Sequence[ReferenceLatent],
        super_resolution: bool = False,
        shared_as: Hashable | None = None,
    ) -> None:
        """Register a session's reference crops (its crop i is `crops[i]`); they go out in the next message.

        ReferenceLatents (a musetalk avatar's) make it a session of the lipsync-musetalk stream.
        `shared_as` (an avatar's id and version): sessions registered under the same key share one set
        of crop indices, sent once per stream; the caller promises their crops are the same (the
        first session's are used). Raises InvalidRequest for a crop that is not 96x96 BGR uint8 (or
        latents not (8, 32, 32) float16, or a paste size out of range), a key already registered,
        super-resolution without a superres stage, or latents without a lipsync-musetalk stage;
        TooLarge when the stream has no crop indices left (the stage's max_crops_per_stream).
        """
        if session_key in self._sessions:
            raise InvalidRequest(f"session {session_key!r} is already registered on the face link")
        if super_resolution and self._superres is None:
            raise InvalidRequest("super-resolution was asked for, but this worker has no superres stage")
        if crops and isinstance(crops[0], ReferenceLatent) and self._musetalk is None:
            raise FailedPrecondition(
                "the avatar is of the musetalk tier, but this live worker has no lipsync-musetalk stage "
                "(its lipsync_musetalk_address is empty)"
            )
        crop_set = self._shared.get(shared_as) if shared_as is not None else None
        if crop_set is not None and len(crops) != len(crop_set.crops):
            raise InvalidRequest(
                f"session {session_key!r}: {len(crops)} crops, but {shared_as!r} was registered with {len(crop_set.crops)}"
            )
        if crop_set is None:
            crop_set = self._new_crop_set(session_key, crops, shared_as)
        crop_set.users += 1
        window = self._allocate_window() if crop_set.musetalk else -1
        self._sessions[session_key] = _Session(session_key, crop_set, super_resolution, window)

    def _new_crop_set(self, session_key: Hashable, crops: Sequence[Reference], shared_as: Hashable | None) -> _CropSet:
        if not crops:
            raise InvalidRequest(f"session {session_key!r}: no reference crops")
        if len({type(c) for c in crops}) > 1:
            raise InvalidRequest(f"session {session_key!r}: crops and latents mixed")
        for i, crop in enumerate(crops):
            if isinstance(crop, ReferenceLatent):
                if crop.latents.dtype != np.float16 or crop.latents.shape != LATENT_SHAPE:
                    raise InvalidRequest(
                        f"session {session_key!r}: latents {i} are {crop.latents.dtype} {crop.latents.shape}; send (8, 32, 32) float16"
                    )
            elif crop.image.dtype != np.uint8 or crop.image.shape != (CROP_SIZE, CROP_SIZE, 3):
                raise InvalidRequest(
                    f"session {session_key!r}: reference crop {i} is {crop.image.dtype} {crop.image.shape}; send (96, 96, 3) uint8 BGR"
                )
            if not (0 < crop.paste_width <= MAX_IMAGE_SIDE and 0 < crop.paste_height <= MAX_IMAGE_SIDE):
                raise InvalidRequest(
                    f"session {session_key!r}: reference crop {i}: paste size {crop.paste_width}x{crop.paste_height} is not in 1..{MAX_IMAGE_SIDE}"
                )
        available = len(self._free_crops) + self.settings.max_crops - self._next_crop
        if len(crops) > available:
            raise TooLarge(
                f"the face link has {available} crop indices left, session {session_key!r} needs {len(crops)} (max_crops {self.settings.max_crops})"
            )
        crop_set = _CropSet(shared_as, crops, [self._allocate_crop() for _ in crops])
        self._crop_sets[crop_set] = None
        if shared_as is not None:
            self._shared[shared_as] = crop_set
        stream = self._muse if crop_set.musetalk else self._generate
        if stream is not None:
            stream.wake()
        return crop_set

    def unregister(self, session_key: Hashable) -> None:
        """Forget a session: its futures are cancelled, its faces still in flight are dropped when they
        come back; its crop indices (once no session shares them) are free for the next session,
        which sends its own crops under them."""
        session = self._sessions.pop(session_key, None)
        if session is None:
            return
        session.active = False
        for item in list(session.pending):
            self._settle(item)
            item.future.cancel()
        if session.window_index >= 0:
            self._free_windows.append(session.window_index)  # the next session's window replaces it
        crop_set = session.crops
        crop_set.users -= 1
        if crop_set.users == 0:
            del self._crop_sets[crop_set]
            if crop_set.share_key is not None:
                del self._shared[crop_set.share_key]
            self._free_crops.extend(crop_set.indices)
            for stream in (self._generate, self._upscale):  # its crops are not kept for the calls' lives
                for call in stream.calls if stream is not None else ():
                    call.sent.discard(crop_set)

    def _allocate_crop(self) -> int:
        if self._free_crops:
            return self._free_crops.popleft()
        self._next_crop += 1
        return self._next_crop - 1

    def _allocate_window(self) -> int:
        if self._free_windows:
            return self._free_windows.popleft()
        self._next_window += 1
        return self._next_window - 1

    # --- items ---------------------------------------------------------------------------------

    def submit(
        self,
        session_key: Hashable,
        frame_index: int,
        crop_index: int,
        mel_window: np.ndarray,
        speech: float | None = None,
        due: float | None = None,
    ) -> asyncio.Future[np.ndarray]:
        """Queue one frame's item; its future gives the face (BGR uint8 at the crop's paste size, or
        restored to it by superres), or fails with FaceLate (past `due` + late_frames frames; `due` is
        the event loop's clock, default `default_due_s` from now) or StageFailed (a stream error).

        `crop_index` is the session's own (an index into its registered crops); `mel_window` is the
        frame's (80, 16) Wav2Lip window; `speech` the optional mouth opening in [0, 1].
        """
        session = self._checked(session_key, frame_index, crop_index, musetalk=False)
        if mel_window.shape != (MEL_BANDS, MEL_STEP):
            raise InvalidRequest(f"mel window must be (80, 16), got {mel_window.shape}")
        # Checked here, not by the stage: one bad window there fails the message, every session's items with it.
        if not (np.isfinite(mel_window).all() and np.abs(mel_window).max() <= FLOAT16_MAX):
            raise InvalidRequest(
                f"session {session_key!r}: the mel window of frame {frame_index} holds NaN or infinity (or values beyond float16)"
            )
        mel = mel_to_bytes(mel_window)
        if speech is not None and not 0.0 <= speech <= 1.0:
            raise InvalidRequest(f"speech {speech} is outside [0, 1]")
        assert self._generate is not None, "FaceLink.start() was not awaited"
        loop = asyncio.get_running_loop()
        item = _Item(session, frame_index, crop_index, mel, speech, loop.create_future(), loop.time())
        return self._queue(self._generate, item, due)

    def submit_musetalk(
        self,
        session_key: Hashable,
        frame_index: int,
        crop_index: int,
        source: WindowSource,
        source_frame: int,
        due: float | None = None,
    ) -> asyncio.Future[np.ndarray]:
        """`submit` for a session of a musetalk avatar: its face (256x256 BGR, or restored by superres
        to its paste size) from frame `source_frame` of the utterance whose features are `source` (its
        window is made when the item is sent). `crop_index` is the session's own latent index."""
        session = self._checked(session_key, frame_index, crop_index, musetalk=True)
        assert self._muse is not None, "FaceLink.start() was not awaited"
        loop = asyncio.get_running_loop()
        item = _Item(session, frame_index, crop_index, b"", None, loop.create_future(), loop.time())
        item.source, item.source_frame = source, source_frame
        return self._queue(self._muse, item, due)

    def _checked(self, session_key: Hashable, frame_index: int, crop_index: int, musetalk: bool) -> _Session:
        session = self._sessions.get(session_key)
        if session is None:
            raise InvalidRequest(f"session {session_key!r} is not registered on the face link")
        if session.crops.musetalk != musetalk:
            raise InvalidRequest(
                f"session {session_key!r} is of the {'musetalk' if session.crops.musetalk else 'wav2lip'} tier: "
                f"use {'submit_musetalk' if session.crops.musetalk else 'submit'}"
            )
        if not 0 <= crop_index < len(session.indices):
            raise InvalidRequest(
                f"session {session_key!r}: crop {crop_index} is not one of its {len(session.indices)} crops"
            )
        if not 0 <= frame_index < UINT32:
            raise InvalidRequest(f"frame index {frame_index} is outside 0..2^32-1")
        return session

    def _queue(self, stream: _OrderedStream, item: _Item, due: float | None) -> asyncio.Future[np.ndarray]:
        """Queues an item on `stream` with its deadline (`due` + late_frames; default_due_s from now)."""
        loop = asyncio.get_running_loop()
        item.deadline = (item.submitted + self.settings.default_due_s if due is None else due) + self.settings.late_s
        item.timer = loop.call_at(item.deadline, self._expire, item)
        item.session.pending.add(item)
        stream.put(item)
        return item.future

    def _expire(self, item: _Item) -> None:
        item.timer = None
        self._late(
            item,
            f"the face of frame {item.frame_index} was not back {self.settings.late_frames:g} frames after its due time",
        )

    def _late(self, item: _Item, why: str) -> None:
        if item.future.done():
            return
        self.counters.late += 1
        item.session.pending.discard(item)
        item.future.set_exception(FaceLate(why))

    def _shed(self, item: _Item, wait_s: float) -> None:
        if item.timer is not None:
            item.timer.cancel()
            item.timer = None
        self.counters.shed += 1
        self._late(
            item,
            f"the face of frame {item.frame_index} was not sent: the stage answers in ~{wait_s * 1000:.0f} ms, "
            f"after its deadline (overloaded)",
        )

    def _settle(self, item: _Item) -> None:
        if item.timer is not None:
            item.timer.cancel()
            item.timer = None
        item.session.pending.discard(item)

    def fail(self, item: _Item, error: StageFailed) -> None:
        if item.future.done():
            return
        self._settle(item)
        self.counters.failed += 1
        item.future.set_exception(error)

    # --- what the ordered streams call ---------------------------------------------------------

    def wants_stream(self, stream: _OrderedStream) -> bool:
        """Whether `stream` should be open with nothing queued: a Generate stream while any session of
        its tier is registered (its crops go out at once, before its first items)."""
        if stream is self._generate:
            return any(not s.crops.musetalk for s in self._sessions.values())
        return stream is self._muse and any(s.crops.musetalk for s in self._sessions.values())

    def open_call(self, stream: _OrderedStream) -> Any:
        if stream is self._generate:
            return self._lipsync().Generate(metadata=self._metadata)
        if stream is self._muse:
            assert self._musetalk is not None
            return self._musetalk().Generate(metadata=self._metadata)
        assert self._superres is not None
        return self._superres().Upscale(metadata=self._metadata)

    def crop_requests(self, stream: _OrderedStream, call: _Call) -> list[Any]:
        """A new call's first messages: every registered session's crops (or latents), on Generate."""
        if stream is self._muse:
            banks = self._latents_to_send(call)
            self.counters.crop_messages += len(banks)
            return [lipsync_pb2.MuseTalkGenerateRequest(latents=bank) for bank in banks]
        if stream is not self._generate:
            return []
        crops = self._crops_to_send(call)
        requests = [
            lipsync_pb2.GenerateRequest(crops=crops[i : i + self.settings.crops_per_message])
            for i in range(0, len(crops), self.settings.crops_per_message)
        ]
        self.counters.crop_messages += len(requests)
        return requests

    def build_requests(self, stream: _OrderedStream, call: _Call, whole: bool) -> list[tuple[Any, list[_Item]]]:
        """The messages to write now on `call` and the items each carries: full messages only, unless
        `whole` (a tick), then everything queued. Items already done (late, unregistered) are left out."""
        limit = self.settings.max_items_per_message
        now = asyncio.get_running_loop().time()
        wait_s = stream.answer_wait_s(call, now)
        queue = []
        for item in stream.queue:
            if not item.live:
                continue
            if item.deadline - now < wait_s:  # the stage cannot answer it in time: shed it unsent
                self._shed(item, wait_s)
                continue
            queue.append(item)
        take = len(queue) if whole else len(queue) - len(queue) % limit
        stream.queue = queue[take:]
        queue = queue[:take]
        if stream is self._upscale:
            return [(self._upscale_request(batch), batch) for batch in _batches(queue, limit, raw=False)]
        if stream is self._muse:
            return self._musetalk_requests(call, queue, whole)
        crops = self._crops_to_send(call) if whole or queue else []
        groups: dict[tuple[bool, bool], list[_Item]] = {}
        for item in queue:  # what a message sets for all its items: raw_size, speech values or none
            groups.setdefault((item.session.super_resolution, item.speech is not None), []).append(item)
        requests: list[tuple[Any, list[_Item]]] = []
        while len(crops) > self.settings.crops_per_message or (crops and not groups):
            chunk, crops = crops[: self.settings.crops_per_message], crops[self.settings.crops_per_message :]
            requests.append((lipsync_pb2.GenerateRequest(crops=chunk), []))
            self.counters.crop_messages += 1
        for (raw, _), items in groups.items():
            for batch in _batches(items, limit, raw):
                request = lipsync_pb2.GenerateRequest(crops=crops, items=_pack(batch), raw_size=raw)
                crops = []
                requests.append((request, batch))
                self.counters.generate_messages += 1
                self.counters.generate_items += len(batch)
                if self._on_message is not None:
                    self._on_message("lipsync", len(batch))
        return requests

    def _musetalk_requests(self, call: _Call, queue: list[_Item], whole: bool) -> list[tuple[Any, list[_Item]]]:
        """The lipsync-musetalk stream's messages: latents not sent on `call` yet, then the items in
        messages of at most `max_items_per_message`, each with one window per session in it (a
        session's items from another utterance start a new message)."""
        requests: list[tuple[Any, list[_Item]]] = []
        for bank in self._latents_to_send(call) if whole or queue else []:
            requests.append((lipsync_pb2.MuseTalkGenerateRequest(latents=bank), []))
            self.counters.crop_messages += 1
        batch: list[_Item] = []
        sources: dict[_Session, WindowSource] = {}
        for item in queue:
            assert item.source is not None
            if (
                len(batch) == self.settings.max_items_per_message
                or sources.get(item.session, item.source) is not item.source
            ):
                requests.append((self._musetalk_request(batch), batch))
                batch, sources = [], {}
            batch.append(item)
            sources[item.session] = item.source
        if batch:
            requests.append((self._musetalk_request(batch), batch))
        return requests

    def _musetalk_request(self, batch: list[_Item]) -> lipsync_pb2.MuseTalkGenerateRequest:
        """One message: each session's window for its items here, then the items."""
        by_session: dict[_Session, list[_Item]] = {}
        for item in batch:
            by_session.setdefault(item.session, []).append(item)
        windows: list[lipsync_pb2.AudioWindow] = []
        offsets: dict[int, int] = {}
        for session, items in by_session.items():
            source = items[0].source
            assert source is not None
            window = source.frame_window([item.source_frame for item in items])
            windows.append(pack_window(session.window_index, window.log_mel, window.pad_value, window.positions))
            offsets.update(zip(map(id, items), window.offsets))
        items_pb = pack_items(
            [item.frame_index for item in batch],
            [item.crop_index for item in batch],
            [item.session.window_index for item in batch],
            [offsets[id(item)] for item in batch],
        )
        self.counters.generate_messages += 1
        self.counters.generate_items += len(batch)
        if self._on_message is not None:
            self._on_message("lipsync-musetalk", len(batch))
        return lipsync_pb2.MuseTalkGenerateRequest(windows=windows, items=items_pb)

    def _latents_to_send(self, call: _Call) -> list[lipsync_pb2.LatentBank]:
        """LatentBanks of the musetalk crop sets not yet sent on `call` (marked sent)."""
        indices: list[int] = []
        latents: list[np.ndarray] = []
        for crop_set in self._crop_sets:
            if not crop_set.musetalk or crop_set in call.sent:
                continue
            call.sent.add(crop_set)
            indices += crop_set.indices
            latents += [crop.latents for crop in crop_set.crops]  # type: ignore[union-attr]
        self.counters.crops_sent += len(indices)
        return [
            pack_latents(indices[k : k + LATENTS_PER_MESSAGE], np.stack(latents[k : k + LATENTS_PER_MESSAGE]))
            for k in range(0, len(indices), LATENTS_PER_MESSAGE)
        ]

    def _crops_to_send(self, call: _Call) -> list[lipsync_pb2.ReferenceCrop]:
        """The crops of the crop sets not yet sent on `call` (marked sent)."""
        crops = []
        for crop_set in self._crop_sets:
            if crop_set.musetalk or crop_set in call.sent:
                continue
            call.sent.add(crop_set)
            for index, crop in zip(crop_set.indices, crop_set.crops):
                assert isinstance(crop, ReferenceFace)  # a set of latents is `musetalk`
                crops.append(
                    lipsync_pb2.ReferenceCrop(
                        crop_index=index,
                        image=image_to_proto(crop.image),
                        paste_width=crop.paste_width,
                        paste_height=crop.paste_height,
                    )
                )
        self.counters.crops_sent += len(crops)
        return crops

    def _upscale_request(self, batch: list[_Item]) -> superres_pb2.UpscaleRequest:
        items = []
        for item in batch:
            crop = item.session.crops.crops[item.session_crop]
            assert item.raw_face is not None
            items.append(
                superres_pb2.UpscaleItem(
                    index=item.upscale_index,
                    image=image_to_proto(item.raw_face),
                    out_width=crop.paste_width,
                    out_height=crop.paste_height,
                )
            )
        self.counters.upscale_messages += 1
        self.counters.upscale_items += len(batch)
        if self._on_message is not None:
            self._on_message("superres", len(batch))
        return superres_pb2.UpscaleRequest(items=items)

    def parse_response(self, stream: _OrderedStream, response: Any) -> list[tuple[tuple[int, ...], np.ndarray]]:
        """(keys, face) per face of one response, in order."""
        if response.HasField("model") and stream.stage not in self.models:
            self.models[stream.stage] = {
                "name": response.model.name,
                "backend": response.model.backend,
                "precision": response.model.precision,
            }
        if stream is self._upscale:
            return [((item.index,), image_from_proto(item.image, "restored face")) for item in response.items]
        faces = response.faces
        images = PackedImages.from_pb(faces).arrays()
        return [((f, c), image) for f, c, image in zip(faces.frame_indices, faces.crop_indices, images)]

    def item_keys(self, stream: _OrderedStream, item: _Item) -> tuple[int, ...]:
        return (item.upscale_index,) if stream is self._upscale else (item.frame_index, item.crop_index)

    def deliver(self, stream: _OrderedStream, item: _Item, face: np.ndarray) -> None:
        if not item.live:
            self.counters.dropped += 1
            return
        if stream is not self._upscale and item.session.super_resolution:
            assert self._upscale is not None
            item.raw_face = face
            item.upscale_index = self._upscale_counter
            self._upscale_counter = (self._upscale_counter + 1) % UINT32
            self._upscale.put(item)
            return
        self._settle(item)
        self.counters.faces += 1
        item.future.set_result(face)


def _returned_bytes(item: _Item, raw: bool) -> int:
    """Bytes of the face a stage returns for `item`: 96x96, or at its crop's paste size."""
    if raw:
        return CROP_SIZE * CROP_SIZE * 3
    crop = item.session.crops.crops[item.session_crop]
    return crop.paste_width * crop.paste_height * 3


def _batches(items: list[_Item], limit: int, raw: bool) -> list[list[_Item]]:
    """`items` in messages of at most `limit` items whose faces add up to at most
    MAX_RETURNED_BYTES_PER_MESSAGE (a whole-frame paste size is 12 MB: 20 of them fill a message)."""
    batches: list[list[_Item]] = []
    batch: list[_Item] = []
    total = 0
    for item in items:
        size = _returned_bytes(item, raw)
        if batch and (len(batch) == limit or total + size > MAX_RETURNED_BYTES_PER_MESSAGE):
            batches.append(batch)
            batch, total = [], 0
        batch.append(item)
        total += size
    if batch:
        batches.append(batch)
    return batches


def _pack(batch: list[_Item]) -> lipsync_pb2.GenerateItems:
    speech = [item.speech for item in batch if item.speech is not None]
    return lipsync_pb2.GenerateItems(
        frame_indices=[item.frame_index for item in batch],
        crop_indices=[item.crop_index for item in batch],
        mels=b"".join(item.mel for item in batch),
        speech=speech,
    )


__all__ = [
    "FaceLate",
    "FaceLink",
    "FaceLinkCounters",
    "FaceLinkSettings",
    "FrameWindow",
    "ReferenceFace",
    "ReferenceLatent",
    "WindowSource",
    "avatar_reference_faces",
    "avatar_reference_latents",
]
