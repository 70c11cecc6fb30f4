"""Media in and out of lipline's wire: decoding and probing (FFmpeg through PyAV, OpenCV), image
headers, decode limits, speech envelopes, face crops, Wav2Lip's mel features (`mel`), whisper's log-mel
for the 256 px tier (`whisper_mel`, numpy only), the video
conventions every encoder shares (`video_format`), the compositor that blends faces into cached I420
frames (`composite`), the template loop policy (`timeline`), and the wire formats of frames and
packed images. Shared by several deployables (render and live composite and encode; audio and live
compute mels). No torch.

May import: the standard library, numpy, scipy, av, cv2, the protobuf stubs and `services.serving`
(errors). Never torch, librosa, `services.jobs` or `services.inference` (tests/unit/test_walls.py).
"""
