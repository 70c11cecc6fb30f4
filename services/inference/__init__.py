"""Torch model serving, for the model stages only (lipsync, superres): the `ModelStage` base and its
backend's start-up (`stage`), the device batch engine and its streams (`engine`), the dynamic batcher
(`batcher`), the device's choice and checks (`device`), checkpoint loading (`checkpoints`), Conv+BN
folding (`folding`), ONNX export checks (`onnx_export`) and the backends (`backends`: torch, compile,
TensorRT, CPU).

May import: torch, numpy, `services.serving` and `services.media`. Never `services.jobs`: a model
stage knows nothing of jobs or stores (tests/unit/test_walls.py).
"""
