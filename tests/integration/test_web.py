"""The web page in a real headless Chromium, against the real services on 127.0.0.1.

Playwright's sync API drives Debian's `chromium` (scripts/install.sh installs it; Playwright's own
browser download is never run: docs/decisions.md, "Browser tests"). One cluster (with the web server,
a live worker and API keys on the gateway) and one browser (its fake microphone fed from a WAV of
speech then silence) are shared by the module; each test gets a fresh browser context (its own
storage, so no key or thumbnail carries over). Each view's screenshot is saved under the test run's
tmp dir (docs/img/ holds one current copy of each). The live socket's resume rules are also driven
on raw WebSockets (websocket-client), where a drop without a close frame and the close codes can be
made and read exactly; those tests kill and restart the web server or the gateway of the shared cluster.
"""

from __future__ import annotations

import asyncio
import json
import time
import urllib.error
import urllib.request
import wave
from collections.abc import Coroutine, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit

import aiohttp
import numpy as np
import pytest
import websocket
from playwright.sync_api import Browser, Page, sync_playwright

from lipline.v1 import session_pb2
from services.gateway.client import LiplineClient
from services.local.cluster import LocalCluster
from tests.helpers.ports import free_port
from tests.integration.util import SAMPLES, eventually, start_cluster

CHROMIUM = Path("/usr/bin/chromium")
pytestmark = pytest.mark.skipif(
    not CHROMIUM.exists(), reason=f"{CHROMIUM} is not installed (Debian's chromium: bash scripts/install.sh)"
)

# Headless comes from launch(headless=True); the rest keep Chromium off the network (no updates, sync
# or QUIC probes from a test run), let media play without a click, and give it a fake microphone
# whose permission prompt is accepted.
FLAGS = (
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--autoplay-policy=no-user-gesture-required",
    "--use-fake-ui-for-media-stream",
    "--use-fake-device-for-media-stream",
)
VIEWPORT = {"width": 1280, "height": 1000}
KEY = "web-test-key-0123456789"
MAX_AVATAR_BYTES = 2 * 1024 * 1024
SPEECH_S, SILENCE_S = 2.0, 2.0  # the fake microphone's loop
FPS = 25  # a live session's frame rate for a photo (services/live)
T = TypeVar("T")


@pytest.fixture(scope="module")
def web_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    workdir = tmp_path_factory.mktemp("web")
    keys = workdir / "api-keys"
    keys.write_text(f"acme:{KEY}\n")
    limit = f"--max-avatar-bytes={MAX_AVATAR_BYTES}"
    # A fixed HTTP port: the resume test restarts the web server, and the page reconnects to its own origin.
    extra = {"gateway": [f"--api-keys-file={keys}", limit], "web": [limit, f"--http-port={free_port()}"]}
    with start_cluster(workdir, extra_args=extra, replicas={"web": 1, "live": 1}) as cluster:
        yield cluster


@pytest.fixture(scope="module")
def avatar_id(web_cluster: LocalCluster) -> str:
    """The sample avatar, for the tests that do not upload it through the page (the same upload is the same avatar)."""
    with LiplineClient(web_cluster.gateway_address, api_key=KEY) as client:
        return client.create_avatar((SAMPLES / "avatar.jpg").read_bytes(), name="avatar.jpg").id


def mic_wav(path: Path) -> Path:
    """SPEECH_S of samples/speech.wav then SILENCE_S of silence, as Chromium's fake microphone loops it."""
    with wave.open(str(SAMPLES / "speech.wav")) as src:
        rate = src.getframerate()
        speech = src.readframes(int(SPEECH_S * rate))
    with wave.open(str(path), "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(rate)
        out.writeframes(speech + b"\0\0" * int(SILENCE_S * rate))
    return path


@pytest.fixture(scope="module")
def chromium(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Browser]:
    """One Chromium for the module: starting it is the slow part, and the fake microphone is a launch flag."""
    wav = mic_wav(tmp_path_factory.mktemp("mic") / "mic.wav")
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=str(CHROMIUM),
            headless=True,
            args=[*FLAGS, f"--use-file-for-fake-audio-capture={wav}"],
        )
        try:
            yield browser
        finally:
            browser.close()


