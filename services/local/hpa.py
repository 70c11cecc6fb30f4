"""The Kubernetes HorizontalPodAutoscaler's algorithm (autoscaling/v2), reproduced outside a cluster.

bench/autoscale.py runs the chart's own HPA objects against the local services; this module is the
controller's arithmetic, as the Kubernetes documentation ("Horizontal Pod Autoscaling", "Algorithm
details", "Configurable scaling behavior") describes it and kube-controller-manager's
`replica_calculator.go` and `horizontal.go` implement it:

- per metric: desired = ceil(current x metric / target); no change while the ratio is within the
  tolerance (0.1) of 1;
- Pods and CPU metrics: pods being deleted (or failed) are ignored; pending pods are unready; a pod
  with no sample counts as using the target on a scale-down and nothing on a scale-up; unready pods
  count as using nothing on a scale-up; a change that these assumptions would reverse is not made;
  for CPU, a pod not ready, or ready for less than one metric window within its first 5 minutes, is
  unready too;
- External metrics: the series are summed; AverageValue divides by the replica count, Value
  multiplies the ratio by the ready pods;
- the largest proposal of all metrics wins; with a metric missing, no scale-down;
- `behavior`: the stabilization windows (scale up to the lowest, down to the highest recommendation
  within the window), then the rate policies (Pods, Percent, each over its period, counting the
  replicas changed in that period; selectPolicy Max, Min or Disabled), then min/max replicas.

Pure: time is a number the caller passes (seconds), so the rules are unit-tested against the
documented cases without waiting (tests/unit/local/test_hpa.py).
"""

from __future__ import annotations

import dataclasses
import enum
import math
from collections.abc import Mapping, Sequence
from typing import Any

TOLERANCE = 0.1
#: --horizontal-pod-autoscaler-cpu-initialization-period and -initial-readiness-delay defaults
CPU_INITIALIZATION_S = 300.0
INITIAL_READINESS_DELAY_S = 30.0
#: scale-down stabilization when `behavior.scaleDown` gives none (--horizontal-pod-autoscaler-downscale-stabilization)
DEFAULT_SCALE_DOWN_STABILIZATION_S = 300.0


class Phase(enum.Enum):
    """What the HPA sees of a pod: still starting, running (ready or not), or being deleted."""

    PENDING = "pending"
    RUNNING = "running"
    DELETING = "deleting"


@dataclasses.dataclass(frozen=True)
class Pod:
    """One replica as the HPA sees it.

    Attributes:
        name: its name (the key of the metric samples).
        phase: PENDING, RUNNING or DELETING.
        ready: its readiness (health SERVING); meaningful while RUNNING.
        started_s: when it started (the HPA's pod.status.startTime), caller's clock.
        ready_changed_s: when its readiness last changed (the Ready condition's lastTransitionTime).
    """

    name: str
    phase: Phase = Phase.RUNNING
    ready: bool = True
    started_s: float = 0.0
    ready_changed_s: float = 0.0


@dataclasses.dataclass(frozen=True)
class PodSample:
    """A per-pod metric value and the time it was taken, over `window_s` (CPU's readiness rule reads both)."""

    value: float
    timestamp_s: float = 0.0
    window_s: float = 0.0


def _group(
    pods: Sequence[Pod], samples: Mapping[str, PodSample], cpu: bool, now_s: float
) -> tuple[int, set[str], set[str]]:
    """(ready pods with samples, unready pods, pods missing a sample): replica_calculator.go's groupPods."""
    ready, unready, missing = 0, set(), set()
    for pod in pods:
        if pod.phase is Phase.DELETING:
            continue
        if pod.phase is Phase.PENDING:
            unready.add(pod.name)
            continue
        sample = samples.get(pod.name)
        if sample is None:
            missing.add(pod.name)
            continue
        if cpu:
            if now_s < pod.started_s + CPU_INITIALIZATION_S:
                # Within its start-up: not ready, or no full window of samples since it became ready.
                is_unready = not pod.ready or sample.timestamp_s < pod.ready_changed_s + sample.window_s
            else:
                # Later: only a pod that has never been ready (unready since it started).
                is_unready = not pod.ready and pod.ready_changed_s < pod.started_s + INITIAL_READINESS_DELAY_S
            if is_unready:
                unready.add(pod.name)
                continue
        ready += 1
    return ready, unready, missing


def milli(value: float) -> int:
    """A value in thousandths, as the HPA reads a metric (a Quantity's MilliValue): 0.2 / 0.1 is then exactly 2."""
    return round(value * 1000)


def _ratio(values: Mapping[str, int], target: int) -> float:
    return (sum(values.values()) / len(values)) / target


