"""services/tools/fetch_models.py against a real HTTP server on 127.0.0.1 (a thread) and moto's S3
server: downloads land atomically with their hash checked, present files are not fetched again, and
each failure has its exit code and a message that says what to fix."""

from __future__ import annotations

import hashlib
import http.server
import logging
import os
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from services.tools import fetch_models
from services.tools.fetch_models import (
    EXIT_FETCH_FAILED,
    EXIT_HASH_MISMATCH,
    EXIT_MISSING,
    EXIT_OK,
    EXIT_USAGE,
    FetchError,
    Item,
    display_url,
    main,
)
from tests.helpers.s3server import S3Server

REPO = Path(__file__).resolve().parents[3]
WEIGHTS = os.urandom(3 * 1024 * 1024 + 17)  # more than one chunk
SHA = hashlib.sha256(WEIGHTS).hexdigest()
WRONG = "0" * 64


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True


@pytest.fixture
def web(tmp_path: Path) -> Iterator[tuple[str, list[str]]]:
    """An HTTP server on 127.0.0.1 serving tmp_path/www (wav2lip.pth = WEIGHTS); its base URL and the paths asked."""
    root = tmp_path / "www"
    root.mkdir()
    (root / "wav2lip.pth").write_bytes(WEIGHTS)
    (root / "flaky.pth").write_bytes(WEIGHTS)
    asked: list[str] = []
    failures = {"/flaky.pth": 2}  # answered 503 twice, then served

    class Handler(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *args: object, **kwargs: object) -> None:
            super().__init__(*args, directory=str(root), **kwargs)

        def do_GET(self) -> None:
            asked.append(self.path)
            if failures.get(self.path, 0) > 0:
                failures[self.path] -= 1
                self.send_error(503, "busy")
                return
            super().do_GET()

        def log_message(self, *args: object) -> None:
            pass

    server = _Server(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", asked
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


@pytest.fixture
def dest(tmp_path: Path) -> Path:
    d = tmp_path / "models"
    d.mkdir()
    return d


def _run(dest: Path, *items: tuple[str, str, str], retries: int = 3) -> int:
    argv = ["--dest", str(dest), "--retries", str(retries), "--timeout", "10"]
    for item in items:
        argv += ["--item", *item]
    return main(argv, sleep=lambda s: None)


def _leftovers(dest: Path) -> list[str]:
    return sorted(p.name for p in dest.rglob(".*.tmp"))


def test_downloads_and_checks_the_hash(web: tuple[str, list[str]], dest: Path) -> None:
    base, asked = web
    assert _run(dest, ("wav2lip.pth", f"{base}/wav2lip.pth", SHA)) == EXIT_OK
    assert (dest / "wav2lip.pth").read_bytes() == WEIGHTS
    assert (dest / "wav2lip.pth").stat().st_mode & 0o777 == 0o644
    assert asked == ["/wav2lip.pth"] and not _leftovers(dest)


def test_what_a_stage_will_load_is_required_after_the_downloads(
    web: tuple[str, list[str]], dest: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The 256 px tier's layout: a file downloaded now, a file already there, two Hugging Face folders."""
    base, _ = web
    (dest / "musetalkV15").mkdir()
    (dest / "musetalkV15" / "musetalk.json").write_text("{}")
    for folder, weights in (("sd-vae", "diffusion_pytorch_model.bin"), ("whisper", "model.safetensors")):
        (dest / folder).mkdir()
        (dest / folder / "config.json").write_text("{}")
        (dest / folder / weights).write_bytes(b"w")
    item = ("musetalkV15/unet.pth", f"{base}/wav2lip.pth", SHA)
    required = ["--require", "musetalkV15/unet.pth", "--require", "musetalkV15/musetalk.json"]
    required += ["--require", "sd-vae", "--require", "whisper"]
    assert main(["--dest", str(dest), "--item", *item, *required]) == EXIT_OK
    # Take the VAE's weights away and ask for a landmark checkpoint nobody downloaded: exit 4, each named.
    (dest / "sd-vae" / "diffusion_pytorch_model.bin").unlink()
    with caplog.at_level(logging.ERROR):
        code = main(["--dest", str(dest), "--item", *item, *required, "--require", "dwpose/dw-ll_ucoco_384.pth"])
    assert code == EXIT_MISSING
    assert "sd-vae/: a model folder without a *.safetensors or *.bin weights file" in caplog.text
    assert "dwpose/dw-ll_ucoco_384.pth: not on the volume (add it to models.download.items" in caplog.text


def test_a_required_path_outside_the_volume_is_refused(dest: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["--dest", str(dest), "--item", "a.pth", "https://x/a.pth", SHA, "--require", "../etc/passwd"])
    assert exited.value.code == EXIT_USAGE and "--require '../etc/passwd'" in capsys.readouterr().err


def test_a_present_file_with_the_right_hash_is_not_fetched_again(web: tuple[str, list[str]], dest: Path) -> None:
    base, asked = web
    (dest / "wav2lip.pth").write_bytes(WEIGHTS)
    assert _run(dest, ("wav2lip.pth", f"{base}/wav2lip.pth", SHA.upper())) == EXIT_OK
    assert asked == []


def test_a_present_file_with_another_hash_is_replaced(web: tuple[str, list[str]], dest: Path) -> None:
    base, asked = web
    (dest / "sub").mkdir()
    (dest / "sub" / "w.pth").write_bytes(b"an older checkpoint")
    assert _run(dest, ("sub/w.pth", f"{base}/wav2lip.pth", SHA)) == EXIT_OK
    assert (dest / "sub" / "w.pth").read_bytes() == WEIGHTS and asked == ["/wav2lip.pth"]


def test_a_wrong_hash_exits_3_and_leaves_nothing(
    web: tuple[str, list[str]], dest: Path, caplog: pytest.LogCaptureFixture
) -> None:
    base, _ = web
    with caplog.at_level(logging.ERROR):
        code = _run(dest, ("wav2lip.pth", f"{base}/wav2lip.pth?sig=secret", WRONG))
    assert code == EXIT_HASH_MISMATCH
    assert not (dest / "wav2lip.pth").exists() and not _leftovers(dest)
    assert f"has sha256 {SHA}" in caplog.text and f"expected {WRONG}" in caplog.text
    assert "secret" not in caplog.text  # the query string (a presigned URL's signature) is never logged


def test_a_wrong_hash_keeps_the_file_already_there(web: tuple[str, list[str]], dest: Path) -> None:
    base, _ = web
    (dest / "wav2lip.pth").write_bytes(b"old")
    assert _run(dest, ("wav2lip.pth", f"{base}/wav2lip.pth", WRONG)) == EXIT_HASH_MISMATCH
    assert (dest / "wav2lip.pth").read_bytes() == b"old"


def test_404_exits_1_without_retrying_and_the_other_items_still_come(
    web: tuple[str, list[str]], dest: Path, caplog: pytest.LogCaptureFixture
) -> None:
    base, asked = web
    code = _run(dest, ("missing.pth", f"{base}/missing.pth", SHA), ("wav2lip.pth", f"{base}/wav2lip.pth", SHA))
    assert code == EXIT_FETCH_FAILED
    assert asked == ["/missing.pth", "/wav2lip.pth"]
    assert (dest / "wav2lip.pth").read_bytes() == WEIGHTS
    assert "HTTP 404" in caplog.text


def test_the_worst_failure_decides_the_exit_code(web: tuple[str, list[str]], dest: Path) -> None:
    base, _ = web
    code = _run(dest, ("a.pth", f"{base}/wav2lip.pth", WRONG), ("b.pth", f"{base}/missing.pth", SHA))
    assert code == EXIT_HASH_MISMATCH


def test_a_503_is_retried(web: tuple[str, list[str]], dest: Path) -> None:
    base, asked = web
    assert _run(dest, ("flaky.pth", f"{base}/flaky.pth", SHA)) == EXIT_OK
    assert asked == ["/flaky.pth"] * 3


def test_retries_run_out(web: tuple[str, list[str]], dest: Path) -> None:
    base, asked = web
    assert _run(dest, ("flaky.pth", f"{base}/flaky.pth", SHA), retries=1) == EXIT_FETCH_FAILED
    assert asked == ["/flaky.pth"] * 2 and not _leftovers(dest)


def test_a_refused_connection_exits_1(dest: Path, refused_port: int) -> None:
    port = refused_port  # bound, never listening: nobody else can take it during the test
    assert _run(dest, ("w.pth", f"http://127.0.0.1:{port}/w.pth", SHA), retries=0) == EXIT_FETCH_FAILED


def test_a_truncated_stream_is_retried_and_never_lands(dest: Path) -> None:
    calls = []

    def opener(url: str, timeout: float) -> Iterator[bytes]:
        calls.append(url)
        yield WEIGHTS[:100]
        raise FetchError("connection reset", retry=True)

    code = main(
        ["--dest", str(dest), "--retries", "2", "--item", "w.pth", "http://h/w.pth", SHA],
        opener=opener,
        sleep=lambda s: None,
    )
    assert code == EXIT_FETCH_FAILED and len(calls) == 3
    assert not (dest / "w.pth").exists() and not _leftovers(dest)


@pytest.mark.parametrize(
    ("item", "message"),
    [
        (("../x.pth", "http://h/x", SHA), "'..'"),
        (("/abs.pth", "http://h/x", SHA), "relative path"),
        (("x.pth", "ftp://h/x", SHA), "not http://, https:// or s3://"),
        (("x.pth", "s3://bucket", SHA), "a bucket and a key"),
        (("x.pth", "http://h/x", "abc"), "not 64 hex digits"),
    ],
)
def test_bad_items_exit_2(
    dest: Path, item: tuple[str, str, str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        _run(dest, item)
    assert exc.value.code == EXIT_USAGE
    assert message in capsys.readouterr().err


def test_the_same_name_twice_is_refused(dest: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        _run(dest, ("a.pth", "http://h/1", SHA), ("a.pth", "http://h/2", SHA))
    assert exc.value.code == EXIT_USAGE and "twice" in capsys.readouterr().err


def test_a_missing_dest_exits_2(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    assert _run(tmp_path / "nope", ("a.pth", "http://h/1", SHA)) == EXIT_USAGE
    assert "is the models volume mounted" in caplog.text


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes anywhere")
def test_a_read_only_dest_exits_1_and_names_fsgroup(dest: Path, caplog: pytest.LogCaptureFixture) -> None:
    dest.chmod(0o555)
    try:
        assert _run(dest, ("a.pth", "http://h/1", SHA)) == EXIT_FETCH_FAILED
    finally:
        dest.chmod(0o755)
    assert "fsGroup" in caplog.text


def test_display_url_hides_credentials_and_queries() -> None:
    assert (
        display_url("https://user:pw@example.org:8443/w.pth?X-Amz-Signature=abc") == "https://example.org:8443/w.pth?…"
    )
    assert Item.parse("w.pth", "s3://b/k/w.pth", SHA.upper()).sha256 == SHA


def test_s3_download_from_moto(dest: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from services.jobs.store.s3 import S3BlobStore

    with S3Server() as server:
        prefix = uuid.uuid4().hex
        S3BlobStore(f"{server.url}/{prefix}", server.env).put("weights/realesr.pth", WEIGHTS)
        for key, value in server.env.items():
            monkeypatch.setenv(key, value)
        url = f"{server.url}/{prefix}/weights/realesr.pth"
        assert _run(dest, ("realesr-general-x4v3.pth", url, SHA)) == EXIT_OK
        assert (dest / "realesr-general-x4v3.pth").read_bytes() == WEIGHTS
        assert _run(dest, ("other.pth", url, WRONG)) == EXIT_HASH_MISMATCH
        assert _run(dest, ("gone.pth", f"{server.url}/{prefix}/nope.pth", SHA), retries=0) == EXIT_FETCH_FAILED
    assert not _leftovers(dest)


def test_the_tool_imports_nothing_the_gateway_image_leaves_out() -> None:
    """The Job runs it in the gateway image (no torch): with the packages that image leaves out made
    unimportable, `--help` works and an s3:// download gets as far as the network."""
    from tests.unit.test_images import in_image

    script = in_image(
        "gateway",
        """
        from services.tools import fetch_models
        fetch_models._s3_chunks  # the s3 branch's imports:
        import services.serving.errors, services.jobs.store.s3
        assert "torch" not in sys.modules
        sys.exit(fetch_models.main(["--help"]))
    """,
    )
    result = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "--item NAME URL SHA256" in result.stdout


def test_module_runs_as_a_script(tmp_path: Path) -> None:
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "services.tools.fetch_models",
            "--dest",
            str(tmp_path),
            "--item",
            "a.pth",
            "http://h/a",
            "nothex",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == EXIT_USAGE and "not 64 hex digits" in result.stderr
    assert fetch_models.__doc__ and "Exit codes" in fetch_models.__doc__
