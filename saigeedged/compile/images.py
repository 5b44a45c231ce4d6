"""Host-side image preprocessing for calibration tensors: letterbox (detection, pad 114) or resize."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from numpy.typing import NDArray
from PIL import Image


def load_rgb(path: Path, size: tuple[int, int], letterbox: bool) -> NDArray[np.uint8]:
    """The image as uint8 HWC RGB at (H, W): letterboxed with pad 114, or plainly resized."""
    height, width = size
    with Image.open(path) as img:
        rgb = to_rgb(img)
    if not letterbox:
        return np.asarray(rgb.resize((width, height), Image.Resampling.BILINEAR), dtype=np.uint8)
    ratio = min(height / rgb.height, width / rgb.width)
    new_w, new_h = max(1, round(rgb.width * ratio)), max(1, round(rgb.height * ratio))
    canvas = np.full((height, width, 3), 114, dtype=np.uint8)
    canvas[:new_h, :new_w] = np.asarray(rgb.resize((new_w, new_h), Image.Resampling.BILINEAR), dtype=np.uint8)
    return canvas


def to_rgb(img: Image.Image) -> Image.Image:
    """8-bit RGB; 16/32-bit grey is scaled down to 8 bits (Pillow's convert clips it: everything above 255 went white).

    `I;16` is 16-bit by definition; plain `I` (32-bit) says nothing of the range, so its brightest pixel decides.
    """
    if img.mode.startswith("I"):
        grey = np.asarray(img).astype(np.int64).clip(0)
        peak = 0xFFFF if img.mode.startswith("I;16") else int(grey.max()) if grey.size else 0
        shift = 0 if peak <= 0xFF else 8 if peak <= 0xFFFF else 24
        img = Image.fromarray((grey >> shift).astype(np.uint8), "L")
    elif img.mode == "F":
        img = Image.fromarray(np.clip(np.asarray(img), 0, 255).astype(np.uint8), "L")
    return img.convert("RGB")


def normalized(hwc: NDArray[np.uint8], mean: tuple[float, ...], std: tuple[float, ...]) -> NDArray[np.float32]:
    """(x/255 - mean) / std as float32 HWC (the host-side profile normalisation)."""
    x = hwc.astype(np.float32) / 255.0
    return ((x - np.asarray(mean, np.float32)) / np.asarray(std, np.float32)).astype(np.float32)
