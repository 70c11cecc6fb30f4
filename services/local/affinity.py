"""Where a local process runs: which GPU it sees (CUDA_VISIBLE_DEVICES) and which cores it may use.

On a Kubernetes GPU node every model-stage pod gets one GPU of its own (the device plugin) and, on
a node with the kubelet's static CPU manager, a Guaranteed pod with whole CPUs gets cores of its own
while everything else shares the rest. Local mode and the benchmarks play both on one host:

- GPUs: a stage's replicas take *slots* 0, 1, 2, ...; slot i runs on `gpus[i % len(gpus)]`, so
  replicas started in order land one per listed GPU (a GPU listed twice takes two). A replica that
  comes later (the local autoscaler's) takes the lowest slot no running replica of its stage holds,
  as the device plugin hands out a free GPU, instead of doubling up on GPU 0.
- Cores (`--pin-cores`, off by default): the listed cores are cut into disjoint sets, one per
  replica of the pinned stages (render and live workers), set with `sched_setaffinity` right after
  the process starts; the bench pins itself to the usable cores outside the list, so every other
  process it starts (gateways, stages, its client processes) inherits that shared rest.
  docs/decisions.md says why pinning is off unless asked for.

The sets are cut in topology order (socket, physical core, hyperthread), so a set of two holds the
two hyperthreads of one core and never spans sockets unless it must, as the static CPU manager picks.
"""

from __future__ import annotations

import argparse
import logging
import os
from collections.abc import Collection, Iterable, Mapping, Sequence
from pathlib import Path

__all__ = [
    "add_placement_args",
    "compact",
    "core_sets",
    "gpu_of",
    "lowest_free_slot",
    "parse_cpu_list",
    "parse_gpus",
    "pin_plan",
    "plan_from_args",
    "pin_process",
    "replicas_for",
    "topology_order",
    "usable_cores",
    "validate_placement_args",
]

_CPU_SYSFS = Path("/sys/devices/system/cpu")
_LOGGER = logging.getLogger(__name__)


def parse_gpus(text: str) -> list[str]:
    """`"0,1,2,3"` -> `["0", "1", "2", "3"]` (empty: no GPU placement; the process sees what the host has)."""
    return [g.strip() for g in text.split(",") if g.strip()]


def replicas_for(replicas: int, gpus: Sequence[str]) -> int:
    """A GPU stage's replica count: the one asked for, else one per listed GPU, else one."""
    return replicas or len(gpus) or 1


def gpu_of(gpus: Sequence[str], slot: int) -> str | None:
    """The CUDA_VISIBLE_DEVICES of the replica in `slot` (None: no GPUs listed, leave it unset)."""
    return gpus[slot % len(gpus)] if gpus else None


def lowest_free_slot(taken: Iterable[int]) -> int:
    """The lowest slot no running replica holds: 0, 1, 2, ... for replicas started in order; a gap
    left by one that stopped is filled first (its GPU and cores are free again)."""
    held = set(taken)
    return next(i for i in range(len(held) + 1) if i not in held)


def usable_cores() -> list[int]:
    """The cores this process may run on (its affinity mask: a container's cpuset narrows it)."""
    return sorted(os.sched_getaffinity(0))


def parse_cpu_list(text: str, usable: Collection[int]) -> list[int]:
    """A cpuset-style list (`"0-11,16"`, or `"all"` for every usable core) -> sorted core numbers.

    Raises ValueError, naming the problem, for a malformed list or a core this process may not use.
    """
    if text.strip() == "all":
        return sorted(usable)
    cpus: set[int] = set()
    for part in (p.strip() for p in text.split(",") if p.strip()):
        first, _, last = part.partition("-")
        try:
            lo, hi = int(first), int(last or first)
        except ValueError:
            raise ValueError(f"{part!r} is not a core number or range (e.g. 0-11,16)") from None
        if lo > hi or lo < 0:
            raise ValueError(f"{part!r}: a range goes from a low core to a higher one")
        cpus.update(range(lo, hi + 1))
    outside = sorted(cpus - set(usable))
    if outside:
        raise ValueError(f"cores {outside} are not usable here (this process may use {compact(usable)})")
    if not cpus:
        raise ValueError("the core list is empty")
    return sorted(cpus)


def compact(cpus: Iterable[int]) -> str:
    """Sorted core numbers as a cpuset-style list: [0, 1, 2, 5] -> "0-2,5"."""
    runs: list[list[int]] = []
    for c in sorted(set(cpus)):
        if runs and c == runs[-1][1] + 1:
            runs[-1][1] = c
        else:
            runs.append([c, c])
    return ",".join(f"{a}-{b}" if a != b else f"{a}" for a, b in runs)


