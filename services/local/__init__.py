"""Local mode: every service as a separate process on 127.0.0.1, with no Kubernetes (docs/architecture.md section 7)."""
