"""The discovery seam of stage clients (gateway, render workers): what each stage address setting becomes as a gRPC target."""

from __future__ import annotations

import pytest

from services.serving.channels import grpc_target


@pytest.mark.parametrize(
    ("setting", "target"),
    [
        ("127.0.0.1:50062", "127.0.0.1:50062"),  # one replica
        ("lipsync:50062", "lipsync:50062"),
        ("10.0.0.5:50062,10.0.0.6:50062", "ipv4:10.0.0.5:50062,10.0.0.6:50062"),  # static list
        (" 10.0.0.5:1 , 10.0.0.6:2 ", "ipv4:10.0.0.5:1,10.0.0.6:2"),
        ("[::1]:5,[::1]:6", "ipv6:[::1]:5,[::1]:6"),
        ("dns:///lipline-lipsync.ns.svc:50062", "dns:///lipline-lipsync.ns.svc:50062"),  # headless Service
        ("ipv4:10.0.0.5:1,10.0.0.6:2", "ipv4:10.0.0.5:1,10.0.0.6:2"),
    ],
)
def test_grpc_target(setting: str, target: str) -> None:
    assert grpc_target(setting) == target
