"""services/lipsync/musetalk/unet.py: the public file's keys, and the UNet as upstream runs it.

data/keys_unet.json is the key table of MuseTalk's UNet (`UNet2DConditionModel(**musetalk.json)`,
recorded with diffusers 0.30.2; `config` is musetalk.json). The numerical check builds a small UNet of
the same classes (fewer channels and layers), writes it as upstream's files are written
(`torch.save(unet.state_dict())` beside a musetalk.json), and compares `load_unet` with upstream's own
steps: `UNet2DConditionModel(**json)`, `load_state_dict(torch.load(...))`, `.sample`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from services.inference.checkpoints import seeded_state_dict
from services.lipsync.musetalk import load_unet, positional_encoding
from services.lipsync.musetalk.unet import UNET_CONFIG_NAME, build_unet
from services.serving.errors import CheckpointError

TABLE = json.loads((Path(__file__).parent / "data" / "keys_unet.json").read_text())
# The same block types, attention layout and widths of the conditioning; 32/64 channels, one layer each.
SMALL: dict[str, Any] = {
    **TABLE["config"],
    "block_out_channels": [32, 32, 64, 64],
    "layers_per_block": 1,
    "sample_size": 16,
}


def _write(folder: Path, state_dict: dict[str, torch.Tensor], config: dict[str, Any] = SMALL) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    torch.save(state_dict, folder / "unet.pth")
    (folder / UNET_CONFIG_NAME).write_text(json.dumps(config, indent=2))
    return folder / "unet.pth"


@pytest.fixture(scope="module")
def weights() -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    return seeded_state_dict(build_unet(SMALL).unet, scale=0.05)


def test_the_full_size_unet_has_the_public_checkpoints_keys() -> None:
    with torch.device("meta"):
        model = build_unet(TABLE["config"])
    keys = [[k, list(v.shape), str(v.dtype).removeprefix("torch.")] for k, v in model.unet.state_dict().items()]
    assert keys == TABLE["keys"]
    assert sum(v.numel() for v in model.unet.state_dict().values()) == TABLE["summary"]["num_elements"] == 849_947_844


def test_load_unet_runs_upstreams_unet(tmp_path: Path, weights: dict[str, torch.Tensor]) -> None:
    path = _write(tmp_path / "musetalkV15", weights)
    model = load_unet(path)
    assert not model.training

    # imported here, not with the module: it takes seconds, paid only by the worker that runs this test
    from diffusers import UNet2DConditionModel

    # Upstream's steps (musetalk/models/unet.py and the inference scripts), written out here.
    reference = UNet2DConditionModel(**json.loads((path.parent / UNET_CONFIG_NAME).read_text()))
    reference.load_state_dict(torch.load(path, weights_only=True))
    reference.eval()

    gen = torch.Generator().manual_seed(1)
    sample = torch.randn(3, 8, 32, 32, generator=gen)
    audio = torch.randn(3, 50, 384, generator=gen)
    with torch.no_grad():
        expected = reference(sample, torch.tensor([0]), encoder_hidden_states=positional_encoding(audio)).sample
        got = model(sample, torch.zeros(3, dtype=torch.long), positional_encoding(audio))
    assert got.shape == (3, 4, 32, 32)
    assert (got - expected).norm() / expected.norm() < 1e-4
    # The weights were read: the default initialisation answers differently.
    with torch.no_grad():
        fresh = build_unet(SMALL).eval()(sample, torch.zeros(3, dtype=torch.long), positional_encoding(audio))
    assert (fresh - expected).norm() / expected.norm() > 0.1


def test_a_checkpoint_with_a_missing_or_an_extra_key_fails_naming_it(
    tmp_path: Path, weights: dict[str, torch.Tensor]
) -> None:
    missing = dict(weights)
    del missing["mid_block.attentions.0.proj_in.weight"]
    with pytest.raises(CheckpointError, match=r"missing keys: mid_block\.attentions\.0\.proj_in\.weight"):
        load_unet(_write(tmp_path / "missing", missing))
    extra = {**weights, "extra_head.weight": torch.zeros(3)}
    with pytest.raises(CheckpointError, match=r"unexpected keys: extra_head\.weight"):
        load_unet(_write(tmp_path / "extra", extra))
    misshaped = {**weights, "conv_in.weight": torch.zeros(32, 4, 3, 3)}
    with pytest.raises(CheckpointError, match=r"shape mismatch: conv_in\.weight"):
        load_unet(_write(tmp_path / "misshaped", misshaped))


def test_the_config_beside_the_weights_is_required(tmp_path: Path, weights: dict[str, torch.Tensor]) -> None:
    path = _write(tmp_path / "no-config", weights)
    (path.parent / UNET_CONFIG_NAME).unlink()
    with pytest.raises(CheckpointError, match="musetalk.json does not exist"):
        load_unet(path)
    with pytest.raises(CheckpointError, match="does not describe a UNet2DConditionModel"):
        load_unet(_write(tmp_path / "bad-config", weights, {**SMALL, "down_block_types": ["NoSuchBlock2D"] * 4}))
    with pytest.raises(CheckpointError, match="does not exist"):
        load_unet(tmp_path / "nowhere" / "unet.pth")
