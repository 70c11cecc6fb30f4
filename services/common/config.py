"""Service configuration: one typed dataclass per service, filled from flags and environment variables.

Every field `foo_bar` can be set as `--foo-bar` or `LIPLINE_FOO_BAR` (the flag wins), with the same
names in all four services, so one Helm values block and one runbook cover them all. Settings are
parsed once at start-up, checked, and passed into constructors: no module-level globals.
"""

from __future__ import annotations

import argparse
import dataclasses
import enum
import os
import types
import typing
from collections.abc import Mapping, Sequence
from typing import Any, TypeVar

ENV_PREFIX = "LIPLINE_"


class Device(str, enum.Enum):
    AUTO = "auto"
    CPU = "cpu"
    CUDA = "cuda"


class LogFormat(str, enum.Enum):
    JSON = "json"
    TEXT = "text"


def _field(default: Any, help: str, **kwargs: Any) -> Any:  # noqa: A002 - mirrors argparse
    return dataclasses.field(default=default, metadata={"help": help, **kwargs})


@dataclasses.dataclass(frozen=True)
class ServiceSettings:
    """Settings every lipline service has."""

    host: str = _field("0.0.0.0", "address the gRPC server binds")
    port: int = _field(50051, "gRPC port (0 picks a free port, written to the log and --port-file)")
    port_file: str = _field("", "if set, write the bound gRPC port here once SERVING (for tests)")
    metrics_port: int = _field(9090, "Prometheus /metrics HTTP port (0 picks a free one, -1 disables)")
    max_message_bytes: int = _field(64 * 1024 * 1024, "max gRPC message size, both directions")
    max_connection_age_s: float = _field(300.0, "close client connections after this long so they rebalance")
    grace_s: float = _field(20.0, "on SIGTERM, seconds to let in-flight streams finish")
    max_concurrent_streams: int = _field(256, "max concurrent RPCs; more are rejected RESOURCE_EXHAUSTED")
    log_level: str = _field("INFO", "DEBUG, INFO, WARNING or ERROR")
    log_format: LogFormat = _field(LogFormat.JSON, "json (one object per line) or text")
    device: Device = _field(Device.AUTO, "auto (cuda if available), cpu or cuda")
    require_cudnn: bool = _field(True, "on a GPU, refuse to start when the cuDNN self-check fails")

    def validate(self) -> None:
        """Raise ValueError with one message per bad value."""
        problems = []
        if not 0 <= self.port <= 65535:
            problems.append(f"port {self.port} is not in 0..65535")
        if self.max_message_bytes < 1024 * 1024:
            problems.append("max_message_bytes must be at least 1 MiB")
        if self.grace_s < 0:
            problems.append("grace_s must be >= 0")
        if self.log_level.upper() not in {"DEBUG", "INFO", "WARNING", "ERROR"}:
            problems.append(f"log_level {self.log_level!r} is not DEBUG, INFO, WARNING or ERROR")
        if problems:
            raise ValueError("; ".join(problems))


SettingsT = TypeVar("SettingsT", bound=ServiceSettings)


def _base_type(tp: Any) -> Any:
    """`int | None` -> int; `str` -> str."""
    if isinstance(tp, types.UnionType) or typing.get_origin(tp) is typing.Union:
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return args[0]
    return tp


def _convert(tp: Any, raw: str) -> Any:
    tp = _base_type(tp)
    if tp is bool:
        if raw.lower() in {"1", "true", "yes", "on"}:
            return True
        if raw.lower() in {"0", "false", "no", "off", ""}:
            return False
        raise ValueError(f"{raw!r} is not a boolean (true/false)")
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        try:
            return tp(raw.lower())
        except ValueError:
            raise ValueError(f"{raw!r} is not one of {[m.value for m in tp]}") from None
    if typing.get_origin(tp) is tuple:
        inner = typing.get_args(tp)[0]
        return tuple(_convert(inner, part.strip()) for part in raw.split(",") if part.strip())
    return tp(raw)


def parse_settings(
    cls: type[SettingsT], argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None
) -> SettingsT:
    """Build `cls` from defaults, then `LIPLINE_*` variables, then flags; then validate.

    Raises:
        SystemExit: on a bad flag or value (argparse prints the message), like any CLI.
    """
    environ = os.environ if environ is None else environ
    hints = typing.get_type_hints(cls)
    parser = argparse.ArgumentParser(prog=f"python -m {cls.__module__.rsplit('.', 1)[0]}", description=cls.__doc__)
    values: dict[str, Any] = {}
    for field in dataclasses.fields(cls):
        env_name = ENV_PREFIX + field.name.upper()
        parser.add_argument(
            "--" + field.name.replace("_", "-"),
            dest=field.name,
            default=None,
            help=f"{field.metadata.get('help', '')} [env {env_name}; default {_show(field.default)}]",
        )
        if env_name in environ:
            try:
                values[field.name] = _convert(hints[field.name], environ[env_name])
            except ValueError as exc:
                parser.error(f"{env_name}: {exc}")
    args = parser.parse_args(argv)
    for field in dataclasses.fields(cls):
        raw = getattr(args, field.name)
        if raw is not None:
            try:
                values[field.name] = _convert(hints[field.name], raw)
            except ValueError as exc:
                parser.error(f"--{field.name.replace('_', '-')}: {exc}")
    settings = cls(**values)
    try:
        settings.validate()
    except ValueError as exc:
        parser.error(str(exc))
    return settings


def _show(value: Any) -> str:
    if isinstance(value, enum.Enum):
        return str(value.value)
    if isinstance(value, tuple):
        return ",".join(map(str, value))
    return repr(value)