@pytest.fixture
def page(chromium: Browser) -> Iterator[Page]:
    """A fresh page; at the end, no Content-Security-Policy violation may have been reported (Chromium
    logs each one to the console: the page must work under the server's strict policy)."""
    context = chromium.new_context(viewport=VIEWPORT, permissions=["microphone"])
    context.set_default_timeout(30_000)
    violations: list[str] = []
    try:
        page = context.new_page()
        page.on("console", lambda m: violations.append(m.text) if "Content Security Policy" in m.text else None)
        yield page
    finally:
        context.close()
    assert not violations, f"the page broke its Content-Security-Policy: {violations}"


@pytest.fixture(scope="module")
def shots(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("screenshots")


def messages(page: Page) -> dict[str, str]:
    """The text of the page's status lines (what a person would read), for failure reports."""
    return page.evaluate(
        "() => { const out = {}; for (const e of document.querySelectorAll('[role=status], progress + span'))"
        " out[e.id] = e.textContent; return out; }"
    )


def wait_for(page: Page, expression: str, arg: Any = None, timeout_s: float = 30.0, what: str = "") -> Any:
    """Poll a JavaScript expression (or function) in the page until it is truthy; return its value.
    Polled from here with page.evaluate (DevTools' own evaluation), not page.wait_for_function, whose
    in-page polling compiles the expression with eval, which the page's Content-Security-Policy forbids."""
    deadline = time.monotonic() + timeout_s
    while not (value := page.evaluate(expression, arg)):
        if time.monotonic() > deadline:
            raise AssertionError(
                f"timed out after {timeout_s:g} s waiting for {what or expression}; the page's messages: {messages(page)}"
            )
        page.wait_for_timeout(100)
    return value


def text(page: Page, css: str) -> str:
    return page.text_content(css) or ""


def open_page(page: Page, cluster: LocalCluster, key: str) -> None:
    """Load the page and save `key`; return once the page has checked it (accepted or refused). The check
    lists the avatars, and its reply clears the avatars view's message: a test that acted sooner (an
    upload refused in the page) would race it."""
    page.goto(cluster.web_url)
    wait_for(page, "document.body.dataset.ready === 'true'", what="the page to load")
    page.fill("#api-key", key)
    page.click("#save-key")
    wait_for(page, "document.getElementById('key-status').textContent !== 'checking...'", what="the key checked")


def off_playwrights_loop(coroutine: Coroutine[Any, Any, T]) -> T:
    """asyncio.run in a thread of its own: Playwright's sync API keeps its event loop running in the
    test's thread while the module's browser is up, and asyncio.run refuses to start a second there."""
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coroutine).result()


def test_avatar_upload_then_a_job_to_100_percent_and_its_video_plays(
    web_cluster: LocalCluster, page: Page, shots: Path
) -> None:
    open_page(page, web_cluster, KEY)
    wait_for(page, "document.getElementById('key-status').textContent === 'key accepted'", what="the key accepted")
    page.set_input_files("#avatar-file", SAMPLES / "avatar.jpg")
    page.click("#avatar-upload")
    wait_for(page, "document.querySelectorAll('#avatar-list .avatar img').length > 0", what="the thumbnail")
    assert "face found in 1" in text(page, "#avatar-message")
    page.screenshot(path=shots / "avatars.png")

    page.click(".tab[data-view=job]")
    page.set_input_files("#job-audio-file", SAMPLES / "speech.wav")
    page.click("#job-submit")
    wait_for(
        page,
        "(document.getElementById('job-progress').value === 100 && !document.getElementById('job-result').hidden)"
        " || document.getElementById('job-message').classList.contains('error')",
        timeout_s=120,
        what="the job to finish",
    )
    assert text(page, "#job-progress-text").startswith("100 %"), messages(page)
    duration = page.evaluate(
        """() => new Promise((done) => {
        const v = document.getElementById('job-video');
        v.muted = true;
        const played = () => v.currentTime > 0.5 ? done([v.duration, v.currentTime, v.videoWidth]) : setTimeout(played, 50);
        v.play().then(played, (e) => done(['play failed: ' + e.message]));
        })"""
    )
    with wave.open(str(SAMPLES / "speech.wav")) as w:
        audio_s = w.getnframes() / w.getframerate()
    assert isinstance(duration[0], int | float), duration
    assert abs(duration[0] - audio_s) < 0.1, (duration, audio_s)
    assert duration[2] == 512
    assert page.evaluate("document.getElementById('job-download').href.startsWith('blob:')")
    page.screenshot(path=shots / "job.png")


