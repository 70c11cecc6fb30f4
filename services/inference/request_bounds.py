"""Bounds on one request message of a model stage (lipsync Generate, superres Upscale), checked at
the edge before it costs anything.

Why: every field of an item was checked (image sizes, paste sizes, mel windows), but not how many
items one message holds nor what they add up to. A 64 MiB Generate message holds ~26,000 items: one
chunk of the shared batcher, ~5.7 GB of float32 model inputs; a message of tiny Upscale items each
asking for 2048 x 2048 px asks for terabytes. Callers send ~10 items a message (services/render).

- items per message: at most the stage's `max_pending_per_stream` (items one stream may have in
  flight): a message larger than the stream's whole budget defeats its back-pressure.
- output bytes per message (BGR24 faces at their return sizes): at most MAX_OUTPUT_BYTES_PER_MESSAGE,
  20 faces at 2048 x 2048 (the largest side any stage returns).
"""

from __future__ import annotations

from collections.abc import Iterable

from services.serving.errors import InvalidRequest

MiB = 1 << 20
MAX_OUTPUT_BYTES_PER_MESSAGE = 256 * MiB


def check_items_per_message(count: int, max_pending_per_stream: int, what: str = "items") -> None:
    """INVALID_ARGUMENT when one message carries more items than the stream may have in flight."""
    if count > max_pending_per_stream:
        raise InvalidRequest(
            f"{what}: {count} in one message; at most {max_pending_per_stream} (the stage's max_pending_per_stream): send them over several messages"
        )


def check_output_bytes(sizes: Iterable[tuple[int, int]], what: str = "items") -> None:
    """INVALID_ARGUMENT when the (width, height) faces one message asks for exceed the output budget."""
    total = sum(int(w) * int(h) * 3 for w, h in sizes)
    if total > MAX_OUTPUT_BYTES_PER_MESSAGE:
        raise InvalidRequest(
            f"{what}: the images one message asks for take {total} bytes (width x height x 3 each); at most "
            f"{MAX_OUTPUT_BYTES_PER_MESSAGE} ({MAX_OUTPUT_BYTES_PER_MESSAGE // MiB} MiB): send fewer items per message"
        )
