"""Inference-time graph simplification: fold BatchNorm2d into the convolution that feeds it.

In eval mode a BatchNorm2d is a per-channel affine map, y = (x - mean) / sqrt(var + eps) * gamma + beta,
so when it directly follows a convolution it can be absorbed into that convolution's weights and
bias. For Wav2Lip (every `conv_block` is `Sequential(Conv2d | ConvTranspose2d, BatchNorm2d)`) this
removes 60+ elementwise kernels per forward pass and one full read+write of every activation.

Only pairs that sit next to each other inside an `nn.Sequential` are folded: that is the one place
where "the BN consumes exactly the conv's output and nothing else" is visible from the module tree
without tracing. The BN is replaced by `nn.Identity`, so module indices (and therefore the names of
the remaining parameters) are unchanged.
"""

from __future__ import annotations

import copy
import logging
from typing import cast

import torch
from torch import nn

__all__ = ["fold_conv_bn", "count_foldable"]

_LOGGER = logging.getLogger(__name__)

_Conv = nn.Conv2d | nn.ConvTranspose2d


def _foldable(conv: nn.Module, bn: nn.Module) -> bool:
    if not isinstance(conv, (nn.Conv2d, nn.ConvTranspose2d)) or not isinstance(bn, nn.BatchNorm2d):
        return False
    # Without running statistics, eval-mode BN normalises with batch statistics: not an affine map.
    if not bn.track_running_stats or bn.running_mean is None or bn.running_var is None:
        return False
    return bn.num_features == conv.out_channels


def _pairs(module: nn.Module) -> list[tuple[nn.Sequential, int]]:
    """(sequential, index of the BN) for every conv->BN pair in the tree."""
    found = []
    for sub in module.modules():
        if isinstance(sub, nn.Sequential):
            children = list(sub)
            for i in range(1, len(children)):
                if _foldable(children[i - 1], children[i]):
                    found.append((sub, i))
    return found


def count_foldable(module: nn.Module) -> int:
    """How many conv->BatchNorm2d pairs `fold_conv_bn` would fold."""
    return len(_pairs(module))


@torch.no_grad()
def _fold_into(conv: _Conv, bn: nn.BatchNorm2d) -> None:
    """Absorb `bn` (eval-mode statistics) into `conv`'s weight and bias, in place."""
    dtype = conv.weight.dtype
    # float64 for the arithmetic: the fold itself should add no error beyond the final rounding.
    running_var, running_mean = bn.running_var, bn.running_mean
    if running_var is None or running_mean is None:  # _foldable refuses such a BN
        raise ValueError("a BatchNorm2d without running statistics cannot be folded")
    var = running_var.double()
    mean = running_mean.double()
    gamma = bn.weight.double() if bn.weight is not None else torch.ones_like(var)
    beta = bn.bias.double() if bn.bias is not None else torch.zeros_like(var)
    scale = gamma / torch.sqrt(var + bn.eps)  # (out,)
    weight = conv.weight.double()
    if isinstance(conv, nn.ConvTranspose2d):
        # Layout (in, out // groups, kh, kw): output channel g * (out // groups) + j lives at
        # weight[g * (in // groups) : (g + 1) * (in // groups), j].
        g = conv.groups
        cin, cout_g = weight.shape[0], weight.shape[1]
        w = weight.reshape(g, cin // g, cout_g, *weight.shape[2:])
        w = w * scale.reshape(g, 1, cout_g, 1, 1)
        weight = w.reshape(weight.shape)
    else:
        # Layout (out, in // groups, kh, kw).
        weight = weight * scale.reshape(-1, 1, 1, 1)
    bias = conv.bias.double() if conv.bias is not None else torch.zeros_like(mean)
    bias = (bias - mean) * scale + beta
    conv.weight.copy_(weight.to(dtype))
    if conv.bias is None:
        conv.bias = nn.Parameter(bias.to(dtype=dtype, device=conv.weight.device), requires_grad=False)
    else:
        conv.bias.copy_(bias.to(dtype))


def fold_conv_bn(module: nn.Module) -> nn.Module:
    """Return an eval-mode deep copy of `module` with every Conv2d/ConvTranspose2d -> BatchNorm2d pair
    inside an `nn.Sequential` folded (the BN replaced by `nn.Identity`).

    The original module, its parameters and buffers are left untouched. The result is only valid
    for inference: it reproduces the original's *eval-mode* output (running statistics).
    """
    folded = copy.deepcopy(module).eval()
    pairs = _pairs(folded)
    for seq, i in pairs:
        _fold_into(cast(_Conv, seq[i - 1]), cast(nn.BatchNorm2d, seq[i]))  # _foldable checked both
        seq[i] = nn.Identity()
    _LOGGER.debug("folded %d conv+BatchNorm2d pairs in %s", len(pairs), type(module).__name__)
    return folded
