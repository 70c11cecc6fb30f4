"""Render speech onto a face with lipline: `python render.py ADDRESS AVATAR SPEECH OUT.mp4`.

What a backend does: register the avatar (a photo or a short video), submit the speech, follow the
job's progress and download the MP4. From a clone of the repository, with `python -m services.local
serve` running: `python clients/python/examples/render.py 127.0.0.1:50051 samples/avatar.jpg
samples/speech.wav out.mp4`. The API key (if the gateway checks them) comes from LIPLINE_API_KEY.
"""

from __future__ import annotations

import sys
from pathlib import Path

from lipline_client import LiplineClient
from lipline_client.v1 import gateway_pb2


def main(argv: list[str]) -> int:
    if len(argv) != 4:
        print(__doc__.splitlines()[0], file=sys.stderr)
        return 2
    address, avatar, speech, out = argv[0], Path(argv[1]), Path(argv[2]), Path(argv[3])
    with LiplineClient(address, timeout=600) as client:
        registered = client.create_avatar(avatar.read_bytes(), name=avatar.name)
        job = client.submit_job(registered.id, speech.read_bytes())
        print(f"job {job.id}: {job.audio_seconds:.2f} s of audio")
        job = client.wait(job.id, lambda j: print(f"  {gateway_pb2.JobState.Name(j.state)} {j.progress:.0%}"))
        if job.state != gateway_pb2.JOB_STATE_SUCCEEDED:
            print(f"job {job.id} ended {gateway_pb2.JobState.Name(job.state)}: {job.error}", file=sys.stderr)
            return 1
        size = client.download(job.id, out)
        print(f"wrote {out}: {size} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
