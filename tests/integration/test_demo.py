"""The README's demo command on the 256 px tier (issue 30): `python -m services.local --model musetalk`
starts the lipsync-musetalk stage beside the others, makes the sample avatar for the tier and renders
the sample speech on it with the weight-free stand-in, on the CPU."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from services.local.cluster import REPO_ROOT
from services.media.probe import probe_media


def test_the_demo_renders_the_musetalk_tier(tmp_path: Path) -> None:
    out = tmp_path / "demo.mp4"
    command = [sys.executable, "-m", "services.local", "--model", "musetalk", "--workers", "1"]
    command += ["--no-super-resolution", "--workdir", str(tmp_path / "local"), "--output", str(out)]
    done = subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "lipsync-musetalk" in done.stdout  # the stage was started
    assert "(musetalk): 512x512" in done.stdout  # the avatar was made for the tier
    assert "models: musetalk-standin (cpu, fp32)" in done.stdout, done.stdout[-2000:]
    info = probe_media(out)
    assert (info["video_codec"], info["audio_codec"], info["frames"]) == ("h264", "aac", 192)
