"""Which template frame each output frame shows: the job's loop policy, when the audio outlasts
the template video. A pure function of (output frame, template length, loop mode), so every segment
of a job, on any worker, maps its frames the same way."""

from __future__ import annotations

from lipline.v1 import gateway_pb2

LOOP_PING_PONG = "ping_pong"
LOOP_WRAP = "wrap"
LOOP_MODES = (LOOP_PING_PONG, LOOP_WRAP)


def loop_frame(output_index: int, frame_count: int, loop: str = LOOP_PING_PONG) -> int:
    """Template frame for output frame ``output_index`` of a ``frame_count``-frame template.

    `LOOP_PING_PONG` (the default) runs forward and back, 0, 1, ..., F-1, F-2, ..., 1, 0, 1, ...,
    so the loop turns without a cut; `LOOP_WRAP` restarts (Wav2Lip's `i % len(frames)`). A photo
    (one frame) is frame 0 either way.
    """
    if output_index < 0 or frame_count < 1:
        raise ValueError(f"output frame {output_index} of a {frame_count}-frame template")
    if loop == LOOP_WRAP or frame_count == 1:
        return output_index % frame_count
    if loop != LOOP_PING_PONG:
        raise ValueError(f"unknown loop mode {loop!r}; one of {', '.join(LOOP_MODES)}")
    period = 2 * (frame_count - 1)
    k = output_index % period
    return k if k < frame_count else period - k


def loop_mode(options: gateway_pb2.JobOptions) -> str:
    """The job's template loop, from its stored options: every segment maps frames alike."""
    return LOOP_WRAP if options.loop == gateway_pb2.JobOptions.WRAP else LOOP_PING_PONG
