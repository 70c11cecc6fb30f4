"""The web page in a real headless Chromium, against the real services on 127.0.0.1.

One cluster (with the web server, a live worker and API keys on the gateway) and one browser (its
fake microphone fed from a WAV of speech then silence) are shared by the module. Each view's
screenshot is saved under the test run's tmp dir (docs/img/ holds one current copy of each).
"""

from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.request
import wave
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import numpy as np
import pytest

from services.gateway.client import LiplineClient
from services.local.cluster import LocalCluster
from tests.helpers.browser import Browser, missing_reason
from tests.integration.util import SAMPLES, start_cluster

pytestmark = pytest.mark.skipif(bool(missing_reason()), reason=missing_reason())

KEY = "web-test-key-0123456789"
MAX_AVATAR_BYTES = 2 * 1024 * 1024
SPEECH_S, SILENCE_S = 2.0, 2.0  # the fake microphone's loop


@pytest.fixture(scope="module")
def web_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    workdir = tmp_path_factory.mktemp("web")
    keys = workdir / "api-keys"
    keys.write_text(f"acme:{KEY}\n")
    limit = f"--max-avatar-bytes={MAX_AVATAR_BYTES}"
    extra = {"gateway": [f"--api-keys-file={keys}", limit], "web": [limit]}
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
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Browser]:
    wav = mic_wav(tmp_path_factory.mktemp("mic") / "mic.wav")
    with Browser(fake_audio=wav, timeout_s=60.0) as b:
        yield b


