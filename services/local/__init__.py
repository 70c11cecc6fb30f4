"""Local mode: every service as a separate process on 127.0.0.1, with no Kubernetes (docs/architecture.md section 7).

`cluster` and `process` start and stop the services (`affinity`: which GPU and cores each gets);
`prometheus` runs a real Prometheus over them with the chart's scrape labels (`metrics` reads one
process's /metrics directly, for tests and benches); `hpa`, `chart_scaling`
and `autoscaler` play the chart's HPAs on their replicas (bench/autoscale.py, docs/architecture.md section 5).
"""
