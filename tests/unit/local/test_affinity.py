"""services/local/affinity.py and where LocalCluster puts each process: one GPU-stage replica per listed
GPU (CUDA_VISIBLE_DEVICES), a later replica on the lowest free GPU slot, and pinned workers on disjoint
core sets that cover the cores given (the scale-out benches rely on all three)."""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Iterator
from itertools import combinations
from pathlib import Path

import pytest

from services.local.affinity import (
    compact,
    core_sets,
    gpu_of,
    lowest_free_slot,
    parse_cpu_list,
    parse_gpus,
    pin_plan,
    plan_from_args,
    replicas_for,
    topology_order,
    usable_cores,
    validate_placement_args,
)
from services.local.cluster import LocalCluster

GPUS = parse_gpus("0,1,2,3")


@pytest.mark.parametrize(
    ("replicas", "expected"),
    [(1, ["0"]), (2, ["0", "1"]), (4, ["0", "1", "2", "3"]), (6, ["0", "1", "2", "3", "0", "1"])],
)
def test_replica_i_sees_gpu_i_mod_n(replicas: int, expected: list[str]) -> None:
    assert GPUS == ["0", "1", "2", "3"]
    assert [gpu_of(GPUS, r) for r in range(replicas)] == expected
    assert gpu_of([], 3) is None  # no --gpus: CUDA_VISIBLE_DEVICES left alone
    assert replicas_for(0, GPUS) == 4 and replicas_for(2, GPUS) == 2 and replicas_for(0, []) == 1


@pytest.mark.parametrize("cores", [1, 2, 3, 16, 17])
def test_core_sets_are_disjoint_cover_the_cores_and_differ_by_at_most_one(cores: int) -> None:
    cpus = list(range(100, 100 + cores))
    for groups in range(1, cores + 1):
        sets = core_sets(cpus, groups)
        assert len(sets) == groups and all(sets)
        assert all(not set(a) & set(b) for a, b in combinations(sets, 2))
        assert sorted(c for s in sets for c in s) == cpus
        assert max(map(len, sets)) - min(map(len, sets)) <= 1


def test_more_processes_than_cores_share_single_cores_round_robin() -> None:
    assert core_sets([4, 5], 5) == [[4], [5], [4], [5], [4]]
    assert core_sets([4, 5], 0) == []
    with pytest.raises(ValueError, match="no cores"):
        core_sets([], 2)


def test_a_plan_gives_every_stage_its_own_cores() -> None:
    plan = pin_plan(list(range(10)), {"live": 3, "render": 2, "none": 0})
    assert set(plan) == {"live", "render"} and [len(plan["live"]), len(plan["render"])] == [3, 2]
    sets = plan["live"] + plan["render"]
    assert all(not set(a) & set(b) for a, b in combinations(sets, 2))
    assert sorted(c for s in sets for c in s) == list(range(10))


def test_topology_order_is_a_permutation_of_the_cores() -> None:
    cpus = usable_cores()
    assert sorted(topology_order(reversed(cpus))) == cpus


def test_core_lists_are_parsed_like_cpusets_and_checked_against_the_usable_cores() -> None:
    assert parse_cpu_list("0-3,8, 10", range(16)) == [0, 1, 2, 3, 8, 10]
    assert parse_cpu_list("all", [3, 1]) == [1, 3]
    assert compact([5, 0, 1, 2, 7, 8]) == "0-2,5,7-8"
    with pytest.raises(ValueError, match=r"cores \[16, 17\] are not usable here \(this process may use 0-15\)"):
        parse_cpu_list("14-17", range(16))
    with pytest.raises(ValueError, match="'a-3' is not a core number or range"):
        parse_cpu_list("a-3", range(16))
    with pytest.raises(ValueError, match="'5-2': a range goes from a low core"):
        parse_cpu_list("5-2", range(16))
    with pytest.raises(ValueError, match="empty"):
        parse_cpu_list(",", range(16))


def test_a_bad_core_list_is_a_usage_error_not_a_traceback(capsys: pytest.CaptureFixture[str]) -> None:
    p = argparse.ArgumentParser(prog="bench")
    p.add_argument("--pin-cores", default="")
    with pytest.raises(SystemExit) as exit_:
        validate_placement_args(p, p.parse_args(["--pin-cores", "9999"]))
    assert exit_.value.code == 2
    assert "--pin-cores: cores [9999] are not usable here" in capsys.readouterr().err
    assert validate_placement_args(p, p.parse_args([])) == []


