"""Local mode: the four services as separate processes on 127.0.0.1, with no Kubernetes (DESIGN.md section 7)."""
