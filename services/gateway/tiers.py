"""Model tiers as the gateway sees them (docs/architecture.md section 12): which names a request may
give and which tiers this deployment serves.

A tier is the generator an avatar is prepared for (`wav2lip`, the default, or `musetalk`); the stage
registry says which stage serves each (services.serving.stages.tier_stage). The Wav2Lip tier is always
served; another is served where the gateway has its stage's address (`lipsync_musetalk_address`, set
by the chart when `stages.lipsync-musetalk.enabled`): an empty one means the cluster runs no such
stage, and CreateAvatar for that tier is FAILED_PRECONDITION, said before the upload costs anything.
"""

from __future__ import annotations

from services.gateway.settings import GatewaySettings
from services.serving.errors import FailedPrecondition, InvalidRequest
from services.serving.stages import DEFAULT_TIER, tier_stage, tiers


def check_model(model: str, what: str = "model") -> str:
    """A request's tier name: "" is the default (wav2lip); an unknown one is INVALID_ARGUMENT naming the known."""
    if not model:
        return DEFAULT_TIER
    if model not in tiers():
        raise InvalidRequest(f"{what} {model[:64]!r} is not a model tier; use one of {', '.join(tiers())}")
    return model


def tier_address(settings: GatewaySettings, model: str) -> str:
    """The address of the stage serving `model` ("" = this deployment does not run it)."""
    stage = tier_stage(model)
    return str(getattr(settings, f"{stage.name.replace('-', '_')}_address", ""))


def require_served(settings: GatewaySettings, model: str) -> None:
    """FAILED_PRECONDITION, naming the stage and the setting, when this deployment does not serve `model`."""
    if tier_address(settings, model):
        return
    stage = tier_stage(model)
    setting = f"{stage.name.replace('-', '_')}_address"
    raise FailedPrecondition(
        f"this lipline does not serve the {model!r} model tier: it runs no {stage.name} stage (the chart's "
        f"stages.{stage.name}.enabled; the gateway's {setting}); create the avatar with model {DEFAULT_TIER!r}, "
        "or ask the operator to deploy that tier"
    )