@pytest.fixture(scope="module")
def shots(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("screenshots")


def open_page(browser: Browser, cluster: LocalCluster, key: str) -> None:
    browser.get(cluster.web_url)
    browser.wait_for("return document.body.dataset.ready === 'true';", what="the page to load")
    browser.type("#api-key", key)
    browser.click("#save-key")


def test_avatar_upload_then_a_job_to_100_percent_and_its_video_plays(
    web_cluster: LocalCluster, browser: Browser, shots: Path
) -> None:
    open_page(browser, web_cluster, KEY)
    browser.wait_for("return document.getElementById('key-status').textContent === 'key accepted';")
    browser.choose_file("#avatar-file", SAMPLES / "avatar.jpg")
    browser.click("#avatar-upload")
    browser.wait_for("return document.querySelectorAll('#avatar-list .avatar img').length > 0;", what="the thumbnail")
    assert "face found in 1" in browser.text("#avatar-message")
    browser.screenshot(shots / "avatars.png")

    browser.click(".tab[data-view=job]")
    browser.choose_file("#job-audio-file", SAMPLES / "speech.wav")
    browser.click("#job-submit")
    browser.wait_for(
        "return (document.getElementById('job-progress').value === 100 && !document.getElementById('job-result').hidden)"
        " || document.getElementById('job-message').classList.contains('error');",
        timeout_s=120,
        what="the job to finish",
    )
    assert browser.text("#job-progress-text").startswith("100 %"), browser.messages()
    duration = browser.run_async(
        """const done = arguments[arguments.length - 1];
        const v = document.getElementById('job-video');
        v.muted = true;
        const played = () => v.currentTime > 0.5 ? done([v.duration, v.currentTime, v.videoWidth]) : setTimeout(played, 50);
        v.play().then(played, (e) => done(['play failed: ' + e.message]));"""
    )
    with wave.open(str(SAMPLES / "speech.wav")) as w:
        audio_s = w.getnframes() / w.getframerate()
    assert isinstance(duration[0], float), duration
    assert abs(duration[0] - audio_s) < 0.1, (duration, audio_s)
    assert duration[2] == 512
    assert browser.run("return document.getElementById('job-download').href.startsWith('blob:');")
    browser.screenshot(shots / "job.png")


# In the page: per frame drawn, its audio's loudness and how much a 128x128 copy of the canvas
# changed from the frame before: the fraction of pixels that changed visibly (by more than 24 in
# R+G+B: H.264's noise between two encodings of the same picture stays below it) and where (the
# bounding box of those pixels, in 0..1).
MEASURE = """
const done = arguments[arguments.length - 1], seconds = arguments[0];
const canvas = document.getElementById('live-canvas');
const small = document.createElement('canvas'); small.width = small.height = 128;
const g = small.getContext('2d', {willReadFrequently: true});
let prev = null; const frames = [];
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
    frames.push({speech: event.detail.speech, rms: event.detail.rms, diff: diff / (128 * 128), box});
  }
  prev = px;
};
canvas.addEventListener('lipline-frame', onFrame);
setTimeout(() => { canvas.removeEventListener('lipline-frame', onFrame); done(frames); }, seconds * 1000);
"""


def test_a_live_session_from_the_microphone_moves_the_mouth_in_speech_only_and_clear_returns_to_idle(
    web_cluster: LocalCluster, browser: Browser, shots: Path, avatar_id: str
) -> None:
    open_page(browser, web_cluster, KEY)
    browser.wait_for("return document.querySelectorAll('#live-avatar option').length > 0;", what="the avatar list")
    browser.run("document.getElementById('live-avatar').value = arguments[0];", avatar_id)
    browser.click(".tab[data-view=live]")
    browser.click("#live-start")
    browser.wait_for("return window.lipline.live.framesDrawn > 10;", what="idle frames drawn")
    idle = browser.run_async(MEASURE, 1.0)
    assert idle and all(not f["speech"] for f in idle)
    assert np.mean([f["diff"] for f in idle]) < 1e-4, "the idle loop of a photo is still"

    assert "H.264 (WebCodecs)" in browser.text("#live-video"), "Debian's Chromium decodes H.264 with WebCodecs"
    browser.click("#live-talk")
    frames = browser.run_async(MEASURE, 2 * (SPEECH_S + SILENCE_S) + 1.0)
    browser.screenshot(shots / "live.png")
    loud = [f for f in frames if f["speech"] and f["rms"] > 0.03]
    silent = [f for f in frames if f["rms"] < 0.001]
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
    assert browser.text("#live-latency").endswith("speech frames)"), browser.text("#live-latency")
    latency_ms = float(browser.text("#live-latency").split(" ms")[0])
    assert 100 < latency_ms < 2000, latency_ms

    browser.click("#live-clear")
    browser.wait_for(
        "return !window.lipline.live.lastFrame.speech && document.getElementById('live-state').textContent === 'idle';",
        what="idle after Clear",
    )
    after = browser.run_async(MEASURE, 1.0)
    assert after and all(not f["speech"] for f in after), "Clear stopped the talking: only idle frames follow"
    browser.click("#live-stop")
    browser.wait_for("return document.getElementById('live-state').textContent === 'no session';")


def test_a_job_from_audio_recorded_with_the_microphone(
    web_cluster: LocalCluster, browser: Browser, avatar_id: str
) -> None:
    """Record (the fake microphone, encoded to WAV in the page), submit, the job finishes."""
    open_page(browser, web_cluster, KEY)
    browser.wait_for("return document.querySelectorAll('#job-avatar option').length > 0;", what="the avatar list")
    browser.run("document.getElementById('job-avatar').value = arguments[0];", avatar_id)
    browser.click(".tab[data-view=job]")
    browser.click("#job-record")
    browser.wait_for("return window.lipline.job.recording && window.lipline.job.recording.chunks.length >= 75;")
    browser.click("#job-record")
    assert browser.text("#job-record-status").startswith("recorded ")
    browser.click("#job-submit")
    browser.wait_for(
        "return !document.getElementById('job-result').hidden"
        " || document.getElementById('job-message').classList.contains('error');",
        timeout_s=120,
        what="the recorded job to finish",
    )
    assert browser.text("#job-progress-text").startswith("100 %"), browser.messages()


def test_a_live_session_in_jpeg_draws_frames_without_webcodecs(
    web_cluster: LocalCluster, browser: Browser, avatar_id: str
) -> None:
    """The page's fallback for a browser without WebCodecs: JPEG frames drawn with createImageBitmap."""
    open_page(browser, web_cluster, KEY)
    browser.wait_for("return document.querySelectorAll('#live-avatar option').length > 0;", what="the avatar list")
    browser.run(
        "document.getElementById('live-avatar').value = arguments[0];"
        "document.getElementById('live-codec').value = 'jpeg';",
        avatar_id,
    )
    browser.click(".tab[data-view=live]")
    browser.click("#live-start")
    browser.wait_for("return window.lipline.live.framesDrawn > 10;", what="JPEG frames drawn")
    assert "JPEG" in browser.text("#live-video")
    browser.choose_file("#live-file", SAMPLES / "speech.wav")  # "play a file": sent in real time, then EndOfUtterance
    browser.click("#live-play")
    browser.wait_for("return window.lipline.live.lastFrame.speech;", what="speech frames from the file")
    browser.click("#live-clear")
    browser.wait_for("return !window.lipline.live.lastFrame.speech;", what="idle after Clear")
    browser.click("#live-stop")
    browser.wait_for("return document.getElementById('live-state').textContent === 'no session';")


def test_a_wrong_api_key_shows_the_gateways_unauthenticated_message(
    web_cluster: LocalCluster, browser: Browser, shots: Path
) -> None:
    open_page(browser, web_cluster, "not-the-key-0123456789")
    status = browser.wait_for(
        "const t = document.getElementById('key-status').textContent; return t.startsWith('key refused') && t;"
    )
    assert "not valid here" in status  # the gateway's own words (services/serving/auth.py)
    assert browser.text("#avatar-message").startswith("UNAUTHENTICATED: the API key")
    assert browser.run("return document.querySelectorAll('#avatar-list .avatar').length;") == 0
    assert browser.run("return sessionStorage.getItem('lipline.apiKey');") == "not-the-key-0123456789"
    assert browser.run("return localStorage.getItem('lipline.apiKey');") is None, "the key lives in sessionStorage only"
    browser.screenshot(shots / "wrong-key.png")


def test_an_oversized_upload_shows_the_size_limit(web_cluster: LocalCluster, browser: Browser, tmp_path: Path) -> None:
    big = tmp_path / "big.jpg"
    big.write_bytes((SAMPLES / "avatar.jpg").read_bytes() + bytes(MAX_AVATAR_BYTES))
    open_page(browser, web_cluster, KEY)
    browser.choose_file("#avatar-file", big)
    browser.click("#avatar-upload")
    message = browser.wait_for(
        "const m = document.getElementById('avatar-message'); return m.classList.contains('error') && m.textContent;"
    )
    assert "larger than the limit of 2.0 MiB" in message
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

    async def socket(origin: str) -> tuple[int, str]:
        async with aiohttp.ClientSession() as http:
            try:
                async with http.ws_connect(f"{web_cluster.web_url}/api/live", headers={"Origin": origin}) as ws:
                    await ws.send_json({"type": "start", "avatar_id": "x"})  # no key
                    reply = await ws.receive_json(timeout=10)
                    return 101, reply["code"]
            except aiohttp.WSServerHandshakeError as exc:
                return exc.status, ""

    assert asyncio.run(socket("http://evil.example")) == (403, "")
    assert asyncio.run(socket(web_cluster.web_url)) == (101, "UNAUTHENTICATED")
    log = web_cluster.processes["web"].log() + web_cluster.processes["gateway"].log()
    assert KEY not in log, "no key is ever logged"