# In the page: per frame drawn, its audio's loudness and how much a 128x128 copy of the canvas
# changed from the frame before: the fraction of pixels that changed visibly (by more than 24 in
# R+G+B: H.264's noise between two encodings of the same picture stays below it) and where (the
# bounding box of those pixels, in 0..1). Resolves after `seconds`.
MEASURE = """(seconds) => new Promise((done) => {
const canvas = document.getElementById('live-canvas');
const small = document.createElement('canvas'); small.width = small.height = 128;
const g = small.getContext('2d', {willReadFrequently: true});
let prev = null, prevIndex = null; const frames = [];
const onFrame = (event) => {
  g.drawImage(canvas, 0, 0, 128, 128);
  const px = g.getImageData(0, 0, 128, 128).data;
  if (prev) {
    let diff = 0, x0 = 128, y0 = 128, x1 = -1, y1 = -1;
    for (let i = 0; i < px.length; i += 4) {
      const d = Math.abs(px[i] - prev[i]) + Math.abs(px[i + 1] - prev[i + 1]) + Math.abs(px[i + 2] - prev[i + 2]);
      if (d > 24) {
        diff += 1; const p = i / 4, x = p % 128, y = Math.floor(p / 128);
        x0 = Math.min(x0, x); x1 = Math.max(x1, x); y0 = Math.min(y0, y); y1 = Math.max(y1, y);
      }
    }
    const box = x1 < 0 ? null : [x0 / 128, y0 / 128, (x1 + 1) / 128, (y1 + 1) / 128];
    frames.push({index: event.detail.index, after: event.detail.index - prevIndex, speech: event.detail.speech,
                 rms: event.detail.rms, diff: diff / (128 * 128), box});
  }
  prev = px; prevIndex = event.detail.index;
};
canvas.addEventListener('lipline-frame', onFrame);
setTimeout(() => { canvas.removeEventListener('lipline-frame', onFrame); done(frames); }, seconds * 1000);
})"""


def start_live(page: Page, cluster: LocalCluster, avatar_id: str, codec: str = "") -> None:
    """Open the page, start a live session of the avatar (in `codec`, else the page's choice) and wait
    for its first frames."""
    open_page(page, cluster, KEY)
    wait_for(page, "document.querySelectorAll('#live-avatar option').length > 0", what="the avatar list")
    page.click(".tab[data-view=live]")
    page.select_option("#live-avatar", avatar_id)
    if codec:
        page.select_option("#live-codec", codec)
    page.click("#live-start")
    wait_for(page, "window.lipline.live.framesDrawn > 10", what="the first frames drawn")


