"""services/lipsync/musetalk/face_parser.py: 79999_iter.pth's keys, and BiSeNet's first output.

data/keys_bisenet.json is the key table of face-parsing.PyTorch's BiSeNet (19 classes) as MuseTalk vendors
it; 79999_iter.pth is that plain state dict, loaded strictly. The numerical check is an independent
computation: upstream's forward written out with torch.nn.functional straight from the state dict
(avg_pool2d for the global pools, nearest interpolation of the 1x1 context as upstream does), not
from the module's code.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from services.inference.checkpoints import seeded_state_dict
from services.lipsync.musetalk import load_face_parser
from services.lipsync.musetalk.face_parser import FACE_PARSER_CLASSES, BiSeNet
from services.serving.errors import CheckpointError

TABLE = json.loads((Path(__file__).parent / "data" / "keys_bisenet.json").read_text())
Weights = dict[str, torch.Tensor]


@pytest.fixture(scope="module")
def weights() -> Weights:
    return seeded_state_dict(BiSeNet(), scale=0.05)


@pytest.fixture(scope="module")
def checkpoint(weights: Weights, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The seeded weights as upstream's file is: `torch.save(net.state_dict())`."""
    path = tmp_path_factory.mktemp("face-parse-bisent") / "79999_iter.pth"
    torch.save(weights, path)
    return path


def test_the_module_has_the_public_checkpoints_keys() -> None:
    with torch.device("meta"):
        model = BiSeNet()
    keys = [[k, list(v.shape), str(v.dtype).removeprefix("torch.")] for k, v in model.state_dict().items()]
    assert keys == TABLE["keys"]
    assert sum(v.numel() for v in model.state_dict().values()) == TABLE["summary"]["num_elements"]
    assert list(FACE_PARSER_CLASSES) == TABLE["classes"]


# ---- upstream's forward, functionally ----


def _bn(w: Weights, name: str, x: torch.Tensor) -> torch.Tensor:
    return F.batch_norm(
        x, w[f"{name}.running_mean"], w[f"{name}.running_var"], w[f"{name}.weight"], w[f"{name}.bias"], False, 0.0, 1e-5
    )


def _conv_bn_relu(w: Weights, name: str, x: torch.Tensor, padding: int) -> torch.Tensor:
    return F.relu(_bn(w, f"{name}.bn", F.conv2d(x, w[f"{name}.conv.weight"], padding=padding)))


def _block(w: Weights, name: str, x: torch.Tensor, stride: int) -> torch.Tensor:
    residual = F.relu(_bn(w, f"{name}.bn1", F.conv2d(x, w[f"{name}.conv1.weight"], stride=stride, padding=1)))
    residual = _bn(w, f"{name}.bn2", F.conv2d(residual, w[f"{name}.conv2.weight"], padding=1))
    shortcut = x
    if f"{name}.downsample.0.weight" in w:
        shortcut = _bn(w, f"{name}.downsample.1", F.conv2d(x, w[f"{name}.downsample.0.weight"], stride=stride))
    return F.relu(shortcut + residual)


def _arm(w: Weights, name: str, x: torch.Tensor) -> torch.Tensor:
    feat = _conv_bn_relu(w, f"{name}.conv", x, 1)
    atten = F.avg_pool2d(feat, feat.size()[2:])
    atten = torch.sigmoid(_bn(w, f"{name}.bn_atten", F.conv2d(atten, w[f"{name}.conv_atten.weight"])))
    return torch.mul(feat, atten)


def _head(w: Weights, name: str, x: torch.Tensor) -> torch.Tensor:
    return F.conv2d(_conv_bn_relu(w, f"{name}.conv", x, 1), w[f"{name}.conv_out.weight"])


def _upstream(w: Weights, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    height, width = x.shape[2:]
    r = "cp.resnet"
    y = F.relu(_bn(w, f"{r}.bn1", F.conv2d(x, w[f"{r}.conv1.weight"], stride=2, padding=3)))
    y = F.max_pool2d(y, kernel_size=3, stride=2, padding=1)
    for layer, stride in ((1, 1), (2, 2), (3, 2), (4, 2)):
        y = _block(w, f"{r}.layer{layer}.1", _block(w, f"{r}.layer{layer}.0", y, stride), 1)
        if layer == 2:
            feat8 = y
        elif layer == 3:
            feat16 = y
    feat32 = y
    avg = _conv_bn_relu(w, "cp.conv_avg", F.avg_pool2d(feat32, feat32.size()[2:]), 0)
    avg_up = F.interpolate(avg, feat32.shape[2:], mode="nearest")
    feat32_up = F.interpolate(_arm(w, "cp.arm32", feat32) + avg_up, feat16.shape[2:], mode="nearest")
    feat32_up = _conv_bn_relu(w, "cp.conv_head32", feat32_up, 1)
    feat16_up = F.interpolate(_arm(w, "cp.arm16", feat16) + feat32_up, feat8.shape[2:], mode="nearest")
    feat16_up = _conv_bn_relu(w, "cp.conv_head16", feat16_up, 1)
    # Feature fusion of the 1/8 backbone feature (the deleted spatial path's stand-in) and the context.
    feat = _conv_bn_relu(w, "ffm.convblk", torch.cat([feat8, feat16_up], dim=1), 0)
    atten = F.avg_pool2d(feat, feat.size()[2:])
    atten = torch.sigmoid(F.conv2d(F.relu(F.conv2d(atten, w["ffm.conv1.weight"])), w["ffm.conv2.weight"]))
    fused = torch.mul(feat, atten) + feat
    outs = (_head(w, "conv_out", fused), _head(w, "conv_out16", feat16_up), _head(w, "conv_out32", feat32_up))
    up = [F.interpolate(o, (height, width), mode="bilinear", align_corners=True) for o in outs]
    return up[0], up[1], up[2]


@pytest.mark.parametrize("size", [(64, 64), (72, 56)])
def test_load_face_parser_gives_upstreams_first_output(
    size: tuple[int, int], checkpoint: Path, weights: Weights
) -> None:
    model = load_face_parser(checkpoint)
    assert not model.training
    x = torch.randn(2, 3, *size, generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        got = model(x)
        expected, aux16, _ = _upstream(weights, x)
    assert got.shape == (2, 19, *size)
    assert (got - expected).norm() / expected.norm() < 1e-4
    # The first output, not an auxiliary head's; and the weights were read (the default init differs).
    assert (aux16 - expected).norm() / expected.norm() > 0.1
    with torch.no_grad():
        fresh = BiSeNet().eval()(x)
    assert (fresh - expected).norm() / expected.norm() > 0.1


def test_a_checkpoint_with_a_missing_or_an_extra_key_fails_naming_it(tmp_path: Path, weights: Weights) -> None:
    missing = {k: v for k, v in weights.items() if k != "cp.arm16.bn_atten.running_var"}
    torch.save(missing, tmp_path / "missing.pth")
    with pytest.raises(CheckpointError, match=r"missing keys: cp\.arm16\.bn_atten\.running_var"):
        load_face_parser(tmp_path / "missing.pth")
    torch.save({**weights, "cp.resnet.fc.weight": torch.zeros(1000, 512)}, tmp_path / "extra.pth")
    with pytest.raises(CheckpointError, match=r"unexpected keys: cp\.resnet\.fc\.weight"):
        load_face_parser(tmp_path / "extra.pth")
    with pytest.raises(CheckpointError, match="does not exist"):
        load_face_parser(tmp_path / "absent.pth")
