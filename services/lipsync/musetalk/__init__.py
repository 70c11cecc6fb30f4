"""The 256 px tier's networks in the MuseTalk 1.5 format, each loading its public checkpoint as it is.

`load_unet` (musetalkV15/unet.pth + musetalk.json), `load_vae` (the diffusers folder sd-vae/),
`load_whisper_encoder` (the HF whisper-tiny folder), `load_face_parser` (BiSeNet 79999_iter.pth), and
the pure functions between them: `whisper_log_mel` (numpy; it lives in `services.media.whisper_mel`,
since the torch-free audio stage and live worker compute it), `whisper_chunks` and
`positional_encoding`. docs/architecture.md ("The 256 px tier's networks") gives the checkpoint layout
and the shapes; a file that does not fit fails with CheckpointError naming its keys.
"""

from services.lipsync.musetalk.face_parser import load_face_parser
from services.lipsync.musetalk.unet import load_unet
from services.lipsync.musetalk.vae import VAE_SCALING_FACTOR, load_vae
from services.lipsync.musetalk.whisper import load_whisper_encoder, positional_encoding, whisper_chunks
from services.media.whisper_mel import whisper_log_mel

__all__ = [
    "VAE_SCALING_FACTOR",
    "load_face_parser",
    "load_unet",
    "load_vae",
    "load_whisper_encoder",
    "positional_encoding",
    "whisper_chunks",
    "whisper_log_mel",
]
