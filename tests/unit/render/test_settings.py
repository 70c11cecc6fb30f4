"""RenderSettings.max_tenant_share: a fraction of the busy workers, 1.0 = off."""

from __future__ import annotations

import pytest

from services.render.settings import RenderSettings


def test_max_tenant_share_defaults_off() -> None:
    assert RenderSettings().max_tenant_share == 1.0


@pytest.mark.parametrize("share", [0.0, -0.5, 1.5, float("nan")])
def test_max_tenant_share_outside_0_1_is_refused(share: float) -> None:
    with pytest.raises(ValueError, match="max_tenant_share"):
        RenderSettings(max_tenant_share=share).validate()
