#!/usr/bin/env python
"""How far a live session's whisper tokens are from a job's: the musetalk tier's live approximation
(services/live/whisper_stream.py) measured on real speech through a seeded whisper-tiny encoder.

The job's tokens: upstream's path (the clip's 30 s log-mel windows, float16 as SubmitJob stores
them, the encoder, the states joined and cut to floor(seconds x 50) positions, `whisper_chunks`). The
live tokens: the speech pushed in 20 ms chunks into a WhisperStream; each frame, once `ready`, gets
its window (float16 on the wire, as the face link sends it), the encoder runs on it, and the frame's
10 positions are read at its offset (zeros outside the window's positions), as the stage gathers
them. Printed per right context: the mean and max absolute difference of the tokens [frames, 50, 384]
over the frames, and the mean absolute token for scale. Weights: whisper-tiny's config, seeded
(services/lipsync/musetalk/seeded.py), or the public checkpoint with --whisper: trained weights give other
numbers; seeded ones measure the approximation's mechanics (the encoder's attention reaching the
missing future, the window's own maximum).

    python bench/musetalk_live_features.py                      # samples/speech.wav, R = 0, 80, 200 ms
    python bench/musetalk_live_features.py --repeat 5 --every 4  # a 38 s utterance: the job's second window too
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
if __package__ in (None, ""):
    sys.path.insert(0, str(REPO_ROOT))

import numpy as np
import torch

from services.lipsync.musetalk import load_whisper_encoder, whisper_chunks
from services.lipsync.musetalk.seeded import write_seeded_whisper
from services.lipsync.musetalk.whisper import feature_length
from services.live.whisper_stream import WhisperStream, lookahead_ms
from services.media.audio import decode_audio
from services.media.musetalk_wire import clip_windows, pack_window, unpack_window
from services.media.whisper_mel import whisper_log_mel_segments

FPS = 25.0
RATE = 16000


def offline_tokens(encoder: torch.nn.Module, speech: np.ndarray, frames: int) -> torch.Tensor:
    """A job's tokens [frames, 50, 384]: its windows as stored (float16), encoded, joined, chunked."""
    windows = clip_windows(whisper_log_mel_segments(speech).astype(np.float16), len(speech))
    mel = torch.from_numpy(np.stack([unpack_window(w).full_columns() for w in windows]))
    with torch.no_grad():
        hidden = encoder(mel).reshape(-1, 5, 384)[: feature_length(len(speech))]
    return whisper_chunks(hidden, frames, FPS)


def live_tokens(encoder: torch.nn.Module, speech: np.ndarray, frames: list[int], right_ms: float) -> torch.Tensor:
    """The live tokens of `frames`, each from its own window as the face link sends it."""
    stream = WhisperStream(RATE, FPS, right_ms)
    heard, out = 0, []
    for frame in frames:
        while not stream.ready(frame):
            if heard >= len(speech):
                stream.finish()
                break
            stream.push(speech[heard : heard + RATE // 50].astype(np.float64))
            heard += RATE // 50
        window = stream.frame_window([frame])
        mel = unpack_window(pack_window(0, window.log_mel, window.pad_value, window.positions)).full_columns()
        with torch.no_grad():
            hidden = encoder(torch.from_numpy(mel)[None])[0, : window.positions]
        tokens = torch.zeros((10, 5, 384))
        for k in range(10):
            position = window.offsets[0] + k
            if 0 <= position < window.positions:
                tokens[k] = hidden[position]
        out.append(tokens.reshape(50, 384))
    return torch.stack(out)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--audio", type=Path, default=REPO_ROOT / "samples" / "speech.wav")
    p.add_argument("--repeat", type=int, default=1, help="the audio this many times over, as one utterance")
    p.add_argument("--every", type=int, default=1, help="measure every n-th frame (each costs an encoder pass)")
    p.add_argument("--right-ms", type=float, nargs="+", default=[0.0, 80.0, 200.0])
    p.add_argument(
        "--whisper", type=Path, help="an HF whisper-tiny folder (the public checkpoint) instead of seeded weights"
    )
    p.add_argument("--out", type=Path, help="also write the figures as JSON")
    args = p.parse_args(argv)
    torch.set_grad_enabled(False)
    speech = np.tile(decode_audio(args.audio.read_bytes(), RATE), args.repeat)
    frames = int(len(speech) / RATE * FPS)
    if args.whisper:
        encoder = load_whisper_encoder(args.whisper)
    else:
        with tempfile.TemporaryDirectory() as folder:
            encoder = load_whisper_encoder(write_seeded_whisper(Path(folder) / "whisper"))
    offline = offline_tokens(encoder, speech, frames)
    chosen = list(range(0, frames, args.every))
    scale = float(offline[chosen].abs().mean())
    results = []
    print(
        f"{args.audio.name} x{args.repeat}: {len(speech) / RATE:.2f} s, {len(chosen)} of {frames} frames; mean |token| {scale:.4f}"
    )
    for right in args.right_ms:
        diff = (live_tokens(encoder, speech, chosen, right) - offline[chosen]).abs()
        row = {
            "right_context_ms": right,
            "lookahead_ms": lookahead_ms(right, FPS),
            "mean_abs_diff": float(diff.mean()),
            "max_abs_diff": float(diff.max()),
            "relative_mean": float(diff.mean()) / scale,
        }
        results.append(row)
        print(
            f"R = {right:5.0f} ms (look-ahead {row['lookahead_ms']:.1f} ms): mean |diff| {row['mean_abs_diff']:.4f} "
            f"({100 * row['relative_mean']:.1f} % of the mean token), max {row['max_abs_diff']:.3f}"
        )
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(
            json.dumps({"audio": str(args.audio), "repeat": args.repeat, "scale": scale, "results": results}, indent=2)
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
