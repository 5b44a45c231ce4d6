"""The activation ranges of a static quantization (SPEC §6c, §17) in one streaming pass: an onnxruntime session of
the float model that exposes, for each tensor onnxruntime's MinMax calibration would calibrate, only its ReduceMin
and ReduceMax (two floats an image, never the activation), over images already decoded. The per-image values are
combined as onnxruntime's MinMaxCalibrater combines them (nanmin/nanmax, or nanmean with CalibMovingAverage), so
the ranges are onnxruntime's own; they are written in its calibration cache format (calibrate.save_tensors_data)
and quantize_static then quantizes from that file without a calibration pass of its own."""

from __future__ import annotations

import itertools
import warnings
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from numpy.typing import NDArray
from onnx import TensorProto, helper

from saigeedged.errors import SaigeError

CALIBRATED_TYPES = (TensorProto.FLOAT, TensorProto.FLOAT16)


def calibrated(model: onnx.ModelProto) -> list[str]:
    """The tensors onnxruntime's calibrators select (CalibraterBase.select_tensors_to_calibrate with every op type):
    float inputs and outputs of any node that have a type in the shape-inferred model, initializers excepted."""
    infos = {vi.name: vi for vi in model.graph.value_info}
    infos.update({o.name: o for o in model.graph.output})
    infos.update({i.name: i for i in model.graph.input})
    constants = {t.name for t in model.graph.initializer}
    found: dict[str, None] = {}
    for node in model.graph.node:
        for name in itertools.chain(node.input, node.output):
            vi = infos.get(name)
            if vi is not None and vi.type.HasField("tensor_type") and name not in constants \
                    and vi.type.tensor_type.elem_type in CALIBRATED_TYPES:
                found[name] = None
    return sorted(found)


def probe(model: onnx.ModelProto, names: list[str]) -> bytes:
    """The model with a ReduceMin and a ReduceMax (keepdims, like onnxruntime's) of each named tensor as its only
    outputs."""
    graph = model.graph
    del graph.output[:]
    for name in names:
        for op in ("ReduceMin", "ReduceMax"):
            out = f"{name}__saige_{op}"
            graph.node.append(helper.make_node(op, [name], [out], keepdims=1, name=out))
            graph.output.append(helper.make_tensor_value_info(out, TensorProto.FLOAT, None))
    blob: bytes = model.SerializeToString()
    return blob


def collect(float_path: Path, input_name: str, batches: Iterable[NDArray[np.uint8]], moving_average: bool) -> Any:
    """onnxruntime's MinMax TensorsData of the model over the images, one session run an image."""
    import onnxruntime as ort
    from onnxruntime.quantization.calibrate import CalibrationMethod, TensorsData
    from onnxruntime.quantization.quant_utils import load_model_with_shape_infer

    model = load_model_with_shape_infer(Path(float_path))
    names = calibrated(model)
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(probe(model, names), opts, providers=["CPUExecutionProvider"])
    lows: list[list[NDArray[np.float32]]] = [[] for _ in names]
    highs: list[list[NDArray[np.float32]]] = [[] for _ in names]
    for batch in batches:
        values = sess.run(None, {input_name: batch})
        for i in range(len(names)):
            lows[i].append(values[2 * i].reshape(-1))
            highs[i].append(values[2 * i + 1].reshape(-1))
    if not lows or not lows[0]:
        raise ValueError("no calibration image")
    low, high = (np.nanmean, np.nanmean) if moving_average else (np.nanmin, np.nanmax)
    with warnings.catch_warnings():  # an all-NaN tensor ("Mean of empty slice") is said by undefined()
        warnings.simplefilter("ignore", RuntimeWarning)
        pairs = {n: (low(lo, axis=0), high(hi, axis=0)) for n, lo, hi in zip(names, lows, highs, strict=True)}
    # NaN only: an infinite range (a -inf mask before a Softmax) quantizes as onnxruntime's own calibration does it
    undefined([n for n, (lo, hi) in pairs.items() if np.any(np.isnan(lo)) or np.any(np.isnan(hi))])
    return TensorsData(CalibrationMethod.MinMax, pairs)


def undefined(tensors: list[str], why: str = "") -> None:
    """ONNX_INVALID when the float model computes NaN where calibration needs a range (onnxruntime's quantizer failed
    `AssertionError: scale issue`, an INTERNAL)."""
    if tensors or why:
        named = f" in {', '.join(tensors[:5])}" + (f" and {len(tensors) - 5} more" if len(tensors) > 5 else "")
        # onnxruntime's histogram calibrators (`why`: Entropy, Percentile) fail on an infinity too, MinMax only on NaN
        what = named if tensors else ", or an infinite one,"
        raise SaigeError("ONNX_INVALID", f"the float model computes no number (NaN){what}"
                         f" on the calibration images, so it has no range to quantize{why}",
                         hint="a Log, Sqrt, division or Pow of values outside its domain: fix the model there (a "
                         "clamp before it), or check that the images are what the model was trained on")


def save(data: Any, path: Path) -> None:
    from onnxruntime.quantization.calibrate import save_tensors_data

    save_tensors_data(data, path)


def load(path: Path) -> Any:
    from onnxruntime.quantization.calibrate import load_tensors_data

    return load_tensors_data(path)


