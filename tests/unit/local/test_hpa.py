"""The HPA algorithm (services/local/hpa.py) against the rules the Kubernetes documentation states.

Each test names the rule of "Horizontal Pod Autoscaling" (Algorithm details, Configurable scaling
behavior) it checks, with the documentation's own numbers where it gives them.
"""

from __future__ import annotations

from services.local.hpa import (
    Behavior,
    Controller,
    Phase,
    Pod,
    PodSample,
    Policy,
    Rules,
    Select,
    external_average_replicas,
    external_value_replicas,
    pods_metric_replicas,
)


def _pods(n: int, **kwargs: object) -> list[Pod]:
    return [Pod(f"p{i}", **kwargs) for i in range(n)]  # type: ignore[arg-type]


def _samples(*values: float) -> dict[str, PodSample]:
    return {f"p{i}": PodSample(v) for i, v in enumerate(values)}


def test_desired_is_ceil_of_current_times_metric_over_target() -> None:
    # "if the current metric value is 200m, and the desired value is 100m, the number of replicas will be doubled"
    assert pods_metric_replicas(3, _pods(3), _samples(0.2, 0.2, 0.2), 0.1) == 6
    # "If the current value is instead 50m, you'll halve the number of replicas"
    assert pods_metric_replicas(4, _pods(4), _samples(0.05, 0.05, 0.05, 0.05), 0.1) == 2
    # ceil: 3 pods at 1.5x the target want 4.5 -> 5
    assert pods_metric_replicas(3, _pods(3), _samples(1.5, 1.5, 1.5), 1.0) == 5


def test_no_change_within_the_tolerance() -> None:
    # "The control plane skips any scaling action if the ratio is sufficiently close to 1.0 (0.1 by default)"
    assert pods_metric_replicas(10, _pods(10), _samples(*[1.09] * 10), 1.0) == 10
    assert pods_metric_replicas(10, _pods(10), _samples(*[0.91] * 10), 1.0) == 10
    assert pods_metric_replicas(10, _pods(10), _samples(*[1.11] * 10), 1.0) == 12


def test_pods_being_deleted_are_ignored() -> None:
    pods = [*_pods(2), Pod("gone", phase=Phase.DELETING)]
    samples = {**_samples(2.0, 2.0), "gone": PodSample(100.0)}
    assert pods_metric_replicas(2, pods, samples, 1.0) == 4


def test_missing_metrics_count_as_the_target_on_a_scale_down_and_zero_on_a_scale_up() -> None:
    # "if any pod is missing metrics ... in the case of a scale down we assume the pod was consuming 100% of the
    # desired value, and in the case of a scale up we assume the pod was consuming 0%"
    pods = _pods(3)
    # scale-up: 2 pods at 3x, one missing (0): (3+3+0)/3 = 2x -> 6
    assert pods_metric_replicas(3, pods, _samples(3.0, 3.0), 1.0) == 6
    # scale-down: 2 pods at 0.1, one missing (1.0): 1.2/3 = 0.4 -> ceil(1.2) = 2
    assert pods_metric_replicas(3, pods, _samples(0.1, 0.1), 1.0) == 2


def test_unready_pods_count_as_zero_on_a_scale_up() -> None:
    # "if any pods are not yet ready ... we conservatively assume that the not-yet-ready pods are consuming 0%"
    pods = [*_pods(2), Pod("new", phase=Phase.PENDING)]
    # ready pods at 2x: with the new pod at 0, (2+2+0)/3 -> 4 replicas (not ceil(2 x 2) + 1)
    assert pods_metric_replicas(3, pods, _samples(2.0, 2.0), 1.0) == 4
    # the assumptions may dampen a scale-up, never turn it around: 2 ready at 1.2x, 3 pending -> no change
    pods = [*_pods(2), *(Pod(f"n{i}", phase=Phase.PENDING) for i in range(3))]
    assert pods_metric_replicas(5, pods, _samples(1.2, 1.2), 1.0) == 5


def test_a_scale_down_ignores_unready_pods() -> None:
    pods = [*_pods(2), Pod("new", phase=Phase.PENDING)]
    assert pods_metric_replicas(3, pods, _samples(0.2, 0.2), 1.0) == 1


def test_cpu_of_a_pod_in_its_start_up_counts_only_after_a_full_window_of_readiness() -> None:
    # "the pod is considered not yet ready ... if it became ready but the metric window has not passed since"
    young = Pod("p1", ready=True, started_s=100, ready_changed_s=110)
    old = Pod("p0", ready=True, started_s=0, ready_changed_s=5)
    samples = {"p0": PodSample(160, timestamp_s=120, window_s=30), "p1": PodSample(0, timestamp_s=120, window_s=30)}
    # p1's sample covers time before it was ready: unready, counts 0 on a scale-up: (160+0)/2 = 1.6x of 50
    assert pods_metric_replicas(2, [old, young], samples, 100, cpu=True, now_s=120) == 2
    # once its window has passed, its 0 % counts as measured
    later = {k: PodSample(v.value, timestamp_s=200, window_s=30) for k, v in samples.items()}
    assert pods_metric_replicas(2, [old, young], later, 100, cpu=True, now_s=200) == 2
    # 160 and 100 -> 130 % of 100: 1.3 x 2 -> 3
    later["p1"] = PodSample(100, timestamp_s=200, window_s=30)
    assert pods_metric_replicas(2, [old, young], later, 100, cpu=True, now_s=200) == 3


