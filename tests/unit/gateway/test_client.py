"""services.gateway.client: the progress callback the demo and the e2e benchmark pass to `wait`.
(The client itself, lipline_client, is tested in tests/unit/clients/.)"""

from __future__ import annotations

from lipline.v1 import gateway_pb2
from services.gateway.client import progress_printer

RUNNING, DONE = gateway_pb2.JOB_STATE_RUNNING, gateway_pb2.JOB_STATE_SUCCEEDED


def test_progress_printer_writes_per_step_and_per_state_change() -> None:
    lines: list[str] = []
    show = progress_printer(lines.append, step=0.25)
    for progress in (0.0, 0.1, 0.2, 0.3, 0.5, 0.6):
        show(
            gateway_pb2.Job(
                state=RUNNING, stage="render", progress=progress, frames_done=int(progress * 100), total_frames=100
            )
        )
    show(gateway_pb2.Job(state=DONE, stage="done", progress=1.0, frames_done=100, total_frames=100))
    assert [line.split()[2] for line in lines] == ["0/100", "30/100", "60/100", "100/100"]
    assert lines[-1].split()[0] == "JOB_STATE_SUCCEEDED"
