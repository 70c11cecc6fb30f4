"""Issue 22 on CPU: the chart's own render-worker HPA, run by bench/autoscale.py's controller on real
processes and a real Prometheus, scales the workers up under a burst of jobs and back down after it.

Time runs 20x faster (every window, policy period, sync period and the scrape interval divided by
20: the 300 s scale-down window is 15 s); maxReplicas is 4 so a 2-core machine is not swamped. The
run must lose and fail no job, the workers it removes must drain and exit 0, and the saved plot
must show the rise and the fall.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.autoscale import parse_args, plot, run
from services.local.prometheus import missing_reason
from tests.helpers.tools import helm_binary

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(bool(missing_reason()), reason=missing_reason() or "prometheus"),
]


def test_render_workers_scale_up_under_a_burst_and_back_down(tmp_path: Path) -> None:
    args = parse_args(
        [
            "--device=cpu",
            f"--helm={helm_binary()}",
            "--time-scale=20",
            "--scale=render",
            "--set=stages.render.autoscaling.maxReplicas=4",
            "--idle-s=3",
            "--burst-jobs=10",
            "--plateau-s=6",
            "--min-idle-s=2",
            "--max-idle-s=180",  # an upper bound only: the idle phase ends once back at minReplicas
            f"--out={tmp_path / 'autoscale.json'}",
        ]
    )
    result = run(args, tmp_path / "work")
    f = result["figures"]
    assert f["jobs_submitted"] >= 10
    assert f["jobs_failed"] == 0 and f["jobs_lost"] == 0, [j for j in result["jobs"] if j["state"] != "succeeded"]
    render = f["render"]
    assert render["peak_replicas"] > render["min"], f"no scale-up: {render}"
    assert render["back_at_min_s"] is not None, f"not back at minReplicas after the load: {render}"
    # No flapping: one decision up (maybe two while the policy limits it), one or two down.
    assert render["desired_changes"] <= 4, render
    # Scale-down sent SIGTERM: the workers drained and exited cleanly, no segment was lost with them.
    assert f["replica_exits"] and all(code == 0 for code in f["replica_exits"].values()), f["replica_exits"]
    desired = [h["stages"]["render"]["desired"] for h in result["history"]]
    top = desired.index(max(desired))
    assert max(desired) > desired[0] and desired[-1] < max(desired) and desired[-1] == render["min"]
    assert top < len(desired) - 1

    png = tmp_path / "autoscale.png"
    assert plot(result, png)
    import matplotlib.image

    image = matplotlib.image.imread(png)
    assert image.shape[0] > 200 and image.shape[1] > 400 and image.std() > 0.01  # a drawn figure, not a blank
