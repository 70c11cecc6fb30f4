"""The serving shell every lipline process runs in: no torch, no model code, no job store.

Server bootstrap and graceful shutdown (`server`), settings from flags and `LIPLINE_*` variables
(`settings`), authentication and tenants (`auth`, `tenants`), the one error funnel and per-client
caps (`interceptor`, `errors`), Prometheus metrics (`metrics`), tracing (`tracing`), logs, channels
to other services and how their replicas are found (`channels`, `discovery`), bounded streams
(`streams`), native thread pools (`native_threads`) and the registry of deployables (`stages`).

May import: the standard library, grpc, protobuf stubs, prometheus_client, opentelemetry, the
kubernetes client (discovery). Never torch, numpy-heavy media code, or `services.jobs` /
`services.inference` (docs/architecture.md section 8; tests/unit/test_walls.py checks it).
"""