def topology_order(cpus: Iterable[int]) -> list[int]:
    """`cpus` ordered by (socket, physical core, core number): hyperthread siblings next to each other,
    sockets one after the other. Numeric order where sysfs does not say (not Linux, a sandbox)."""

    def key(cpu: int) -> tuple[int, int, int]:
        topology = _CPU_SYSFS / f"cpu{cpu}" / "topology"
        try:
            package = int((topology / "physical_package_id").read_text())
            core = int((topology / "core_id").read_text())
        except (OSError, ValueError):
            return (0, cpu, cpu)
        return (package, core, cpu)

    return sorted(set(cpus), key=key)


def core_sets(cpus: Sequence[int], groups: int) -> list[list[int]]:
    """Cut `cpus` (in the order given) into `groups` disjoint runs covering them all, sizes differing
    by at most one (the larger first). More groups than cores cannot be disjoint: then each group gets
    one core, round-robin, and cores are shared (a warning the caller prints, not an error)."""
    if groups < 1:
        return []
    if not cpus:
        raise ValueError("no cores to spread the processes over")
    if groups > len(cpus):
        return [[cpus[i % len(cpus)]] for i in range(groups)]
    size, extra = divmod(len(cpus), groups)
    sets, start = [], 0
    for i in range(groups):
        end = start + size + (1 if i < extra else 0)
        sets.append(list(cpus[start:end]))
        start = end
    return sets


def pin_plan(cpus: Sequence[int], counts: Mapping[str, int]) -> dict[str, list[list[int]]]:
    """Per stage, the core set of each replica slot: `cpus` (topology-ordered) cut into one set per
    replica of every stage in `counts` together, handed out stage by stage in the order given."""
    sets = core_sets(topology_order(cpus), sum(counts.values()))
    plan, start = {}, 0
    for stage, count in counts.items():
        plan[stage] = sets[start : start + count]
        start += count
    return {stage: s for stage, s in plan.items() if s}


def pin_process(pid: int, cpus: Collection[int]) -> None:
    """Set the affinity of every thread of `pid` (threads it starts later inherit it, as do its children).

    Called right after the process is started: a Python service has no thread of its own before its
    imports run, and every task listed in /proc is set, so none keeps the old mask."""
    for tid in [pid, *(int(t.name) for t in Path(f"/proc/{pid}/task").glob("[0-9]*"))]:
        try:
            os.sched_setaffinity(tid, cpus)
        except ProcessLookupError:  # it ended meanwhile (a process that dies at start-up says why in its log)
            continue


def add_placement_args(p: argparse.ArgumentParser, pinned: str) -> None:
    """--gpus and --pin-cores, for a bench that starts a LocalCluster; `pinned` names what --pin-cores spreads."""
    p.add_argument(
        "--gpus",
        default="",
        help="e.g. 0,1,2,3: one replica of each GPU stage per listed GPU (replica i: CUDA_VISIBLE_DEVICES=gpus[i %% n])",
    )
    p.add_argument(
        "--pin-cores",
        default="",
        help=f"cores (e.g. 0-11, or all) to spread the {pinned} over, disjoint sets one per process; every other "
        "process runs on the usable cores outside the list, or anywhere with all (default: nothing pinned)",
    )


def validate_placement_args(p: argparse.ArgumentParser, args: argparse.Namespace) -> list[int]:
    """A usage error (p.error) for a --pin-cores list that cannot be used; the listed cores ([] when off)."""
    if not args.pin_cores:
        return []
    try:
        return parse_cpu_list(args.pin_cores, usable_cores())
    except ValueError as exc:
        p.error(f"--pin-cores: {exc}")


def plan_from_args(
    gpus_text: str, pin_text: str, counts: Mapping[str, int]
) -> tuple[list[str], dict[str, list[list[int]]]]:
    """The benches' --gpus and --pin-cores: (gpus, per-stage core sets for LocalCluster(cores=...)).

    With --pin-cores, this process is pinned to the usable cores outside the list (when there are any),
    so that the processes it starts next inherit them; the pinned stages' replicas get their own sets.
    Raises ValueError for a core list that cannot be used.
    """
    gpus = parse_gpus(gpus_text)
    if not pin_text:
        return gpus, {}
    usable = usable_cores()
    cpus = parse_cpu_list(pin_text, usable)
    rest = sorted(set(usable) - set(cpus))
    if rest:
        os.sched_setaffinity(0, rest)
    if sum(counts.values()) > len(cpus):
        _LOGGER.warning(
            "%d pinned processes on %d cores: one core each, shared round-robin", sum(counts.values()), len(cpus)
        )
    return gpus, pin_plan(cpus, counts)
