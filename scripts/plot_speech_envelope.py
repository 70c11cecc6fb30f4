"""Draws docs/img/quality-speech-envelope.png: the weight-free mouth's opening per frame on issue 10's
three recordings, before (each window's own loudness) and after (the clip's speech envelope).

    .venv/bin/python scripts/plot_speech_envelope.py [output.png]
"""

from __future__ import annotations

import sys
from pathlib import Path

import cv2
import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from services.lipsync.procedural import ProceduralLipSync
from services.media.mel import MelExtractor
from services.media.speech import speech_envelope
from tests.helpers.speech_signals import FPS, clean_speech, speech_frames, variants

ROW_H, MARGIN, WIDTH = 120, 24, 1400


def main(out: Path) -> None:
    extractor, model = MelExtractor(), ProceduralLipSync()
    speech = None
    rows = []
    for name, signal in variants().items():
        windows = extractor.run(signal, FPS)
        before = model.opening(torch.from_numpy(windows)[:, None]).numpy()
        after = speech_envelope(windows, FPS)
        if speech is None:
            speech = speech_frames(clean_speech(), len(windows))
        rows.append((name, before, after))
    n = len(rows[0][1])
    img = np.full((len(rows) * (ROW_H + MARGIN) + MARGIN, WIDTH, 3), 255, np.uint8)
    xs = np.linspace(10, WIDTH - 10, n).astype(np.int32)
    for r, (name, before, after) in enumerate(rows):
        top = MARGIN + r * (ROW_H + MARGIN)
        for i in np.nonzero(speech)[0]:
            cv2.line(img, (int(xs[i]), top), (int(xs[i]), top + ROW_H), (235, 235, 235), 2)
        for values, colour in ((before, (150, 150, 150)), (after, (40, 40, 220))):
            pts = np.stack([xs, (top + ROW_H - values * ROW_H).astype(np.int32)], axis=1)
            cv2.polylines(img, [pts.reshape(-1, 1, 2)], False, colour, 1, cv2.LINE_AA)
        cv2.putText(
            img,
            f"{name}: grey = window loudness (before), red = clip envelope (after); shaded = speech",
            (12, top - 6),
            cv2.FONT_HERSHEY_SIMPLEX,
            0.45,
            (0, 0, 0),
            1,
            cv2.LINE_AA,
        )
    cv2.imwrite(str(out), img)


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path("docs/img/quality-speech-envelope.png"))
