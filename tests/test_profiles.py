"""Task profiles and the mean/scale fused into the model (SPEC §6.1)."""

import numpy as np
import pytest

from saigeedged.profiles import IMAGENET_MEAN, IMAGENET_STD, PROFILES, mean_scale


def test_div255_profile() -> None:
    """Detection and mlc divide by 255 only."""
    for task in ("detection", "mlc"):
        assert mean_scale(PROFILES[task]) == ([0.0, 0.0, 0.0], [1 / 255] * 3)


def test_imagenet_profile_matches_spec_values() -> None:
    """reid fuses mean*255 and 1/(std*255)."""
    mean, scale = mean_scale(PROFILES["reid"])
    assert mean == pytest.approx([123.675, 116.28, 103.53])
    assert scale == pytest.approx([0.017125, 0.017507, 0.017429], abs=1e-6)


def test_fused_equals_host_normalisation() -> None:
    """(x - mean) * scale on raw uint8 equals (x/255 - host_mean) / host_std."""
    x = np.arange(256, dtype=np.float64)[:, None].repeat(3, 1)
    mean, scale = mean_scale(PROFILES["reid"])
    fused = (x - np.array(mean)) * np.array(scale)
    host = (x / 255 - np.array(IMAGENET_MEAN)) / np.array(IMAGENET_STD)
    assert np.allclose(fused, host, atol=1e-5)
