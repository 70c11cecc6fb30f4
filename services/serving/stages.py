"""The one list of lipline's stages: name, ports, GPU or not, image, who calls whom.

"Stage" here means any deployable: a `python -m services.<name>` service with its own image, chart
entry and ports: the stages the pipeline calls (audio, lipsync, superres), and also the
gateway and the render workers; a new deployable is one more entry here.

Everything that needs the list reads it from here: the services' default ports, the local cluster
(services/local), the benchmarks' process handling, the image build (scripts/image_requirements.py,
the Makefile's `images`), the chart's schema (scripts/gen_chart_schema.py); the chart's own list is
`stages:` in helm/lipline/values.yaml, and tests/unit/serving/test_stages.py checks the two agree.

Standard library only: the image build reads it before anything is installed, and the torch-free
images (audio, gateway, render, live, web) import it.

`python -m services.serving.stages [--gpu | --cpu]` prints the stage names, one line, space-separated;
with a flag, those with an image of their own on that runtime (the Makefile's image lists).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from collections.abc import Mapping, Sequence
from types import MappingProxyType


@dataclasses.dataclass(frozen=True)
class Stage:
    """One stage: a `python -m services.<name>` service, its image and its place in the pipeline.

    Attributes:
        name: the stage's name: its package under services/, its chart key `stages.<name>`, its
            `stage` metrics label.
        port: default gRPC port (LIPLINE_PORT; the chart's `stages.<name>.port`).
        metrics_port: default Prometheus /metrics port (the chart's `metricsPort`).
        settings: its settings dataclass as "module:Class" (what `stages.<name>.config` may set).
        gpu: serves a model on a GPU (the chart's `gpu` > 0, RUNTIME=gpu in services/Dockerfile).
        public: the public API: checks API keys, never the internal token (the chart's `public`).
        calls: the stages it dials, each as `--<stage>-address` (the chart's `dials`).
        stores: uses the job and blob stores (the chart's `stores`).
        cache: keeps a local scratch cache, `--cache-dir` (the chart's `cache`).
        http_port: default port of an HTTP server beside the gRPC one (the web page; the chart's
            `httpPort`); 0 = none.
        package: the package `python -m` runs, under services/, when it is not `name` (a stage
            whose name is no Python name: `lipsync-musetalk` runs `services.lipsync.musetalk`).
        image_of: the stage whose image it runs, when it has none of its own (`lipsync-musetalk`
            is a second Deployment of the lipsync image); "" = its own image.
        tier: the avatars' generator tier whose faces it makes ("wav2lip", "musetalk"); "" = none.
        optional: started only where asked (the chart's `enabled`, local mode's replicas), and its
            callers run without it: a caller's empty address means "not deployed".
    """

    name: str
    port: int
    metrics_port: int
    settings: str
    gpu: bool = False
    public: bool = False
    calls: tuple[str, ...] = ()
    stores: bool = False
    cache: bool = False
    http_port: int = 0
    package: str = ""
    image_of: str = ""
    tier: str = ""
    optional: bool = False

    @property
    def module(self) -> str:
        """What `python -m` runs."""
        return f"services.{self.package or self.name}"

    @property
    def image(self) -> str:
        """The image's name (without registry and tag): `make images` builds it, the chart pulls it."""
        return f"lipline-{self.image_of or self.name}"

    @property
    def local_address(self) -> str:
        """The default address of this stage on one machine (callers' default `--<name>-address`)."""
        return f"127.0.0.1:{self.port}"


def _registry(*stages: Stage) -> Mapping[str, Stage]:
    by_name = {s.name: s for s in stages}
    problems = [f"{s.name} calls unknown stage {c!r}" for s in stages for c in s.calls if c not in by_name]
    problems += [
        f"{s.name} runs the image of unknown stage {s.image_of!r}"
        for s in stages
        if s.image_of and s.image_of not in by_name
    ]
    tiers = [s.tier for s in stages if s.tier]
    if len(set(tiers)) != len(tiers):
        problems.append(f"a tier is served by two stages: {tiers}")
    ports = [p for s in stages for p in (s.port, s.metrics_port, s.http_port) if p]
    if len(set(ports)) != len(ports):
        problems.append(f"a port is used twice: {ports}")
    if len(by_name) != len(stages):
        problems.append("a stage name is used twice")
    if problems:
        raise ValueError("; ".join(problems))
    return MappingProxyType(by_name)


#: every stage by name, in pipeline order (the stages that are called before their callers)
STAGES: Mapping[str, Stage] = _registry(
    Stage("audio", port=50061, metrics_port=9091, settings="services.audio.settings:AudioSettings"),
    Stage(
        "lipsync",
        port=50062,
        metrics_port=9092,
        settings="services.lipsync.settings:LipSyncSettings",
        gpu=True,
        tier="wav2lip",
    ),
    # The 256 px tier (MuseTalk 1.5 format): a second Deployment of the lipsync image, off unless asked.
    Stage(
        "lipsync-musetalk",
        port=50068,
        metrics_port=9099,
        settings="services.lipsync.musetalk.settings:MuseTalkSettings",
        gpu=True,
        package="lipsync.musetalk",
        image_of="lipsync",
        tier="musetalk",
        optional=True,
    ),
    Stage("superres", port=50063, metrics_port=9093, settings="services.superres.settings:SuperResSettings", gpu=True),
    # Render workers claim segments from the job store; their gRPC port serves health and reflection only.
    Stage(
        "render",
        port=50064,
        metrics_port=9095,
        settings="services.render.settings:RenderSettings",
        calls=("lipsync", "lipsync-musetalk", "superres"),
        stores=True,
        cache=True,
    ),
    # Live workers hold live sessions: CPU pods pacing frames, the gateway places sessions on them.
    Stage(
        "live",
        port=50066,
        metrics_port=9097,
        settings="services.live.settings:LiveSettings",
        calls=("lipsync", "lipsync-musetalk", "superres"),
        stores=True,
        cache=True,
    ),
    Stage(
        "gateway",
        port=50051,
        metrics_port=9094,
        settings="services.gateway.settings:GatewaySettings",
        public=True,
        calls=("audio", "lipsync", "lipsync-musetalk"),
        stores=True,
    ),
    # The web page: an HTTP server (page, API, live WebSocket) that calls the gateway with the user's
    # API key; its gRPC port serves health and reflection only.
    Stage(
        "web",
        port=50067,
        metrics_port=9098,
        settings="services.web.settings:WebSettings",
        calls=("gateway",),
        http_port=8080,
    ),
)


def stage(name: str) -> Stage:
    """The stage called `name`; ValueError naming the known ones otherwise."""
    try:
        return STAGES[name]
    except KeyError:
        raise ValueError(f"unknown stage {name!r}: one of {', '.join(STAGES)}") from None


#: the generator tier of an avatar made without asking for one
DEFAULT_TIER = "wav2lip"
#: the 256 px tier in the MuseTalk 1.5 format (the lipsync-musetalk stage's)
MUSETALK_TIER = "musetalk"


def tiers() -> tuple[str, ...]:
    """The avatars' generator tiers, in registry order ("wav2lip", "musetalk")."""
    return tuple(s.tier for s in STAGES.values() if s.tier)


def tier_stage(tier: str) -> Stage:
    """The stage that makes the faces of `tier`'s avatars; ValueError naming the tiers otherwise."""
    for s in STAGES.values():
        if s.tier == tier:
            return s
    raise ValueError(f"unknown model {tier!r}: one of {', '.join(tiers())}")


def image_stages(gpu: bool | None = None) -> tuple[str, ...]:
    """The stages with an image of their own (`make images` builds one per name), all or GPU/CPU only."""
    return tuple(s.name for s in STAGES.values() if not s.image_of and (gpu is None or s.gpu == gpu))


def gpu_stages() -> tuple[str, ...]:
    return tuple(s.name for s in STAGES.values() if s.gpu)


def cpu_stages() -> tuple[str, ...]:
    return tuple(s.name for s in STAGES.values() if not s.gpu)


def public_stages() -> frozenset[str]:
    return frozenset(s.name for s in STAGES.values() if s.public)


def called_stages() -> tuple[str, ...]:
    """The stages some other stage dials (audio, lipsync, superres: the model stages), in registry order.

    The public API (the gateway) is left out: the web page's bridge dials it as any client does, so
    it is a caller of the pipeline, not a stage of it."""
    called = {c for s in STAGES.values() for c in s.calls if not STAGES[c].public}
    return tuple(name for name in STAGES if name in called)


def start_order(names: Sequence[str] | None = None) -> list[list[str]]:
    """`names` (default all) in waves: each stage after the stages it calls, a wave's stages independent.

    The local cluster starts a wave, waits for it to be SERVING, then starts the next; it stops them
    in the reverse order.
    """
    names = list(STAGES if names is None else names)
    depth: dict[str, int] = {}

    def level(name: str, seen: tuple[str, ...] = ()) -> int:
        if name in seen:
            raise ValueError(f"stages call each other in a cycle: {' -> '.join((*seen, name))}")
        if name not in depth:
            depth[name] = 1 + max((level(c, (*seen, name)) for c in stage(name).calls), default=-1)
        return depth[name]

    waves: list[list[str]] = []
    for name in names:
        d = level(name)
        waves += [[] for _ in range(d + 1 - len(waves))]
        waves[d].append(name)
    return [w for w in waves if w]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m services.serving.stages", description="print the stage names")
    which = p.add_mutually_exclusive_group()
    which.add_argument("--gpu", action="store_true", help="only the images of GPU stages")
    which.add_argument("--cpu", action="store_true", help="only the images of CPU stages")
    args = p.parse_args(argv)
    print(" ".join(image_stages(True) if args.gpu else image_stages(False) if args.cpu else STAGES))
    return 0


if __name__ == "__main__":
    sys.exit(main())
