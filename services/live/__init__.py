"""The live worker's per-session building blocks: speech streamed in, an avatar's frames paced out.

A live session (issue 19, docs/architecture.md) turns PCM chunks into video frames in real time.
This package holds what one session needs and nothing that needs a GPU: the incremental Wav2Lip mel
(`mel_stream`, over the streaming resampler `resample`), the frame clock (`clock`), per-frame
encoders (`encoders`), the idle loop (`idle`), the re-timing of input audio to frames and the
speech queue (`audio_retime`), and a session that ties them together (`session`). The lip-sync
model itself runs in the lipsync stage; a live worker is a CPU pod and its image carries no torch.

May import: the standard library, numpy, scipy, av, cv2, `services.serving`,
`services.media` (the mel, the compositor, the loop policy, the encoders' video conventions).
Never another deployable's package, torch, torchvision, librosa or `services.inference` (tests/unit/test_walls.py).
"""