def pods_metric_replicas(
    current: int,
    pods: Sequence[Pod],
    samples: Mapping[str, PodSample],
    target: float,
    *,
    cpu: bool = False,
    now_s: float = 0.0,
    tolerance: float = TOLERANCE,
) -> int | None:
    """The replicas a Pods metric (AverageValue per pod) or CPU utilisation asks for; None with no sample.

    Args:
        current: the scale's replicas now (every pod not being deleted).
        pods: the target's pods.
        samples: per pod name, its value (CPU: utilisation in percent of its request).
        target: the target average per pod (CPU: averageUtilization, percent).
        cpu: apply the CPU readiness rules (start-up period, initial readiness delay).
    """
    ready, unready, missing = _group(pods, samples, cpu, now_s)
    live = {p.name for p in pods if p.phase is not Phase.DELETING}
    values = {name: milli(s.value) for name, s in samples.items() if name in live and name not in unready}
    if not values:
        return None
    target_m = milli(target)
    ratio = _ratio(values, target_m)
    scale_up_with_unready = bool(unready) and ratio > 1.0
    if not scale_up_with_unready and not missing:
        if abs(1.0 - ratio) <= tolerance:
            return current
        return math.ceil(ratio * ready)
    for name in missing:
        values[name] = target_m if ratio < 1.0 else 0
    if scale_up_with_unready:
        for name in unready:
            values[name] = 0
    new_ratio = _ratio(values, target_m)
    if abs(1.0 - new_ratio) <= tolerance or (ratio < 1.0 < new_ratio) or (ratio > 1.0 > new_ratio):
        return current  # too small a change, or the assumptions reverse its direction
    proposed = math.ceil(new_ratio * len(values))
    if (new_ratio < 1.0 and proposed > current) or (new_ratio > 1.0 and proposed < current):
        return current
    return proposed


def external_average_replicas(current: int, values: Sequence[float], target_per_pod: float) -> int | None:
    """An External metric with an AverageValue target: the series' sum over the replicas, against the target."""
    if not values:
        return None
    total, target_m = sum(milli(v) for v in values), milli(target_per_pod)
    if current == 0:
        return math.ceil(total / target_m)
    ratio = total / (target_m * current)
    return current if abs(1.0 - ratio) <= TOLERANCE else math.ceil(total / target_m)


def external_value_replicas(current: int, pods: Sequence[Pod], values: Sequence[float], target: float) -> int | None:
    """An External metric with a Value target: ratio = sum / target, times the ready pods (KEDA's `Value`)."""
    if not values:
        return None
    ratio = sum(milli(v) for v in values) / milli(target)
    if current == 0:
        return math.ceil(ratio)
    if abs(1.0 - ratio) <= TOLERANCE:
        return current
    ready = sum(1 for p in pods if p.phase is Phase.RUNNING and p.ready)
    return math.ceil(ratio * ready)


class Select(enum.Enum):
    MAX = "Max"
    MIN = "Min"
    DISABLED = "Disabled"


@dataclasses.dataclass(frozen=True)
class Policy:
    """`{type: Pods|Percent, value, periodSeconds}`."""

    type: str
    value: int
    period_s: float


@dataclasses.dataclass(frozen=True)
class Rules:
    """One direction of `behavior` (scaleUp or scaleDown), with Kubernetes' defaults filled in."""

    stabilization_s: float
    policies: tuple[Policy, ...]
    select: Select = Select.MAX

    @property
    def longest_period_s(self) -> float:
        return max((p.period_s for p in self.policies), default=0.0)

    @classmethod
    def from_spec(cls, spec: Mapping[str, Any] | None, up: bool) -> Rules:
        """The API server's defaults for what `spec` leaves out (autoscaling/v2 SetDefaults)."""
        spec = spec or {}
        default_policies: tuple[Policy, ...]
        if up:
            default_policies = (Policy("Percent", 100, 15), Policy("Pods", 4, 15))
            default_window = 0.0
        else:
            default_policies = (Policy("Percent", 100, 15),)
            default_window = DEFAULT_SCALE_DOWN_STABILIZATION_S
        policies = tuple(
            Policy(p["type"], int(p["value"]), float(p["periodSeconds"])) for p in spec.get("policies") or ()
        )
        window = spec.get("stabilizationWindowSeconds")
        return cls(
            stabilization_s=default_window if window is None else float(window),
            policies=policies or default_policies,
            select=Select(spec.get("selectPolicy", "Max")),
        )

    def scaled(self, factor: float) -> Rules:
        """Every window and period divided by `factor` (a time-compressed run keeps the rules' shape)."""
        return dataclasses.replace(
            self,
            stabilization_s=self.stabilization_s / factor,
            policies=tuple(dataclasses.replace(p, period_s=p.period_s / factor) for p in self.policies),
        )


