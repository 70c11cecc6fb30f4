"""MuseTalk's audio features: whisper-tiny's encoder states, cut into per-frame token windows.

Upstream (`musetalk/utils/audio_processor.py`) runs transformers' `WhisperModel.encoder` over each 30 s
log-mel window with `output_hidden_states=True` and keeps all five states (the conv stem plus positions,
the outputs of layers 1-3, and the final LayerNorm of layer 4's output), then gives video frame i ten
consecutive 20 ms positions of them: 10 x 5 = 50 tokens of width 384, plus a sinusoidal positional
encoding (`musetalk/models/unet.py`), as the UNet's cross-attention input.

The encoder here is a plain-torch rebuild with transformers' parameter names (`WhisperEncoder`; the HF
folder's `model.encoder.*` keys load into it strictly, the decoder's are ignored): four pre-LayerNorm
transformer layers are small enough to own, the serving image need not carry transformers, and
tests/unit/lipsync/musetalk/test_whisper.py checks it against transformers' own encoder.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from services.inference.checkpoints import load_strict, read_state_dict_file
from services.lipsync.musetalk.files import read_json_config, weights_in
from services.serving.errors import CheckpointError

__all__ = [
    "AUDIO_FPS",
    "TOKENS_PER_FRAME",
    "WHISPER_WEIGHT_FILES",
    "WhisperEncoder",
    "WhisperEncoderConfig",
    "feature_length",
    "load_whisper_encoder",
    "positional_encoding",
    "positional_table",
    "whisper_chunks",
    "window_starts",
]

AUDIO_FPS = 50  # encoder positions per second (20 ms each)
WINDOW = 10  # positions per video frame (upstream: 2 * (2 + 2 + 1))
TOKENS_PER_FRAME = WINDOW * 5  # x 5 hidden states = 50 tokens
# transformers' file names, in its order of preference.
WHISPER_WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")
# Prefixes of the checkpoint's keys: the encoder's (used) and the rest of the seq2seq model (ignored).
_ENCODER_PREFIXES = ("model.encoder.", "encoder.")
_IGNORED_PREFIXES = ("model.decoder.", "decoder.", "proj_out.")


@dataclass(frozen=True)
class WhisperEncoderConfig:
    """The encoder's part of a transformers `WhisperConfig` (defaults: openai/whisper-tiny)."""

    num_mel_bins: int = 80
    d_model: int = 384
    encoder_layers: int = 4
    encoder_attention_heads: int = 6
    encoder_ffn_dim: int = 1536
    max_source_positions: int = 1500

    @classmethod
    def from_hf(cls, config: Mapping[str, Any]) -> WhisperEncoderConfig:
        """From a config.json of the HF folder; transformers' defaults where a field is absent."""
        activation = config.get("activation_function", "gelu")
        if activation != "gelu":
            raise CheckpointError(f"whisper config: activation_function {activation!r}, this encoder implements 'gelu'")
        values = {f.name: int(config[f.name]) for f in fields(cls) if f.name in config}
        return cls(**values)