def test_a_live_session_from_the_microphone_moves_the_mouth_in_speech_only_and_clear_returns_to_idle(
    web_cluster: LocalCluster, page: Page, shots: Path, avatar_id: str
) -> None:
    start_live(page, web_cluster, avatar_id)
    idle = page.evaluate(MEASURE, 1.0)
    assert idle and all(not f["speech"] for f in idle)
    assert np.mean([f["diff"] for f in idle]) < 1e-4, "the idle loop of a photo is still"

    assert "H.264 (WebCodecs)" in text(page, "#live-video"), "Debian's Chromium decodes H.264 with WebCodecs"
    page.click("#live-talk")
    frames = page.evaluate(MEASURE, 2 * (SPEECH_S + SILENCE_S) + 1.0)
    page.screenshot(path=shots / "live.png")
    loud = [f for f in frames if f["speech"] and f["rms"] > 0.03]
    # In silence: a frame whose mouth can know of no speech. Its mel window (Wav2Lip's 16 columns) is
    # the 0.2 s from its own time on, so the last few frames before speech already open the mouth,
    # and its pixels are compared with the frame before: silent from one frame before to 0.2 s after.
    # Only frames drawn right after their predecessor count: a loaded machine skips or drops some, and a
    # picture compared with one from before a gap may show a mouth that moved in between.
    ahead = round(0.2 * FPS)
    silent = [
        f
        for i, f in enumerate(frames[1:], 1)
        if f["after"] == 1 and all(g["rms"] < 0.001 for g in frames[i - 1 : i + ahead + 1])
    ]
    assert len(frames) > 100, f"only {len(frames)} frames drawn in {2 * (SPEECH_S + SILENCE_S) + 1:g} s"
    assert len(loud) > 20 and len(silent) > 20, (len(loud), len(silent))
    speech_motion = float(np.mean([f["diff"] for f in loud]))
    silence_motion = float(np.mean([f["diff"] for f in silent]))
    # Measured on the 2-core VM (procedural mouth): ~9e-4 of the pixels change per speech frame (the
    # mouth is a small part of the frame), ~1e-5 per silent one.
    assert speech_motion > 3e-4, speech_motion
    assert silence_motion < speech_motion / 10, (silence_motion, speech_motion)
    # What moves is the mouth: a small region in the face's lower half, not the whole frame.
    boxes = np.array([f["box"] for f in loud if f["box"]])
    x0, y0, x1, y1 = boxes[:, 0].min(), boxes[:, 1].min(), boxes[:, 2].max(), boxes[:, 3].max()
    assert (x1 - x0) * (y1 - y0) < 0.15, (x0, y0, x1, y1)
    latency = text(page, "#live-latency")
    assert latency.endswith("speech frames)"), latency
    latency_ms = float(latency.split(" ms")[0])
    assert 100 < latency_ms < 2000, latency_ms

    page.click("#live-clear")
    wait_for(
        page,
        "!window.lipline.live.lastFrame.speech && document.getElementById('live-state').textContent === 'idle'",
        what="idle after Clear",
    )
    after = page.evaluate(MEASURE, 1.0)
    assert after and all(not f["speech"] for f in after), "Clear stopped the talking: only idle frames follow"
    page.click("#live-stop")
    wait_for(page, "document.getElementById('live-state').textContent === 'no session'", what="the session closed")


def wait_closed(client: LiplineClient, session_id: str, what: str) -> None:
    """Until the gateway says the session is CLOSED."""
    request = session_pb2.GetSessionRequest(session_id=session_id)
    eventually(lambda: client.stub.GetSession(request).state == session_pb2.SESSION_STATE_CLOSED, 15, what)


def test_a_live_session_resumes_when_the_web_server_is_killed_and_restarted(
    web_cluster: LocalCluster, page: Page, avatar_id: str
) -> None:
    """The page's socket drops (its web server killed: no close frame, no CloseSession); the page
    reconnects to the restarted server and resumes the same session from a keyframe, speech included."""
    start_live(page, web_cluster, avatar_id)
    session_id = page.evaluate("window.lipline.live.session.id")
    web_cluster.kill("web")
    wait_for(page, "document.getElementById('live-state').textContent === 'reconnecting'", what="the page reconnecting")
    web_cluster.restart("web")
    wait_for(
        page,
        "document.getElementById('live-message').textContent.endsWith('resumed')",
        what="the session resumed",
    )
    drawn = page.evaluate("window.lipline.live.framesDrawn")
    wait_for(page, f"window.lipline.live.framesDrawn > {drawn + 10}", what="frames after the resume")
    assert page.evaluate("window.lipline.live.session.id") == session_id
    page.set_input_files("#live-file", SAMPLES / "speech.wav")
    page.click("#live-play")
    wait_for(page, "window.lipline.live.lastFrame.speech", what="speech frames after the resume")
    page.click("#live-stop")
    wait_for(page, "document.getElementById('live-state').textContent === 'no session'", what="the session closed")
    with LiplineClient(web_cluster.gateway_address, api_key=KEY) as client:
        wait_closed(client, session_id, "Stop to close the session")


