"""The generated protobuf and gRPC modules of the public API (scripts/gen_protos.py; do not edit)."""
