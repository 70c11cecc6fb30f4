"""services/lipsync/musetalk/networks.py: the generator as the stage runs it, and the fast-decode switch.

Small seeded networks in the public layout (services/lipsync/musetalk/seeded.py: the same classes,
few channels; the VAE keeps four levels, so it still upsamples 8x). The fast decode decodes latent rows
12-31 only: the same shape, black above pixel row 96, and close to the exact decode where an avatar's
alpha can be nonzero (not equal: the decoder's mid-block attention and GroupNorms see 20 of 32 rows).
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
import torch

from lipline.v1 import lipsync_pb2
from services.lipsync.musetalk.masks import finish_mask, mask_box
from services.lipsync.musetalk.networks import FAST_DECODE_FIRST_ROW, Networks, load_networks
from services.lipsync.musetalk.seeded import write_seeded_networks
from services.media.musetalk_wire import pack_items, pack_latents, pack_window
from tests.helpers.musetalk_stage import RunningStage

FACE = 256


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    return write_seeded_networks(tmp_path_factory.mktemp("musetalk-small"), small=True)


@pytest.fixture(scope="module")
def pair(files: dict[str, str]) -> tuple[Networks, Networks]:
    return load_networks(**files), load_networks(**files, fast_decode=True)


def inputs(batch: int = 3) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(1)
    return torch.randn((batch, 8, 32, 32), generator=gen) * 0.5, torch.rand((batch, 50, 384), generator=gen)


def first_alpha_row() -> int:
    """The first face row (of 256) an avatar's alpha can reach: a mask that is 255 everywhere, cut and
    blurred as preparation does, mapped from the mask square back onto the face box."""
    box = (100, 60, 356, 316)  # a 256 px box: face rows = box rows
    square = mask_box(box)
    side = square[2] - square[0]
    alpha = finish_mask(np.full((side, side), 255, np.uint8), box, square)
    first = int(np.argmax(alpha.max(axis=1) > 0))
    return first - (box[1] - square[1])


def test_the_alpha_never_reaches_the_rows_the_fast_decode_leaves_black() -> None:
    first = first_alpha_row()
    # the cut at the middle row (128) less the blur's half kernel (0.05 x the 1.5x square's side)
    assert 100 < first < FACE // 2
    assert first >= FAST_DECODE_FIRST_ROW * 8 + 8, "keep at least one latent row between the strip's edge and the alpha"


def test_fast_decode_matches_the_exact_decode_where_the_alpha_is(pair: tuple[Networks, Networks]) -> None:
    exact_nets, fast_nets = pair
    assert (exact_nets.name, fast_nets.name) == ("musetalk", "musetalk+fast-decode")
    latents, tokens = inputs()
    with torch.no_grad():
        exact = exact_nets.generator(latents, tokens)
        fast = fast_nets.generator(latents, tokens)
    assert fast.shape == exact.shape == (3, 3, FACE, FACE)
    top = FAST_DECODE_FIRST_ROW * 8
    assert torch.count_nonzero(fast[:, :, :top]) == 0  # black above the decoded strip
    used = slice(first_alpha_row(), FACE)
    diff = (fast[:, :, used] - exact[:, :, used]).abs()
    spread = exact[:, :, used].std().item()
    print(
        f"fast vs exact decode, face rows {used.start}-255: mean |diff| {diff.mean():.4f}, max {diff.max():.4f} "
        f"(faces in [0, 1]; the exact faces' std {spread:.3f})"
    )
    # Seeded small networks (random attention and GroupNorm statistics) are the worst case for the
    # approximation; the bound only says the strip is the same picture, not another one.
    assert diff.mean().item() < 0.25 * spread
    assert not torch.equal(fast[:, :, used], exact[:, :, used])  # not exact: the attention is global


def test_the_switch_is_part_of_the_compile_cache_key(pair: tuple[Networks, Networks]) -> None:
    from services.inference.backends.spec import compile_cache_key

    exact_nets, fast_nets = pair
    keys = {compile_cache_key(n.generator, torch.device("cpu"), "fp16", (16, 32)) for n in pair}
    assert len(keys) == 2


@pytest.fixture(scope="module")
def fast_stage(files: dict[str, str]) -> Iterator[RunningStage]:
    with RunningStage(**files, fast_decode=True, max_batch=4) as running:
        yield running


def test_the_stage_reports_the_switch_and_serves_faces(fast_stage: RunningStage) -> None:
    latents = (np.random.default_rng(0).standard_normal((2, 8, 32, 32)) * 0.5).astype(np.float16)
    mel = np.full((80, 100), -0.5, np.float16)
    request = lipsync_pb2.MuseTalkGenerateRequest(
        latents=pack_latents([0, 1], latents),
        windows=[pack_window(0, mel, -0.5, positions=50)],
        items=pack_items([0, 1, 2], [0, 1, 0], [0, 0, 0], [0, 2, 4]),
    )
    frames, faces, model = fast_stage.generate([request])
    assert model == "musetalk+fast-decode"
    assert frames == [0, 1, 2] and faces.shape == (3, FACE, FACE, 3)
    assert not faces[:, : FAST_DECODE_FIRST_ROW * 8].any() and faces[:, FAST_DECODE_FIRST_ROW * 8 :].any()


def test_the_generators_positional_buffer_is_positional_encoding_in_every_precision(
    pair: tuple[Networks, Networks],
) -> None:
    """The table the generator keeps (cast and moved with the weights by its backend) adds what
    `positional_encoding` adds, in fp32 and, after a cast to fp16, as upstream's `pe.half()`."""
    from services.lipsync.musetalk import positional_encoding

    generator = pair[0].generator
    tokens = inputs()[1]
    assert torch.equal(tokens + generator.positions, positional_encoding(tokens))
    half = generator.positions.half()
    assert torch.equal(tokens.half() + half, positional_encoding(tokens.half()))
    with pytest.raises(ValueError, match=r"\(B, 50, 384\)"):
        generator(inputs()[0], tokens[:, :10])