def first_frame(ws: websocket.WebSocket) -> dict[str, Any]:
    """The JSON header of the next frame on a raw live socket (text messages before it skipped)."""
    while isinstance(message := ws.recv(), str):
        pass
    size = int.from_bytes(message[:4], "little")
    return json.loads(message[4 : 4 + size])


def live_socket(cluster: LocalCluster) -> websocket.WebSocket:
    """A raw live WebSocket to the web server, from the page's own origin."""
    url = cluster.web_url.replace("http://", "ws://") + "/api/live"
    return websocket.create_connection(url, header=[f"Origin: {cluster.web_url}"], timeout=30)


def test_a_dropped_socket_keeps_the_session_for_a_resume_and_a_close_frame_closes_it(
    web_cluster: LocalCluster, avatar_id: str
) -> None:
    """The bridge's rule, on raw sockets: a socket that ends without a close frame leaves the session
    ACTIVE for a resume; a resume with another token is refused, with the session's right one it goes
    on from a keyframe; the page's close frame closes the session."""
    ws = live_socket(web_cluster)
    ws.send(json.dumps({"type": "start", "api_key": KEY, "avatar_id": avatar_id, "codec": "jpeg"}))
    session = json.loads(ws.recv())["session"]
    last = first_frame(ws)["index"]
    ws.sock.close()  # the connection ends without a close frame (a network drop)
    with LiplineClient(web_cluster.gateway_address, api_key=KEY) as client:
        request = session_pb2.GetSessionRequest(session_id=session["id"])
        time.sleep(1.0)
        assert client.stub.GetSession(request).state == session_pb2.SESSION_STATE_ACTIVE

        resume = {"type": "resume", "api_key": KEY, "session_id": session["id"], "last_frame": last}
        wrong = live_socket(web_cluster)
        wrong.send(json.dumps({**resume, "resume_token": "not-its-token"}))
        refused = json.loads(wrong.recv())
        assert refused["type"] == "error" and refused["code"] in {"PERMISSION_DENIED", "UNAUTHENTICATED"}, refused
        wrong.close()

        ws = live_socket(web_cluster)
        ws.send(json.dumps({**resume, "resume_token": session["resume_token"]}))
        resumed = json.loads(ws.recv())
        assert resumed["type"] == "session" and resumed["session"]["id"] == session["id"]
        frame = first_frame(ws)
        assert frame["keyframe"] and frame["index"] > last
        ws.close()  # a close frame: the page is done
        wait_closed(client, session["id"], "the close frame to close the session")

        # A page that breaks the protocol (a message over max_live_message_bytes) loses its session too.
        ws = live_socket(web_cluster)
        ws.send(json.dumps({"type": "start", "api_key": KEY, "avatar_id": avatar_id, "codec": "jpeg"}))
        broken = json.loads(ws.recv())["session"]["id"]
        ws.send_binary(bytes(70 * 1024))
        wait_closed(client, broken, "an oversized message to close the session")
        ws.sock.close()


