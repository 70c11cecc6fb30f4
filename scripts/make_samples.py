"""Regenerate the bundled demo inputs in samples/ (maintainers only; the files are committed).

- samples/avatar.jpg: scikit-image's `astronaut` photo (NASA, public domain), 512x512.
- samples/speech.wav: a short English sentence spoken by espeak-ng (GPL-3 program; its output
  audio is not covered by the GPL), mono 22.05 kHz 16-bit.

Needs `pip install scikit-image` and `apt-get install espeak-ng`, which the service itself does not.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import cv2

SAMPLES = Path(__file__).resolve().parents[1] / "samples"
SENTENCE = "Hello! I am a talking head made by lipline. My lips move with the speech, and stay closed when I am silent."


def main() -> None:
    from skimage import data

    SAMPLES.mkdir(exist_ok=True)
    rgb = data.astronaut()
    cv2.imwrite(str(SAMPLES / "avatar.jpg"), cv2.cvtColor(rgb, cv2.COLOR_RGB2BGR), [cv2.IMWRITE_JPEG_QUALITY, 92])
    subprocess.run(["espeak-ng", "-v", "en-us", "-s", "150", "-w", str(SAMPLES / "speech.wav"), SENTENCE], check=True)
    print("wrote", *sorted(p.name for p in SAMPLES.iterdir()))


if __name__ == "__main__":
    main()