@dataclasses.dataclass(frozen=True)
class Behavior:
    up: Rules
    down: Rules

    @classmethod
    def from_spec(cls, spec: Mapping[str, Any] | None) -> Behavior:
        spec = spec or {}
        return cls(Rules.from_spec(spec.get("scaleUp"), up=True), Rules.from_spec(spec.get("scaleDown"), up=False))

    def scaled(self, factor: float) -> Behavior:
        return Behavior(self.up.scaled(factor), self.down.scaled(factor))


@dataclasses.dataclass
class _Event:
    change: int
    at_s: float


@dataclasses.dataclass
class Controller:
    """One HPA's memory (its recommendations and scale events) and its decision each sync period.

    Attributes:
        min_replicas, max_replicas: spec.minReplicas, spec.maxReplicas.
        behavior: spec.behavior, defaults filled in.
    """

    min_replicas: int
    max_replicas: int
    behavior: Behavior
    _recommendations: list[tuple[float, int]] = dataclasses.field(default_factory=list)
    _up_events: list[_Event] = dataclasses.field(default_factory=list)
    _down_events: list[_Event] = dataclasses.field(default_factory=list)

    def decide(self, current: int, proposals: Sequence[int | None], now_s: float) -> int:
        """The replicas to scale to now, from each metric's proposal (None: that metric had no value).

        Records the recommendation and, when the count changes, the scale event, as the controller does.
        """
        if current == 0 and self.min_replicas != 0:
            return 0  # scaling is disabled for a target scaled to zero by hand
        if current > self.max_replicas:
            desired = self.max_replicas
        elif current < self.min_replicas:
            desired = self.min_replicas
        else:
            valid = [p for p in proposals if p is not None]
            if not valid:
                return current  # no metric: the HPA reports an error and leaves the scale alone
            raw = max(valid)
            if len(valid) < len(proposals) and raw < current:
                raw = current  # a metric is missing: never scale down on the others alone
            desired = self._limit_rate(current, self._stabilize(current, raw, now_s), now_s)
        if desired != current:
            events = self._up_events if desired > current else self._down_events
            rules = self.behavior.up if desired > current else self.behavior.down
            events[:] = [e for e in events if e.at_s > now_s - rules.longest_period_s]
            events.append(_Event(abs(desired - current), now_s))
        return desired

    def _stabilize(self, current: int, desired: int, now_s: float) -> int:
        """Up to the lowest recommendation of the scale-up window, down to the highest of the scale-down window."""
        up_cutoff = now_s - self.behavior.up.stabilization_s
        down_cutoff = now_s - self.behavior.down.stabilization_s
        up, down = desired, desired
        for at_s, rec in self._recommendations:
            if at_s > up_cutoff:
                up = min(up, rec)
            if at_s > down_cutoff:
                down = max(down, rec)
        keep_after = min(up_cutoff, down_cutoff)
        self._recommendations = [(t, r) for t, r in self._recommendations if t >= keep_after]
        self._recommendations.append((now_s, desired))
        return min(max(current, up), down)

    def _limit_rate(self, current: int, desired: int, now_s: float) -> int:
        if desired > current:
            limit = max(self._period_limit(current, self.behavior.up, now_s, up=True), current)
            return min(desired, min(self.max_replicas, limit))
        if desired < current:
            limit = min(self._period_limit(current, self.behavior.down, now_s, up=False), current)
            return max(desired, max(self.min_replicas, limit))
        return desired

    def _period_limit(self, current: int, rules: Rules, now_s: float, up: bool) -> int:
        """The furthest the policies let the scale move from where each policy's period started."""
        if rules.select is Select.DISABLED:
            return current
        proposals = []
        for policy in rules.policies:
            cutoff = now_s - policy.period_s
            added = sum(e.change for e in self._up_events if e.at_s > cutoff)
            removed = sum(e.change for e in self._down_events if e.at_s > cutoff)
            start = current - added + removed
            if policy.type == "Pods":
                proposals.append(start + policy.value if up else start - policy.value)
            elif up:
                proposals.append(math.ceil(start * (1 + policy.value / 100)))
            else:
                proposals.append(int(start * (1 - policy.value / 100)))
        # Max selects the biggest change: the highest limit up, the lowest limit down.
        biggest = max if up else min
        smallest = min if up else max
        return (biggest if rules.select is Select.MAX else smallest)(proposals)


__all__ = [
    "TOLERANCE",
    "Behavior",
    "Controller",
    "Phase",
    "Pod",
    "PodSample",
    "Policy",
    "Rules",
    "Select",
    "external_average_replicas",
    "external_value_replicas",
    "milli",
    "pods_metric_replicas",
]
