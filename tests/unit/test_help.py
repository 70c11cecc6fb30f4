"""`python -m services.<name> --help` prints every flag and exits 0, for every service.

argparse formats help strings with `%`, so a help text that says "+36%" (or a default holding a `%`)
used to crash --help with "TypeError: must be real number, not dict"; config.parse_settings escapes
them now. Each service runs as its own process, exactly as an operator would type it.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from services.serving.settings import ServiceSettings, parse_settings, setting

REPO_ROOT = Path(__file__).resolve().parents[2]
COMMON = ["--port", "--max-message-bytes", "--grace-s", "--max-connection-age-s", "--log-format"]
FLAGS = {
    "audio": [*COMMON, "--max-audio-bytes", "--max-audio-seconds"],
    "lipsync": [
        *COMMON,
        "--checkpoint",
        "--max-batch",
        "--pipeline-depth",
        "--batch-buckets",
        "--max-crops-per-stream",
    ],
    "superres": [*COMMON, "--model", "--checkpoint", "--max-batch", "--pipeline-depth"],
    "gateway": [*COMMON, "--job-store", "--blob-store", "--audio-address", "--lipsync-address"],
    "render": [*COMMON, "--job-store", "--blob-store", "--lipsync-address", "--superres-address"],
    "live": [
        *COMMON,
        "--job-store",
        "--blob-store",
        "--lipsync-address",
        "--superres-address",
        "--max-sessions",
        "--advertise-address",
    ],
}


@pytest.mark.parametrize("name", sorted(FLAGS))
def test_help_exits_zero_and_lists_the_flags(name: str) -> None:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH", "")])),
    }
    done = subprocess.run(
        [sys.executable, "-m", f"services.{name}", "--help"],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"python -m services.{name}" in done.stdout
    for flag in FLAGS[name]:
        assert flag in done.stdout, f"{flag} missing from `python -m services.{name} --help`"
    assert "LIPLINE_PORT" in done.stdout


def test_percent_signs_and_odd_defaults_in_help(capsys: pytest.CaptureFixture[str]) -> None:
    import dataclasses

    @dataclasses.dataclass(frozen=True)
    class Odd(ServiceSettings):
        ratio: float = setting(0.5, "share of the batch: 50% (and %(default)s is not a format)")
        pattern: str = setting("%d-%s%", "a default with % signs")
        sizes: tuple[int, ...] = setting((), "an empty tuple")
        names: tuple[str, ...] = dataclasses.field(
            default_factory=lambda: ("a", "b"), metadata={"help": "from a factory"}
        )

    with pytest.raises(SystemExit) as exit_info:
        parse_settings(Odd, ["--help"], environ={})
    assert exit_info.value.code == 0
    out = " ".join(capsys.readouterr().out.split())  # argparse wraps lines
    assert "50%" in out and "%(default)s is not a format" in out
    assert "'%d-%s%'" in out
    assert "default (empty)" in out and "default a,b" in out
