"""The activation ranges of the host quantization and the emulation (ranges.collect) are onnxruntime's own: its
MinMaxCalibrater run here on the same images gives the same float32 arrays bit for bit, and quantize_static with its
own calibration the same QDQ model, for the moving average (ema) and the plain min/max."""

from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from factory import yolox
from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType, quantize_static
from onnxruntime.quantization.calibrate import create_calibrator
from onnxruntime.quantization.quant_utils import load_model_with_shape_infer

from saigeedged.compile import ranges
from saigeedged.compile.backends import host


def _wrapped(tmp_path: Path) -> tuple[Path, list[np.ndarray]]:
    """A small detector wrapped to take uint8 NHWC like the bundle's, and 5 noise images."""
    src = yolox(tmp_path / "det.onnx", size=(64, 64))
    wrapped = tmp_path / "det.uint8.onnx"
    host.wrap_job(src, wrapped, "images", (64, 64), [0.0, 0.0, 0.0], [1 / 255] * 3, True)
    rng = np.random.default_rng(7)
    return wrapped, [rng.integers(0, 256, (1, 64, 64, 3), dtype=np.uint8) for _ in range(5)]


@pytest.mark.parametrize("method", ["ema", "minmax"])
def test_ranges_are_onnxruntimes_calibration(tmp_path: Path, method: str) -> None:
    """ranges.collect gives the tensors, float32 arrays and values onnxruntime's MinMaxCalibrater gives."""
    wrapped, batches = _wrapped(tmp_path)
    moving = host.METHODS[method][1]
    mine = ranges.collect(wrapped, "images", iter(batches), moving).data
    shaped = tmp_path / "shaped.onnx"
    onnx.save(load_model_with_shape_infer(wrapped), str(shaped))
    calibrator = create_calibrator(shaped, None, augmented_model_path=str(tmp_path / "augmented.onnx"),
                                   calibrate_method=CalibrationMethod.MinMax, extra_options={"moving_average": moving})
    calibrator.collect_data(host._Reader("images", batches))
    theirs = calibrator.compute_data().data
    assert sorted(mine) == sorted(theirs) and len(mine) > 30
    for name, data in theirs.items():
        for got, want in zip(mine[name].range_value, data.range_value, strict=True):
            assert got.dtype == want.dtype and got.shape == want.shape and np.array_equal(got, want), name


@pytest.mark.parametrize("method", ["ema", "minmax"])
def test_quantized_model_is_quantize_statics_own(tmp_path: Path, method: str) -> None:
    """host.quantize from those ranges writes the QDQ graph quantize_static writes with its own calibration."""
    wrapped, batches = _wrapped(tmp_path)
    host.quantize(wrapped, tmp_path / "new.onnx", "images", iter(batches), method)
    assert host.ranges_path(tmp_path / "new.onnx").is_file()
    calib, moving = host.METHODS[method]
    quantize_static(str(wrapped), str(tmp_path / "old.onnx"), host._Reader("images", batches), quant_format=QuantFormat.QDQ,
                    activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8,
                    calibrate_method=getattr(CalibrationMethod, calib), extra_options={"CalibMovingAverage": moving})
    new, old = (onnx.load(str(tmp_path / f"{n}.onnx")) for n in ("new", "old"))
    assert new.graph.SerializeToString() == old.graph.SerializeToString()


def test_a_histogram_calibration_prints_nothing(tmp_path: Path, capfd: Any) -> None:
    """`calibration_method: kl` (onnxruntime's Entropy calibrator) quantizes without onnxruntime's progress lines on
    stdout ("Collecting tensor data and making histogram ..."): they were in `saigeedged compile`'s own output."""
    wrapped, batches = _wrapped(tmp_path)
    host.quantize(wrapped, tmp_path / "kl.onnx", "images", iter(batches), "kl")
    assert (tmp_path / "kl.onnx").is_file()
    assert capfd.readouterr().out == ""
