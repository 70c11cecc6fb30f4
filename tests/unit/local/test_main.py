"""Local mode's command line (services/local/__main__.py): --musetalk starts the 256 px tier's stage, --model
musetalk renders the demo on it."""

from __future__ import annotations

from services.local.__main__ import musetalk_args, parse_args


def test_musetalk_asks_for_the_stage_and_passes_only_the_checkpoints_given() -> None:
    assert not parse_args([]).musetalk and musetalk_args(parse_args([])) == []
    args = parse_args(["serve", "--musetalk", "--musetalk-unet=/m/unet.pth", "--musetalk-face-parser=/m/bisenet.pth"])
    assert args.musetalk and musetalk_args(args) == ["--unet=/m/unet.pth", "--face-parser=/m/bisenet.pth"]


def test_model_musetalk_makes_the_demos_avatar_for_the_tier_and_starts_its_stage() -> None:
    assert parse_args([]).model == "wav2lip"
    args = parse_args(["--model", "musetalk"])
    assert args.model == "musetalk" and not args.musetalk  # main() then starts the stage as --musetalk does
