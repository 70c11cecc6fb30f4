"""A headless Chromium driven through Debian's chromedriver (the W3C WebDriver protocol), for the page's tests.

Debian's `chromium` and `chromium-driver` (scripts/install.sh installs them); nothing is downloaded
at run time. The client is the handful of WebDriver commands the tests use, over plain HTTP with
the standard library: Selenium 4.52 (the registry's only version) requires a newer certifi than the
lock can hold, so it cannot be locked (docs/decisions.md, "Browser tests").
"""

from __future__ import annotations

import base64
import json
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
#: the W3C key of an element reference in WebDriver's JSON
ELEMENT = "element-6066-11e4-a52e-4f735466cecf"
FLAGS = (
    "--headless",
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
    "--window-size=1280,1000",
)


def missing_reason() -> str:
    """Why the browser tests cannot run here ("" when they can)."""
    for path in (CHROMIUM, CHROMEDRIVER):
        if not Path(path).exists():
            return f"{path} is not installed (Debian's chromium and chromium-driver: bash scripts/install.sh)"
    return ""


class WebDriverError(RuntimeError):
    pass


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Browser:
    """One chromedriver and one Chromium session; `with Browser(fake_audio=wav) as b: b.get(url)`."""

    def __init__(self, fake_audio: Path | None = None, timeout_s: float = 30.0) -> None:
        self.fake_audio = fake_audio
        self.timeout_s = timeout_s
        self.profile = Path(tempfile.mkdtemp(prefix="lipline-chromium-"))
        self.port = _free_port()
        self.driver: subprocess.Popen | None = None
        self.session = ""

    def __enter__(self) -> Browser:
        self.driver = subprocess.Popen(
            [CHROMEDRIVER, f"--port={self.port}", "--allowed-ips=127.0.0.1"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 20
        while True:
            try:
                self._request("GET", "/status")
                break
            except (urllib.error.URLError, ConnectionError):
                if time.monotonic() > deadline:
                    raise WebDriverError("chromedriver did not start within 20 s") from None
                time.sleep(0.1)
        args = [*FLAGS, f"--user-data-dir={self.profile}"]
        if self.fake_audio is not None:
            args.append(f"--use-file-for-fake-audio-capture={self.fake_audio}")
        caps = {
            "capabilities": {
                "alwaysMatch": {"browserName": "chrome", "goog:chromeOptions": {"binary": CHROMIUM, "args": args}}
            }
        }
        self.session = self._request("POST", "/session", caps)["sessionId"]
        self._request("POST", self._s("/timeouts"), {"script": int(self.timeout_s * 1000)})
        return self

    def __exit__(self, *exc: object) -> None:
        if self.session:
            try:
                self._request("DELETE", self._s(""))
            except (WebDriverError, OSError):
                pass
        if self.driver is not None:
            self.driver.terminate()
            try:
                self.driver.wait(10)
            except subprocess.TimeoutExpired:
                self.driver.kill()
                self.driver.wait()
        shutil.rmtree(self.profile, ignore_errors=True)

    # -- the commands the tests use -------------------------------------------------------------------
    def get(self, url: str) -> None:
        self._request("POST", self._s("/url"), {"url": url})

    def find(self, css: str) -> str:
        """The element id of the first match (WebDriverError when none)."""
        return self._request("POST", self._s("/element"), {"using": "css selector", "value": css})[ELEMENT]

    def click(self, css: str) -> None:
        self._request("POST", self._s(f"/element/{self.find(css)}/click"), {})

    def type(self, css: str, text: str) -> None:
        """Replace a text field's value with `text` (typed as keys)."""
        element = self.find(css)
        self._request("POST", self._s(f"/element/{element}/clear"), {})
        self._request("POST", self._s(f"/element/{element}/value"), {"text": text})

    def choose_file(self, css: str, path: Path) -> None:
        """Choose a file in an <input type=file> (what a person does in the file dialog)."""
        self._request("POST", self._s(f"/element/{self.find(css)}/value"), {"text": str(path)})

    def run(self, script: str, *args: Any) -> Any:
        """JavaScript in the page (`return ...`)."""
        return self._request("POST", self._s("/execute/sync"), {"script": script, "args": list(args)})

    def run_async(self, script: str, *args: Any) -> Any:
        """JavaScript that calls `arguments[arguments.length - 1](result)` when done (within timeout_s)."""
        return self._request("POST", self._s("/execute/async"), {"script": script, "args": list(args)})

    def text(self, css: str) -> str:
        return self.run("return document.querySelector(arguments[0]).textContent;", css) or ""

    def wait_for(self, script: str, *args: Any, timeout_s: float = 30.0, what: str = "") -> Any:
        """Poll a `return ...` script until it returns something truthy; return that."""
        deadline = time.monotonic() + timeout_s
        while True:
            value = self.run(script, *args)
            if value:
                return value
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"timed out after {timeout_s:g} s waiting for {what or script}; the page's messages: {self.messages()}"
                )
            time.sleep(0.1)

    def messages(self) -> dict[str, str]:
        """The text of the page's status lines (what a person would read), for failure reports."""
        return self.run(
            "const out = {}; for (const e of document.querySelectorAll('[role=status], progress + span')) out[e.id] = e.textContent; return out;"
        )

    def screenshot(self, path: Path) -> Path:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(base64.b64decode(self._request("GET", self._s("/screenshot"))))
        return path

    # -- the protocol ---------------------------------------------------------------------------------
    def _s(self, path: str) -> str:
        return f"/session/{self.session}{path}"

    def _request(self, method: str, path: str, body: dict | None = None) -> Any:
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(
            f"http://127.0.0.1:{self.port}{path}",
            data=data,
            method=method,
            headers={"Content-Type": "application/json"} if data else {},
        )
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s + 30) as response:
                return json.loads(response.read() or b"{}").get("value")
        except urllib.error.HTTPError as exc:
            try:
                value = json.loads(exc.read()).get("value", {})
            except ValueError:
                value = {}
            raise WebDriverError(
                f"{method} {path}: {value.get('error', exc.code)}: {value.get('message', '')[:2000]}"
            ) from None
