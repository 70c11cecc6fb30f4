"""The lipsync-musetalk stage in-process on 127.0.0.1 (the weight-free stand-in on the CPU unless
checkpoints are given), for the unit tests of the stage, its networks and the gateway's PrepareAvatar
client: a blocking stub to it, and `generate` for one Generate stream."""

from __future__ import annotations

import numpy as np

from lipline.v1 import lipsync_pb2, lipsync_pb2_grpc
from services.lipsync.musetalk.service import MuseTalkService
from services.lipsync.musetalk.settings import MuseTalkSettings
from services.serving.metrics import Metrics
from tests.helpers.running_service import RunningService


class RunningStage:
    def __init__(self, **overrides: object) -> None:
        self.settings = MuseTalkSettings(host="127.0.0.1", port=0, metrics_port=-1, device="cpu", **overrides)  # type: ignore[arg-type]
        self.service = RunningService(
            lambda: MuseTalkService(self.settings, Metrics("lipsync-musetalk")), "musetalk-stage", 120
        )

    def __enter__(self) -> RunningStage:
        self.stub = lipsync_pb2_grpc.MuseTalkServiceStub(self.service.__enter__())
        return self

    def __exit__(self, *exc: object) -> None:
        self.service.__exit__(*exc)

    def generate(self, requests: list[lipsync_pb2.MuseTalkGenerateRequest]) -> tuple[list[int], np.ndarray, str]:
        """(frame indices, faces (N, 256, 256, 3) uint8 BGR, the model's name) of one stream."""
        frames, data, model = [], b"", ""
        for response in self.stub.Generate(iter(requests), timeout=60):
            model = model or response.model.name
            assert set(response.faces.widths) <= {256} and set(response.faces.heights) <= {256}
            frames += list(response.faces.frame_indices)
            data += response.faces.data
        return frames, np.frombuffer(data, np.uint8).reshape(-1, 256, 256, 3), model