@pytest.fixture
def own_affinity() -> Iterator[set[int]]:
    """This process's cores, put back afterwards (plan_from_args pins the process that calls it)."""
    before = os.sched_getaffinity(0)
    try:
        yield before
    finally:
        os.sched_setaffinity(0, before)


def test_pinning_moves_the_bench_to_the_cores_left_over(own_affinity: set[int]) -> None:
    cpus = sorted(own_affinity)
    if len(cpus) < 2:
        pytest.skip("needs two usable cores")
    gpus, plan = plan_from_args("0,1", compact(cpus[1:]), {"render": len(cpus) - 1})
    assert gpus == ["0", "1"]
    assert sorted(c for s in plan["render"] for c in s) == cpus[1:]
    assert os.sched_getaffinity(0) == {cpus[0]}  # what the unpinned processes it starts inherit
    assert plan_from_args("", "", {"render": 2}) == ([], {})


# ---- what LocalCluster gives each process it starts (read back from the running processes) ------


def _environ(pid: int) -> dict[str, str]:
    """The environment a started process runs with. Popen returns once exec has begun (its close-on-exec
    pipe closed), a moment before the kernel sets up the new program's arguments and environment."""
    deadline = time.monotonic() + 30
    while not Path(f"/proc/{pid}/cmdline").read_bytes() and time.monotonic() < deadline:
        time.sleep(0.01)
    raw = Path(f"/proc/{pid}/environ").read_bytes()
    return dict(item.split("=", 1) for item in raw.decode(errors="replace").split("\0") if "=" in item)


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[LocalCluster]:
    """A cluster whose processes are started one by one and killed at once (never waited for)."""
    cores = pin_plan(usable_cores(), {"render": 2})
    c = LocalCluster(tmp_path, job_store="sqlite:///j.db", gpus=GPUS, cores=cores, replicas={"lipsync": 6})
    try:
        yield c
    finally:
        for proc in c.processes.values():
            proc.kill()


def test_each_gpu_replica_gets_its_gpu_and_each_render_worker_its_cores(cluster: LocalCluster) -> None:
    for name in [*cluster.replica_names("lipsync"), "superres", "superres-1", "render", "render-1"]:
        cluster.start_service(name)
    seen = {name: _environ(p.process.pid).get("CUDA_VISIBLE_DEVICES") for name, p in cluster.processes.items()}
    assert [seen[n] for n in cluster.replica_names("lipsync")] == ["0", "1", "2", "3", "0", "1"]
    assert [seen["superres"], seen["superres-1"]] == ["0", "1"]  # per stage: superres i beside lipsync i
    assert seen["render"] == seen["render-1"] == os.environ.get("CUDA_VISIBLE_DEVICES")  # CPU stages: untouched
    render_sets = [os.sched_getaffinity(cluster.processes[n].process.pid) for n in ("render", "render-1")]
    assert render_sets == [set(s) for s in cluster.cores["render"]]
    assert os.sched_getaffinity(cluster.processes["lipsync"].process.pid) == os.sched_getaffinity(0)  # not pinned


def test_a_replica_started_later_takes_the_gpu_a_stopped_one_left(cluster: LocalCluster) -> None:
    for name in cluster.replica_names("lipsync")[:4]:
        cluster.start_service(name)
    cluster.kill("lipsync-2")  # the autoscaler's scale-down (or a crash): GPU 2 is free
    cluster.start_service("lipsync-4")  # the autoscaler names replicas by a counter
    assert _environ(cluster.processes["lipsync-4"].process.pid)["CUDA_VISIBLE_DEVICES"] == "2"
    cluster.start_service("lipsync-5")  # every GPU holds one: the next slot wraps to GPU 0
    assert _environ(cluster.processes["lipsync-5"].process.pid)["CUDA_VISIBLE_DEVICES"] == "0"
    assert cluster.slot_of("lipsync-2") == 5  # its old slot is taken: a restart would get a free one
    assert lowest_free_slot([0, 1, 3]) == 2 and lowest_free_slot([]) == 0
