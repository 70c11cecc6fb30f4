"""Service configuration: one typed dataclass per service, filled from flags and environment variables.

Every field `foo_bar` can be set as `--foo-bar` or `LIPLINE_FOO_BAR` (the flag wins), with the same
names in every service, so one Helm values block and one runbook cover them all. Settings are
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

from services.serving.stages import STAGES

ENV_PREFIX = "LIPLINE_"


class Device(str, enum.Enum):
    AUTO = "auto"
    CPU = "cpu"
    CUDA = "cuda"


class LogFormat(str, enum.Enum):
    JSON = "json"
    TEXT = "text"


def setting(default: Any, help: str, **kwargs: Any) -> Any:
    """One settings field: its default and the help text that `--help`, the chart's values schema and
    docs/configuration.md show (extra metadata, e.g. `choices`, goes along). Every service's settings
    class declares its fields with this, so none is undocumented."""
    return dataclasses.field(default=default, metadata={"help": help, **kwargs})


ADDRESS_FORMS = (
    "host:port, a list, dns:///name:port, k8s:///service.namespace:port (watches its EndpointSlices) or "
    "file:///path (one address per line, re-read when it changes)"
)


def address_field(default: str, stage: str) -> Any:
    """A stage address setting of a caller (gateway, render worker): every form services.serving.discovery reads."""
    return setting(default, f"{stage} stage: {ADDRESS_FORMS}")


OUTPUT_TTL_S = 7 * 86400.0  # a week: outputs are kept this long after their job succeeds, by default


def output_ttl_field() -> Any:
    """The outputs' retention, read alike by the gateway (what it answers) and the render workers (the
    expiry their joins stamp, and their janitor); the chart sets both from one value."""
    return setting(
        OUTPUT_TTL_S,
        "how long a job's output is kept after the job succeeds (seconds; 0 = forever): after it, DownloadOutput and "
        "GetOutputUrl answer FAILED_PRECONDITION and the render workers' janitor deletes it",
    )


@dataclasses.dataclass(frozen=True)
class ServiceSettings:
    """Settings every lipline service has."""

    host: str = setting("0.0.0.0", "address the gRPC server binds")
    port: int = setting(50051, "gRPC port (0 picks a free port, written to the log and --port-file)")
    port_file: str = setting("", "if set, write the bound gRPC port here once SERVING (for tests)")
    metrics_port: int = setting(9090, "Prometheus /metrics HTTP port (0 picks a free one, -1 disables)")
    max_message_bytes: int = setting(64 * 1024 * 1024, "max gRPC message size, both directions")
    max_connection_age_s: float = setting(300.0, "close client connections after this long so they rebalance")
    max_connection_age_grace_s: float = setting(
        0.0,
        "after max_connection_age_s, how long the calls still open on that connection may go on before they "
        "are cut UNAVAILABLE (new calls go to a new connection at once); 0 = grace_s (at least 1 s). "
        "Separate from grace_s, the drain on SIGTERM",
    )
    grace_s: float = setting(20.0, "on SIGTERM, seconds to let in-flight streams finish")
    max_concurrent_streams: int = setting(
        256,
        "max concurrent RPCs in all (a stream counts until it ends; health checks and reflection are never "
        "counted nor refused); more are rejected RESOURCE_EXHAUSTED with a retry-after-ms hint; 0 = no cap",
    )
    max_streams_per_client: int = setting(
        0,
        "max concurrent RPCs of one client (its x-api-key metadata, else its IP address); more are rejected "
        "RESOURCE_EXHAUSTED; 0 = no cap (the stages' default: their clients are gateways and render workers)",
    )
    log_level: str = setting("INFO", "DEBUG, INFO, WARNING or ERROR")
    log_format: LogFormat = setting(LogFormat.JSON, "json (one object per line) or text")
    device: Device = setting(Device.AUTO, "auto (cuda if available), cpu or cuda")
    require_cudnn: bool = setting(True, "on a GPU, refuse to start when the cuDNN self-check fails")
    api_keys_file: str = setting(
        "",
        "API keys of the public API (the gateway): a file with one key per line, or `name:key` per line (# comments); "
        "every RPC but health and reflection then needs one in x-api-key (or authorization: Bearer) metadata, and the "
        "client's identity for per-client limits is the key's name; empty = no API keys (local mode)",
    )
    secrets_reload_s: float = setting(
        10.0,
        "how often the API keys file (and the gateway's webhook secrets file) is checked for changes and re-read, so "
        "keys rotate without a restart (a file that does not parse is refused and the previous keys stay); 0 = read once",
    )
    internal_token_file: str = setting(
        "",
        "a file holding the token between services: the stages refuse calls without it in x-lipline-internal "
        "metadata (health and reflection exempt); the gateway and render workers send it on every stage call; empty = off",
    )
    tls_cert_file: str = setting(
        "", "PEM certificate (chain) of the gRPC port; with tls_key_file: TLS; empty = plaintext"
    )
    tls_key_file: str = setting("", "PEM private key of tls_cert_file")

    def validate(self) -> None:
        """Raise ValueError with one message per bad value."""
        problems = []
        if not 0 <= self.port <= 65535:
            problems.append(f"port {self.port} is not in 0..65535")
        if self.max_message_bytes < 1024 * 1024:
            problems.append("max_message_bytes must be at least 1 MiB")
        if self.grace_s < 0:
            problems.append("grace_s must be >= 0")
        if self.secrets_reload_s < 0:
            problems.append(f"secrets_reload_s must be >= 0 (0 = read once), got {self.secrets_reload_s}")
        if self.max_connection_age_grace_s < 0:
            problems.append(
                f"max_connection_age_grace_s must be >= 0 (0 = grace_s), got {self.max_connection_age_grace_s}"
            )
        if self.log_level.upper() not in {"DEBUG", "INFO", "WARNING", "ERROR"}:
            problems.append(f"log_level {self.log_level!r} is not DEBUG, INFO, WARNING or ERROR")
        if bool(self.tls_cert_file) != bool(self.tls_key_file):
            problems.append("tls_cert_file and tls_key_file go together: set both (TLS) or neither (plaintext)")
        if problems:
            raise ValueError("; ".join(problems))


@dataclasses.dataclass(frozen=True)
class ModelStageSettings(ServiceSettings):
    """Settings of a stage that serves a model on the GPU (lipsync, superres): batching and backend."""

    max_batch: int = setting(128, "largest model batch")
    max_delay_ms: float = setting(5.0, "how long a batch waits to fill up")
    max_pending_per_stream: int = setting(512, "items one stream may have in flight (back-pressure)")
    pipeline_depth: int = setting(
        0,
        "model batches in flight at once; 0 = auto: 2 on CUDA (the next batch's transfers and host work "
        "overlap the previous one's compute; docs/performance.md has the gain), 1 on the CPU",
    )
    backend: str = setting(
        "auto",
        "model backend: auto (CUDA: compile if compile_cache_dir holds this model's artifacts, else torch "
        "fp16 + folded BN + CUDA graphs; CPU: cpu), cpu, torch, compile, tensorrt",
    )
    batch_buckets: tuple[int, ...] = setting(
        (),
        "batch sizes a model batch is padded up to (static shapes for CUDA graphs/compile); empty = default up to max_batch",
    )
    compile_cache_dir: str = setting(
        "var/compile-cache",
        "compiled-kernel caches, keyed by model/torch/GPU/options (a shared volume: the first backend=compile "
        "pod fills it, later pods start warm and backend=auto then uses it)",
    )
    max_rel_error: float = setting(
        1e-2, "on a GPU, refuse to serve if the backend's relative error vs fp32 exceeds this"
    )
    warm_cache_only: bool = setting(
        False,
        "load and warm the model (backend=compile: fill compile_cache_dir), then exit 0 without serving (the chart's compile-cache Job); exit 1 if that fails",
    )

    def validate(self) -> None:
        super().validate()
        problems = []
        if self.pipeline_depth < 0:
            problems.append(f"pipeline_depth must be >= 0 (0 = auto), got {self.pipeline_depth}")
        if self.max_batch < 1:
            problems.append(f"max_batch must be >= 1, got {self.max_batch}")
        if self.warm_cache_only and self.backend != "compile":
            problems.append(f"warm_cache_only fills the compile cache: it needs backend=compile, got {self.backend!r}")
        if any(b < 1 or b > self.max_batch for b in self.batch_buckets):
            problems.append(f"batch_buckets {list(self.batch_buckets)} must lie in 1..max_batch ({self.max_batch})")
        if problems:
            raise ValueError("; ".join(problems))


@dataclasses.dataclass(frozen=True)
class StoreSettings(ServiceSettings):
    """Settings of a service that uses the stores (gateway, render workers): where jobs and blobs live.

    In a cluster every gateway and worker points at the same PostgreSQL and the same ReadWriteMany
    volume or S3 bucket (the chart fills these from a Secret); the defaults are the embedded stores
    of one machine.
    """

    job_store: str = setting(
        "sqlite:///var/lipline.db",
        "job store: sqlite:///path.db (embedded, one machine) or postgresql://user:password@host:port/db",
    )
    blob_store: str = setting(
        "var/blobs",
        "blob store: a folder (file:///path or a path; a ReadWriteMany volume in a cluster) or s3://bucket/prefix "
        "(credentials and endpoint from the AWS_* variables)",
    )


@dataclasses.dataclass(frozen=True)
class FaceWorkerSettings(StoreSettings):
    """Settings of a worker that asks lipsync (and superres) for faces and blends them into its local
    copy of the avatars (render workers and live workers): the stages it dials and the avatar cache."""

    lipsync_address: str = address_field(STAGES["lipsync"].local_address, "lipsync")
    lipsync_musetalk_address: str = setting(
        "",
        "lipsync-musetalk stage (the faces of the musetalk tier's avatars): "
        f"{ADDRESS_FORMS}; empty = this deployment does not serve that tier (its work fails, naming this setting)",
    )
    superres_address: str = address_field(STAGES["superres"].local_address, "superres")
    cache_dir: str = setting(
        "var/worker-cache", "local cache of avatars converted for compositing (per worker; safe to lose)"
    )
    avatar_cache_bytes: int = setting(
        8 * 1024**3,
        "disk budget of the avatar cache in cache_dir (frames in I420: 3.1 MB per 1080p frame); "
        "the least recently used avatars not in use are deleted to stay within it",
    )


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
            help=_help_text(field, env_name),
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


def _help_text(field: dataclasses.Field, env_name: str) -> str:
    """A flag's help line. argparse formats help strings with `%` (for `%(default)s`), so every `%`
    of the text and of the default is escaped here: a help string may say "+36%" and a default may
    hold any character."""
    text = f"{field.metadata.get('help', '')} [env {env_name}; default {_default_of(field)}]"
    return text.replace("%", "%%")


def _default_of(field: dataclasses.Field) -> str:
    if field.default is not dataclasses.MISSING:
        value = field.default
    elif field.default_factory is not dataclasses.MISSING:
        try:
            value = field.default_factory()
        except Exception:  # noqa: BLE001 - help must print whatever a factory does
            return "(computed)"
    else:
        return "(required)"
    try:
        return _show(value)
    except Exception:  # noqa: BLE001 - a default that cannot be shown still leaves a usable --help
        return f"<{type(value).__name__}>"


def _show(value: Any) -> str:
    """A default as the user would type it (`--flag=<this>`)."""
    if isinstance(value, enum.Enum):
        return str(value.value)
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (tuple, list)):
        return ",".join(v if isinstance(v, str) else _show(v) for v in value) if value else "(empty)"
    if isinstance(value, str):
        return repr(value)
    return str(value)
