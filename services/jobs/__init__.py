"""The job contract between the gateway and the render workers: the stores (`store`: jobs, tasks,
leases and avatars in SQLite or PostgreSQL; blobs in a folder or S3), the layout of a job's tasks
and blobs (`layout`, `segment_audio`), avatars as stored (`avatars`) and a worker's local I420 copy of
them (`avatar_cache`, for render and live workers), and when an output expires (`retention`, read
by the gateway and the render workers' janitor). No torch, no model code.

May import: the standard library, numpy, psycopg, obstore, `services.serving` and `services.media`.
Never torch or `services.inference` (tests/unit/test_walls.py).
"""