def test_external_average_value_divides_the_sum_by_the_target() -> None:
    # AverageValue: desired = ceil(sum / target per pod), the tolerance on sum / (target x current)
    assert external_average_replicas(2, [13.0], 2.0) == 7
    assert external_average_replicas(5, [10.5], 2.0) == 5  # 10.5 / 10 is within the tolerance
    assert external_average_replicas(5, [0.0], 2.0) == 0
    assert external_average_replicas(5, [], 2.0) is None


def test_external_value_scales_the_ready_pods() -> None:
    pods = [*_pods(2), Pod("new", phase=Phase.PENDING)]
    assert external_value_replicas(3, pods, [3.0], 1.0) == 6  # ready pods (2) x 3
    assert external_value_replicas(3, pods, [1.05], 1.0) == 3


DEFAULTS = Behavior.from_spec(None)


def test_default_behavior_is_the_documented_one() -> None:
    # scaleUp: no window, max(100 % , 4 pods) per 15 s; scaleDown: 300 s window, 100 % per 15 s
    assert DEFAULTS.up == Rules(0, (Policy("Percent", 100, 15), Policy("Pods", 4, 15)), Select.MAX)
    assert DEFAULTS.down == Rules(300, (Policy("Percent", 100, 15),), Select.MAX)
    partial = Behavior.from_spec({"scaleDown": {"policies": [{"type": "Pods", "value": 1, "periodSeconds": 60}]}})
    assert partial.down.stabilization_s == 300 and partial.up == DEFAULTS.up


def test_scale_up_rate_is_the_largest_of_the_policies() -> None:
    # Default scale-up from 1 replica: max(+100 % = 2, +4 pods = 5) -> 5 in the first period
    c = Controller(1, 100, DEFAULTS)
    assert c.decide(1, [50], now_s=0) == 5
    # within the same 15 s period the start of the period counts (1): still at most 5
    assert c.decide(5, [50], now_s=10) == 5
    # a new period: from 5, max(10, 9) -> 10
    assert c.decide(5, [50], now_s=16) == 10


def test_scale_down_policies_documented_example() -> None:
    # "Pods 4 per 60 s, Percent 10 per 60 s": with 80 replicas the first step removes 8 (10 %), then 72 -> 64 (8 rounded)
    behavior = Behavior(DEFAULTS.up, Rules(0, (Policy("Pods", 4, 60), Policy("Percent", 10, 60)), Select.MAX))
    c = Controller(1, 100, behavior)
    assert c.decide(80, [10], now_s=0) == 72
    assert c.decide(72, [10], now_s=30) == 72  # the same period: no further change
    assert c.decide(72, [10], now_s=61) == 64
    # below 40 replicas the Pods policy removes more: 30 -> 26
    c = Controller(1, 100, behavior)
    assert c.decide(30, [10], now_s=0) == 26
    # selectPolicy Min: the smaller change (3 of 30 at 10 %)
    c = Controller(1, 100, Behavior(DEFAULTS.up, Rules(0, behavior.down.policies, Select.MIN)))
    assert c.decide(30, [10], now_s=0) == 27


def test_disabled_select_policy_never_scales_that_way() -> None:
    c = Controller(1, 10, Behavior(DEFAULTS.up, Rules(0, (Policy("Pods", 1, 60),), Select.DISABLED)))
    assert c.decide(5, [1], now_s=0) == 5
    assert c.decide(5, [8], now_s=1) == 8


def test_scale_down_stabilization_takes_the_highest_recommendation_of_the_window() -> None:
    # "the highest recommendation within the window is used": flapping metrics do not flap replicas
    c = Controller(1, 10, Behavior(DEFAULTS.up, Rules(300, (Policy("Percent", 100, 15),), Select.MAX)))
    assert c.decide(4, [4], now_s=0) == 4
    assert c.decide(4, [1], now_s=60) == 4
    assert c.decide(4, [2], now_s=200) == 4
    assert c.decide(4, [1], now_s=301) == 2  # the 4 at t=0 left the window; 2 (t=200) is the highest left
    assert c.decide(2, [1], now_s=501) == 1


def test_scale_up_stabilization_takes_the_lowest_recommendation_of_the_window() -> None:
    c = Controller(1, 10, Behavior(Rules(60, DEFAULTS.up.policies), DEFAULTS.down))
    assert c.decide(2, [2], now_s=0) == 2
    assert c.decide(2, [6], now_s=30) == 2  # the 2 of t=0 is still in the window
    assert c.decide(2, [6], now_s=61) == 6


def test_min_and_max_bound_the_result() -> None:
    c = Controller(2, 6, DEFAULTS)
    assert c.decide(4, [40], now_s=0) == 6
    assert c.decide(1, [1], now_s=1) == 2  # below min: to min, whatever the metrics
    assert c.decide(9, [9], now_s=2) == 6  # above max: to max
    assert c.decide(0, [5], now_s=3) == 0  # scaled to zero by hand: the HPA leaves it


def test_the_largest_proposal_wins_and_a_missing_metric_blocks_scale_down() -> None:
    c = Controller(1, 10, Behavior(DEFAULTS.up, Rules(0, DEFAULTS.down.policies)))
    assert c.decide(4, [2, 6], now_s=0) == 6
    assert c.decide(6, [2, None], now_s=100) == 6
    assert c.decide(6, [8, None], now_s=200) == 8
    assert c.decide(8, [None, None], now_s=300) == 8


def test_scaled_behavior_keeps_its_shape() -> None:
    b = Behavior.from_spec(None).scaled(10)
    assert b.down.stabilization_s == 30 and b.up.policies[0].period_s == 1.5
