"""The two stores every stateful part of lipline goes through (DESIGN.md sections 1 and 7).

- `jobs.JobStore`: the system of record for jobs, their tasks (segments and the join), leases and
  avatars' summaries. SQLite (embedded default) or PostgreSQL (a cluster); `open_job_store(url)`.
- `blobs.BlobStore`: uploads, avatars, segment files and outputs. A local folder (default; in
  Kubernetes a ReadWriteMany volume) or S3; `open_blob_store(url)`.
"""