def test_a_gateway_that_goes_away_mid_session_is_resumed_through_its_replacement(
    web_cluster: LocalCluster, avatar_id: str
) -> None:
    """The gateway is killed under a live session: the bridge closes the page's socket with 1013
    ("try again") instead of an error, keeps the session, and a resume once a gateway is back goes on
    from a keyframe (the live worker held the session, detached, meanwhile)."""
    ws = live_socket(web_cluster)
    ws.send(json.dumps({"type": "start", "api_key": KEY, "avatar_id": avatar_id, "codec": "jpeg"}))
    session = json.loads(ws.recv())["session"]
    last = first_frame(ws)["index"]
    web_cluster.kill("gateway")
    while True:
        opcode, frame = ws.recv_data_frame(True)
        if opcode == websocket.ABNF.OPCODE_CLOSE:
            break
        if opcode == websocket.ABNF.OPCODE_BINARY:
            last = max(last, json.loads(frame.data[4 : 4 + int.from_bytes(frame.data[:4], "little")])["index"])
    assert int.from_bytes(frame.data[:2], "big") == 1013, frame.data
    ws.sock.close()
    resume = {
        "type": "resume",
        "api_key": KEY,
        "session_id": session["id"],
        "resume_token": session["resume_token"],
        "last_frame": last,
    }
    ws = live_socket(web_cluster)  # no gateway yet: "try again" (1013), not an error the page would stop at
    ws.send(json.dumps(resume))
    opcode, frame = ws.recv_data_frame(True)
    assert opcode == websocket.ABNF.OPCODE_CLOSE and int.from_bytes(frame.data[:2], "big") == 1013, frame.data
    ws.sock.close()
    web_cluster.restart("gateway")

    def resumed() -> websocket.WebSocket | None:
        """A resumed socket, or None after another 1013 (the web server's channel may still be
        reconnecting to the restarted gateway: the page tries again the same way)."""
        ws = live_socket(web_cluster)
        ws.send(json.dumps(resume))
        opcode, frame = ws.recv_data_frame(True)
        if opcode == websocket.ABNF.OPCODE_CLOSE:
            assert int.from_bytes(frame.data[:2], "big") == 1013, frame.data
            ws.sock.close()
            return None
        answer = json.loads(frame.data)
        assert answer["type"] == "session" and answer["session"]["id"] == session["id"], answer
        return ws

    ws = eventually(resumed, timeout=20, what="a resume through the restarted gateway", every=0.5)
    frame_header = first_frame(ws)
    assert frame_header["keyframe"] and frame_header["index"] > last
    ws.close()
    with LiplineClient(web_cluster.gateway_address, api_key=KEY) as client:
        wait_closed(client, session["id"], "the close frame to close the resumed session")


def test_a_job_from_audio_recorded_with_the_microphone(web_cluster: LocalCluster, page: Page, avatar_id: str) -> None:
    """Record (the fake microphone, encoded to WAV in the page), submit, the job finishes."""
    open_page(page, web_cluster, KEY)
    wait_for(page, "document.querySelectorAll('#job-avatar option').length > 0", what="the avatar list")
    page.click(".tab[data-view=job]")
    page.select_option("#job-avatar", avatar_id)
    page.click("#job-record")
    wait_for(
        page,
        "window.lipline.job.recording && window.lipline.job.recording.chunks.length >= 75",
        what="1.5 s recorded",
    )
    page.click("#job-record")
    assert text(page, "#job-record-status").startswith("recorded ")
    page.click("#job-submit")
    wait_for(
        page,
        "!document.getElementById('job-result').hidden"
        " || document.getElementById('job-message').classList.contains('error')",
        timeout_s=120,
        what="the recorded job to finish",
    )
    assert text(page, "#job-progress-text").startswith("100 %"), messages(page)


def test_a_live_session_in_jpeg_draws_frames_without_webcodecs(
    web_cluster: LocalCluster, page: Page, avatar_id: str
) -> None:
    """The page's fallback for a browser without WebCodecs: JPEG frames drawn with createImageBitmap."""
    start_live(page, web_cluster, avatar_id, codec="jpeg")
    assert "JPEG" in text(page, "#live-video")
    page.set_input_files("#live-file", SAMPLES / "speech.wav")  # "play a file": sent in real time, then EndOfUtterance
    page.click("#live-play")
    wait_for(page, "window.lipline.live.lastFrame.speech", what="speech frames from the file")
    page.click("#live-clear")
    wait_for(page, "!window.lipline.live.lastFrame.speech", what="idle after Clear")
    page.click("#live-stop")
    wait_for(page, "document.getElementById('live-state').textContent === 'no session'", what="the session closed")