class WhisperAttention(nn.Module):
    """Multi-head self-attention with transformers' names: `k_proj` has no bias (as openai's `key`)."""

    def __init__(self, d_model: int, heads: int) -> None:
        super().__init__()
        if d_model % heads:
            raise ValueError(f"d_model {d_model} is not divisible by {heads} heads")
        self.heads = heads
        # Declared in transformers' order, so the state dict's key order is the checkpoint's.
        self.k_proj = nn.Linear(d_model, d_model, bias=False)
        self.v_proj = nn.Linear(d_model, d_model)
        self.q_proj = nn.Linear(d_model, d_model)
        self.out_proj = nn.Linear(d_model, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, length, width = x.shape
        shape = (batch, length, self.heads, width // self.heads)
        q = self.q_proj(x).view(shape).transpose(1, 2)
        k = self.k_proj(x).view(shape).transpose(1, 2)
        v = self.v_proj(x).view(shape).transpose(1, 2)
        # Scale 1/sqrt(head_dim), no mask (Whisper's encoder attends over the whole window).
        out = F.scaled_dot_product_attention(q, k, v)
        return self.out_proj(out.transpose(1, 2).reshape(batch, length, width))


class WhisperEncoderLayer(nn.Module):
    """Pre-LayerNorm transformer layer: x + attn(ln(x)), then x + fc2(gelu(fc1(ln(x))))."""

    def __init__(self, d_model: int, heads: int, ffn_dim: int) -> None:
        super().__init__()
        self.self_attn = WhisperAttention(d_model, heads)
        self.self_attn_layer_norm = nn.LayerNorm(d_model)
        self.fc1 = nn.Linear(d_model, ffn_dim)
        self.fc2 = nn.Linear(ffn_dim, d_model)
        self.final_layer_norm = nn.LayerNorm(d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn(self.self_attn_layer_norm(x))
        x = x + self.fc2(F.gelu(self.fc1(self.final_layer_norm(x))))
        if x.dtype == torch.float16:
            # transformers clamps here in half precision so that an overflow stays finite.
            limit = torch.finfo(torch.float16).max - 1000
            x = x.clamp(-limit, limit)
        return x


class WhisperEncoder(nn.Module):
    """whisper's encoder, returning all hidden states stacked: (B, mel, 2P) -> (B, P, layers + 1, d).

    P is `max_source_positions` (1500 for 30 s): the input is the 30 s log-mel window upstream feeds
    (transformers refuses any other length). A shorter even length 2p also runs here, with the first p
    positional embeddings: not upstream's numbers (attention then spans less than 30 s), but a bounded
    window for a live approximation to choose deliberately.
    """

    def __init__(self, config: WhisperEncoderConfig | None = None) -> None:
        super().__init__()
        self.config = config = config if config is not None else WhisperEncoderConfig()
        self.conv1 = nn.Conv1d(config.num_mel_bins, config.d_model, kernel_size=3, padding=1)
        self.conv2 = nn.Conv1d(config.d_model, config.d_model, kernel_size=3, stride=2, padding=1)
        self.embed_positions = nn.Embedding(config.max_source_positions, config.d_model)
        self.layers = nn.ModuleList(
            WhisperEncoderLayer(config.d_model, config.encoder_attention_heads, config.encoder_ffn_dim)
            for _ in range(config.encoder_layers)
        )
        self.layer_norm = nn.LayerNorm(config.d_model)

    def forward(self, input_features: torch.Tensor) -> torch.Tensor:
        """(B, 80, 3000) log-mel (`services.media.whisper_mel`) -> (B, 1500, 5, 384): the stem's output
        plus positions, the outputs of layers 1..n-1, and the final LayerNorm of layer n's output."""
        frames = input_features.shape[-1]
        positions = self.config.max_source_positions
        if frames % 2 or not 0 < frames <= 2 * positions:
            raise ValueError(
                f"whisper input must have an even number of mel frames up to {2 * positions}, got {frames}"
            )
        x = F.gelu(self.conv1(input_features))
        x = F.gelu(self.conv2(x)).transpose(1, 2)
        x = x + self.embed_positions.weight[: x.shape[1]]
        states = [x]
        for i, layer in enumerate(self.layers):
            x = layer(x)
            states.append(self.layer_norm(x) if i == len(self.layers) - 1 else x)
        return torch.stack(states, dim=2)


def encoder_state_dict(state_dict: Mapping[str, torch.Tensor], source: str) -> dict[str, torch.Tensor]:
    """The encoder's weights of an HF whisper checkpoint, prefix removed; the decoder's dropped.

    Raises:
        CheckpointError: keys that belong to neither (named), or no encoder keys at all.
    """
    encoder: dict[str, torch.Tensor] = {}
    stray: list[str] = []
    for key, value in state_dict.items():
        prefix = next((p for p in _ENCODER_PREFIXES if key.startswith(p)), None)
        if prefix is not None:
            encoder[key[len(prefix) :]] = value
        elif not key.startswith(_IGNORED_PREFIXES):
            stray.append(key)
    if stray:
        shown = ", ".join(stray[:10]) + (f", ... ({len(stray)} in all)" if len(stray) > 10 else "")
        raise CheckpointError(f"checkpoint {source} does not fit WhisperEncoder: unexpected keys: {shown}")
    if not encoder:
        raise CheckpointError(f"checkpoint {source} has no whisper encoder keys (model.encoder.*)")
    return encoder


def load_whisper_encoder(folder: str | Path) -> WhisperEncoder:
    """The encoder from an HF whisper folder (`config.json` + `model.safetensors` or `pytorch_model.bin`
    of `WhisperForConditionalGeneration`: `model.encoder.*` used, `model.decoder.*` ignored), eval mode.

    Raises:
        CheckpointError: a file missing or unreadable, or encoder keys missing, unexpected or mis-shaped.
    """
    folder = Path(folder)
    config = WhisperEncoderConfig.from_hf(read_json_config(folder / "config.json"))
    weights = weights_in(folder, WHISPER_WEIGHT_FILES)
    model = WhisperEncoder(config)
    load_strict(model, encoder_state_dict(read_state_dict_file(weights), str(weights)), source=str(weights))
    return model.eval()


def feature_length(num_samples: int, sample_rate: int = 16000) -> int:
    """Encoder positions that cover a clip: upstream's trim floor(seconds * 50), computed as upstream."""
    return math.floor((num_samples / sample_rate) * AUDIO_FPS)


def _padding(fps: float) -> tuple[int, int]:
    """Zero positions upstream puts before and after the features: 2 and 6 times ceil(50 / fps)."""
    step = math.ceil(AUDIO_FPS / fps)
    return 2 * step, 6 * step


def window_starts(n_frames: int, fps: float) -> np.ndarray:
    """Where frame i's ten positions start in the zero-padded sequence: floor(i * 50 / fps).

    At 25 fps that is 2i, with 4 padding positions in front: frame i hears positions [2i - 4, 2i + 6) of
    the clip, 80 ms before its start to 80 ms after its end.
    """
    multiplier = AUDIO_FPS / fps  # computed first, as upstream does, so the products round alike
    return np.floor(np.arange(n_frames, dtype=np.float64) * multiplier).astype(np.int64)


def whisper_chunks(hidden: torch.Tensor, n_frames: int, fps: float) -> torch.Tensor:
    """Each video frame's audio tokens: (T, 5, 384) encoder states -> (n_frames, 50, 384), time-major.

    Upstream's rule (`get_whisper_chunk`): the states, trimmed to the clip (`feature_length`), get
    2 * ceil(50 / fps) zero positions in front and 6 * ceil(50 / fps) behind (4 and 12 at 25 fps);
    frame i takes the ten positions from floor(i * 50 / fps) of that padded sequence (at 25 fps
    [2i, 2i + 10)), and its 10 x 5 states are flattened position by position (token 5t + s is state s
    of position t). Two deliberate differences, both where upstream has no answer or a defect:
    upstream truncates fps to an integer first (29.97 fps would run 3 % fast against the audio); here
    the exact rate is used, which is the same for every integer rate. And where `n_frames` reaches past
    the padded sequence (upstream stops with an error), further zeros are read.

    Args:
        hidden: (T, 5, d) encoder states of the clip, any device and dtype.
        n_frames: frames to produce.
        fps: the video's frame rate.
    """
    if fps <= 0:
        raise ValueError(f"fps must be positive, got {fps}")
    if hidden.dim() != 3:
        raise ValueError(f"hidden must be (T, states, width), got {tuple(hidden.shape)}")
    left, right = _padding(fps)
    starts = window_starts(n_frames, fps)
    needed = int(starts[-1]) + WINDOW if n_frames else 0
    right = max(right, needed - left - hidden.shape[0])
    zeros = hidden.new_zeros
    padded = torch.cat([zeros((left, *hidden.shape[1:])), hidden, zeros((right, *hidden.shape[1:]))])
    index = torch.from_numpy(starts[:, None] + np.arange(WINDOW)).to(hidden.device)
    windows = padded[index]  # (n_frames, 10, 5, d)
    return windows.reshape(n_frames, WINDOW * hidden.shape[1], hidden.shape[2])


@functools.lru_cache(maxsize=8)
def _positional_table(length: int, width: int, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """Sinusoidal table (length, width) computed in float32 on the CPU as MuseTalk's `PositionalEncoding`
    does, then cast to `dtype` on `device` (cached: a serving stage asks for the same one every batch)."""
    position = torch.arange(0, length, dtype=torch.float).unsqueeze(1)
    div_term = torch.exp(torch.arange(0, width, 2).float() * (-math.log(10000.0) / width))
    table = torch.zeros(length, width)
    table[:, 0::2] = torch.sin(position * div_term)
    table[:, 1::2] = torch.cos(position * div_term)
    return table.to(device=device, dtype=dtype)


def positional_table(length: int = 50, width: int = 384) -> torch.Tensor:
    """MuseTalk's sinusoidal table (length, width), float32 on the CPU, a fresh tensor: what a module
    keeps as a buffer so that its backend casts and moves it once (`positional_encoding` without the
    per-call lookup, which torch.compile would trace into the graph as CPU work and a copy)."""
    return _positional_table(length, width, torch.device("cpu"), torch.float32).clone()


def positional_encoding(tokens: torch.Tensor) -> torch.Tensor:
    """tokens (B, L, d) + MuseTalk's sinusoidal encoding of positions 0..L-1 (sin on even, cos on odd
    channels, wavelengths up to 10000 * 2 pi); the table is cast to the tokens' dtype before the sum, as
    upstream's `pe.half()` does in half precision."""
    return tokens + _positional_table(tokens.shape[-2], tokens.shape[-1], tokens.device, tokens.dtype)
