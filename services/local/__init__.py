"""Local mode: every service as a separate process on 127.0.0.1, with no Kubernetes (DESIGN.md section 7)."""
