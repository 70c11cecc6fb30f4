"""Avatar preparation for the musetalk tier (PrepareAvatar), per frame, as upstream MuseTalk 1.5's
realtime preparation does (the reference's sections 1-3 and 6; docs/architecture.md section 12):

1. face or not: the face detector (OpenCV's Haar cascade, as the Wav2Lip stage's); a frame without a
   face passes through (nothing else is made for it);
2. the box: with a DWPose checkpoint, MuseTalk's box of the 68 landmarks (`musetalk_box`: centred on
   landmark 29, chin + 10 px), else, or where the landmarks give no usable box, the detector's box by
   `box_from_face_detection` (services/lipsync/musetalk/dwpose.py has both rules);
3. the crop at the box, resized to 256 x 256 with Lanczos (cv2.INTER_LANCZOS4), RGB / 255 -> [-1, 1];
   a copy with rows 128-255 zeroed (-1 after the normalisation); the VAE encodes both and keeps the
   mean (deterministic; upstream samples) x 0.18215: latents [8, 32, 32] = [masked | reference];
4. the alpha mask over the 1.5x square (services/lipsync/musetalk/masks.py): BiSeNet's "jaw" parsing
   of the square resized to 512 x 512 where a face parser is configured, else a lower-face ellipse;
   stored resized to 256 x 256;
5. for the covered-mouth check (services/lipsync/occlusion.py, judged over the whole avatar once its
   frames end: the service), the frame's `lower_face_features` at the detector's box padded as the
   Wav2Lip tier pads it (`pad_box`; the check's bands are fractions of that box, whichever box step 2
   took), unsmoothed: the features are blurred and shrunk, so a pixel of box jitter hardly shows.
The networks run on the stage's device in its precision, a message's frames in one batch.
"""

from __future__ import annotations

import copy
import dataclasses
import threading
from typing import cast

import cv2
import numpy as np
import torch
from torch import nn

from lipline.v1 import common_pb2
from services.lipsync.faces import DEFAULT_PADS, HaarFaceDetector, pad_box
from services.lipsync.musetalk.dwpose import box_from_face_detection, face_landmarks, musetalk_box
from services.lipsync.musetalk.masks import PARSE_SIZE, ellipse_mask, finish_mask, jaw_mask, mask_box, square_crop
from services.lipsync.musetalk.standin import LATENT_SCALE, LatentCodec
from services.lipsync.occlusion import lower_face_features
from services.media.crops import Box
from services.media.musetalk_wire import FACE_SIZE, MASK_SHAPE

__all__ = ["AvatarPreparer", "PreparedFace"]

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


@dataclasses.dataclass(frozen=True)
class PreparedFace:
    """One frame with a face: its box, latents [8, 32, 32] float16, mask square and 256 x 256 alpha, and
    its lower face as the covered-mouth check reads it (step 5; kept by the stream, never sent)."""

    box: Box
    latents: np.ndarray
    mask_box: Box
    mask: np.ndarray
    lower_face: np.ndarray


