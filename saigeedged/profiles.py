"""Task profiles (SPEC §4), platforms (SPEC §6) and the mean/scale fused into the model (SPEC §6.1)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


@dataclass(frozen=True)
class TaskProfile:
    """Defaults of one task: input size, host-side normalisation, postprocess and calibration sampler."""

    input_size: tuple[int, int] | None  # None: read from the ONNX input
    normalize: bool  # False: div255 only
    mean: tuple[float, float, float]
    std: tuple[float, float, float]
    postprocess: dict[str, Any]
    sampler: str  # "balanced" | "uniform"
    letterbox: bool
    bundle_task: str
    mobilint_preset: str
    input_channels: str  # "rgb" | "bgr": the channel order the model was trained on (SPEC §14)


PROFILES: dict[str, TaskProfile] = {
    "detection": TaskProfile(None, False, (0.0, 0.0, 0.0), (1.0, 1.0, 1.0),
                             {"conf_threshold": 0.25, "iou_threshold": 0.45}, "balanced", True,
                             "detection_yolox", "detection", "bgr"),  # YOLOX trains on OpenCV (BGR) images
    "mlc": TaskProfile((224, 224), False, (0.0, 0.0, 0.0), (1.0, 1.0, 1.0),
                       {"threshold": 50.0}, "uniform", False, "mlc", "classification", "rgb"),
    "reid": TaskProfile((256, 128), True, IMAGENET_MEAN, IMAGENET_STD, {}, "uniform", False,
                        "reid", "classification", "rgb"),
}

# platform -> the --optimize target spellings to look for in the image, in order of preference. Public sources
# disagree on `_PLUS_` (notes/pegasus.md "Wave 3 facts": Allwinner's pegasus_setup.sh v3 spells _PLUS_, three
# board-verified A733 ports used the non-_PLUS_ .config their ubuntu-npu:v2.0.10.x image ships), so the cubie backend
# passes the first one whose `<name>.config` the image's VIV SDK has (compile/vivsdk.py).
TARGET_CANDIDATES: dict[str, tuple[str, ...]] = {
    "a733": ("VIP9000NANODI_PLUS_PID0X1000003B", "VIP9000NANODI_PID0X1000003B"),
    "t527": ("VIP9000NANOSI_PLUS_PID0X10000016", "VIP9000NANOSI_PID0X10000016"),
    "a527": ("VIP9000NANOSI_PLUS_PID0X10000016", "VIP9000NANOSI_PID0X10000016"),
    "v853": ("VIP9000PICO_PID0XEE",),
}
CHIP_IDS: dict[str, int] = {"a733": 0x1000003B, "t527": 0x10000016, "a527": 0x10000016, "v853": 0xEE}

# platform -> (preferred --optimize target string, NBG chip id)
PLATFORMS: dict[str, tuple[str, int]] = {name: (TARGET_CANDIDATES[name][0], chip) for name, chip in CHIP_IDS.items()}

CHANNEL_ORDERS = ("rgb", "bgr")

MOBILINT_DEVICES = ("aries-rb", "regulus-ra", "regulus-rb", "regulus-rb-usb")

DETECTION_HEADS = ("/head/Concat_output_0", "/head/Concat_1_output_0", "/head/Concat_2_output_0")


def mean_scale(profile: TaskProfile) -> tuple[list[float], list[float]]:
    """Mean and scale on the raw uint8 scale such that (x - mean) * scale == (x/255 - host_mean) / host_std."""
    if not profile.normalize:
        return [0.0, 0.0, 0.0], [1.0 / 255.0] * 3
    mean = [round(m * 255.0, 6) for m in profile.mean]
    scale = [1.0 / (s * 255.0) for s in profile.std]
    return mean, scale
