"""Media in and out of lipline's wire: decoding and probing (FFmpeg through PyAV, OpenCV), image
headers, decode limits, speech envelopes, face crops, and the wire formats of frames and packed
images. No torch.

May import: the standard library, numpy, av, cv2, the protobuf stubs and `services.serving`
(errors). Never torch, `services.jobs` or `services.inference` (tests/unit/test_walls.py).
"""