class AvatarPreparer:
    """Prepares frames on `device` (thread-safe: one batch at a time on the device).

    Args:
        vae: a module with `encode(x [B, 3, 256, 256] in [-1, 1]) -> (mean, logvar)` (copied here).
        vae_name: what made the latents ("sd-vae", "musetalk-standin").
        face_parser: BiSeNet ((B, 3, H, W) normalised RGB -> (B, 19, H, W)), or None: ellipses.
        landmarker: DWPose (services.lipsync.musetalk.dwpose.load_landmarker), or None: detector boxes.
    """

    def __init__(
        self,
        device: torch.device,
        dtype: torch.dtype,
        vae: nn.Module,
        vae_name: str,
        face_parser: nn.Module | None = None,
        landmarker: nn.Module | None = None,
    ) -> None:
        self.device, self.dtype = device, dtype
        self.vae = copy.deepcopy(vae).to(device=device, dtype=dtype).eval()
        self.face_parser = (
            None if face_parser is None else copy.deepcopy(face_parser).to(device=device, dtype=dtype).eval()
        )
        self.landmarker = landmarker
        self.detector = HaarFaceDetector()
        self.box_source = "dwpose" if landmarker is not None else "face-detector"
        parts = (self.box_source, vae_name, "bisenet" if face_parser is not None else "ellipse")
        precision = {torch.float16: "fp16", torch.bfloat16: "bf16"}.get(dtype, "fp32")
        self.model_info = common_pb2.ModelInfo(name="+".join(parts), backend=device.type, precision=precision)
        self._lock = threading.Lock()

    def face_boxes(self, frame: np.ndarray) -> tuple[Box, Box] | None:
        """The frame's MuseTalk box (steps 1-2 of the module docstring) and the detector's box padded as
        the Wav2Lip tier pads it (step 5); None without a face."""
        detected = self.detector.detect([frame])[0]
        if detected is None:
            return None
        height, width = frame.shape[:2]
        box = None
        if self.landmarker is not None:
            landmarks = face_landmarks(self.landmarker, frame)
            box = musetalk_box(landmarks, height, frame_w=width)
        if box is None:
            box = box_from_face_detection(detected, height)
        if box is None:
            return None
        x1, y1, x2, y2 = (int(v) for v in box)
        x1, y1, x2, y2 = max(0, x1), max(0, y1), min(width, x2), min(height, y2)
        if x2 - x1 < 8 or y2 - y1 < 8:
            return None
        return (x1, y1, x2, y2), pad_box(detected, DEFAULT_PADS, height=height, width=width)

    @torch.inference_mode()
    def prepare(self, frames: list[np.ndarray]) -> list[PreparedFace | None]:
        """Each BGR uint8 frame's preparation, None where it has no face (it passes through)."""
        with self._lock:
            found_boxes = [self.face_boxes(frame) for frame in frames]
            boxes = [None if b is None else b[0] for b in found_boxes]
            found = [i for i, b in enumerate(boxes) if b is not None]
            if not found:
                return [None] * len(frames)
            crops = [self._crop(frames[i], boxes[i]) for i in found]  # type: ignore[arg-type]
            latents = self._latents(np.stack(crops))
            squares = [mask_box(boxes[i]) for i in found]  # type: ignore[arg-type]
            raw = self._parse([square_crop(frames[i], sq) for i, sq in zip(found, squares)], found, boxes, squares)
            out: list[PreparedFace | None] = [None] * len(frames)
            for k, i in enumerate(found):
                pair = found_boxes[i]
                assert pair is not None
                box, padded = pair
                square = squares[k]
                alpha = finish_mask(raw[k], box, square)
                small = cv2.resize(alpha, MASK_SHAPE[::-1], interpolation=cv2.INTER_AREA)
                out[i] = PreparedFace(box, latents[k], square, small, lower_face_features(frames[i], padded))
            return out

    @staticmethod
    def _crop(frame: np.ndarray, box: Box) -> np.ndarray:
        x1, y1, x2, y2 = box
        return cv2.resize(frame[y1:y2, x1:x2], (FACE_SIZE, FACE_SIZE), interpolation=cv2.INTER_LANCZOS4)

    def _latents(self, crops: np.ndarray) -> np.ndarray:
        """(n, 256, 256, 3) BGR uint8 -> (n, 8, 32, 32) float16: [masked | reference] means x 0.18215."""
        rgb = torch.from_numpy(np.ascontiguousarray(crops[..., ::-1])).to(self.device)
        x = (rgb.permute(0, 3, 1, 2).float() / 255.0 - 0.5) / 0.5
        masked = x.clone()
        masked[:, :, FACE_SIZE // 2 :] = -1.0  # upstream zeroes the lower half before normalising
        mean, _ = cast(LatentCodec, self.vae).encode(torch.cat((masked, x)).to(self.dtype))
        n = len(crops)
        latents = torch.cat((mean[:n], mean[n:]), dim=1).float() * LATENT_SCALE
        return latents.cpu().numpy().astype(np.float16)

    def _parse(
        self, squares_px: list[np.ndarray], found: list[int], boxes: list[Box | None], squares: list[Box]
    ) -> list[np.ndarray]:
        """0/255 masks over each square: BiSeNet's jaw mask at the square's size, or the ellipse."""
        if self.face_parser is None:
            return [ellipse_mask(boxes[i], sq) for i, sq in zip(found, squares)]  # type: ignore[arg-type]
        size = (PARSE_SIZE, PARSE_SIZE)
        batch = np.stack([cv2.resize(s[..., ::-1], size, interpolation=cv2.INTER_LINEAR) for s in squares_px])
        x = torch.from_numpy(np.ascontiguousarray(batch)).to(self.device).permute(0, 3, 1, 2).float() / 255.0
        mean = torch.tensor(IMAGENET_MEAN, device=self.device).view(1, 3, 1, 1)
        std = torch.tensor(IMAGENET_STD, device=self.device).view(1, 3, 1, 1)
        parsing = self.face_parser(((x - mean) / std).to(self.dtype)).argmax(1).cpu().numpy()
        masks = []
        for labels, square in zip(parsing, squares_px):
            mask = jaw_mask(labels)
            masks.append(cv2.resize(mask, (square.shape[1], square.shape[0]), interpolation=cv2.INTER_CUBIC))
        return masks