def test_a_wrong_api_key_shows_the_gateways_unauthenticated_message(
    web_cluster: LocalCluster, page: Page, shots: Path
) -> None:
    open_page(page, web_cluster, "not-the-key-0123456789")
    status = wait_for(
        page,
        "() => { const t = document.getElementById('key-status').textContent; return t.startsWith('key refused') && t; }",
        what="the key refused",
    )
    assert "not valid here" in status  # the gateway's own words (services/serving/auth.py)
    assert text(page, "#avatar-message").startswith("UNAUTHENTICATED: the API key")
    assert page.evaluate("document.querySelectorAll('#avatar-list .avatar').length") == 0
    assert page.evaluate("sessionStorage.getItem('lipline.apiKey')") == "not-the-key-0123456789"
    assert page.evaluate("localStorage.getItem('lipline.apiKey')") is None, "the key lives in sessionStorage only"
    page.screenshot(path=shots / "wrong-key.png")


def test_an_oversized_upload_shows_the_size_limit(web_cluster: LocalCluster, page: Page, tmp_path: Path) -> None:
    big = tmp_path / "big.jpg"
    big.write_bytes((SAMPLES / "avatar.jpg").read_bytes() + bytes(MAX_AVATAR_BYTES))
    open_page(page, web_cluster, KEY)
    page.set_input_files("#avatar-file", big)
    page.click("#avatar-upload")
    message = wait_for(
        page,
        "() => { const m = document.getElementById('avatar-message'); return m.classList.contains('error') && m.textContent; }",
        what="the upload refused",
    )
    assert "larger than the limit of 2.0 MiB" in message
    # A refresh of the list that succeeds leaves the upload's error for the user to read.
    with page.expect_response(lambda response: response.url.endswith("/api/avatars")):
        page.click("#avatar-refresh")
    page.wait_for_timeout(100)  # the handler runs after the response arrives
    assert page.inner_text("#avatar-message") == message
    assert "error" in (page.get_attribute("#avatar-message", "class") or "")
    # The server refuses it too (a page that skips its own check): 413 with the limit, never reaching the gateway.
    request = urllib.request.Request(
        f"{web_cluster.web_url}/api/avatars", data=big.read_bytes(), headers={"X-Api-Key": KEY}, method="POST"
    )
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=30)
    assert refused.value.code == 413
    assert "limit of 2 MiB" in json.loads(refused.value.read())["error"]


def test_the_api_and_the_live_socket_need_a_key_and_the_socket_the_pages_origin(web_cluster: LocalCluster) -> None:
    with pytest.raises(urllib.error.HTTPError) as no_key:
        urllib.request.urlopen(f"{web_cluster.web_url}/api/avatars", timeout=10)
    assert no_key.value.code == 401 and "API key" in json.loads(no_key.value.read())["error"]

    async def socket(origin: str, host: str = "") -> tuple[int, str]:
        async with aiohttp.ClientSession() as http:
            headers = {"Origin": origin, **({"Host": host} if host else {})}
            try:
                async with http.ws_connect(f"{web_cluster.web_url}/api/live", headers=headers) as ws:
                    await ws.send_json({"type": "start", "avatar_id": "x"})  # no key
                    reply = await ws.receive_json(timeout=10)
                    return 101, reply["code"]
            except aiohttp.WSServerHandshakeError as exc:
                return exc.status, ""

    assert off_playwrights_loop(socket("http://evil.example")) == (403, "")
    # A DNS-rebinding page (its name pointed at this server): Origin and Host agree, and it is refused;
    # with no public_origins set, the page's origins are the loopback ones of its port (web_url's).
    rebound = f"rebind.example:{urlsplit(web_cluster.web_url).port}"
    assert off_playwrights_loop(socket(f"http://{rebound}", host=rebound)) == (403, "")
    assert off_playwrights_loop(socket(web_cluster.web_url)) == (101, "UNAUTHENTICATED")
    log = web_cluster.processes["web"].log() + web_cluster.processes["gateway"].log()
    assert KEY not in log, "no key is ever logged"
