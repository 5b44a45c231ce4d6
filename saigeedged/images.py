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
        rgb = img.convert("RGB")
    if not letterbox:
        return np.asarray(rgb.resize((width, height), Image.Resampling.BILINEAR), dtype=np.uint8)
    ratio = min(height / rgb.height, width / rgb.width)
    new_w, new_h = max(1, round(rgb.width * ratio)), max(1, round(rgb.height * ratio))
    canvas = np.full((height, width, 3), 114, dtype=np.uint8)
    canvas[:new_h, :new_w] = np.asarray(rgb.resize((new_w, new_h), Image.Resampling.BILINEAR), dtype=np.uint8)
    return canvas


def normalized(hwc: NDArray[np.uint8], mean: tuple[float, ...], std: tuple[float, ...]) -> NDArray[np.float32]:
    """(x/255 - mean) / std as float32 HWC (the host-side profile normalisation)."""
    x = hwc.astype(np.float32) / 255.0
    return ((x - np.asarray(mean, np.float32)) / np.asarray(std, np.float32)).astype(np.float32)
