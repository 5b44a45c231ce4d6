"""The host target (SPEC §6c): uint8 NHWC wrapper, onnxruntime static INT8 (QDQ), float-vs-INT8 report.

The daemon imports this module to plan and run a job's steps; their work runs in child processes (compile.child),
whose fork server has numpy, onnx and onnxruntime loaded. So those are imported in the functions that use them, never
at the top: the daemon itself never loads them (0.2 s of CPU and 30 MB a daemon, for nothing).
"""

from __future__ import annotations

import contextlib
import io
import logging
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from saigeedged.accuracytable import figure, nulled
from saigeedged.compile.backends import Artifact, Context
from saigeedged.profiles import mean_scale

if TYPE_CHECKING:
    import numpy as np
    import onnx
    from numpy.typing import NDArray

    from saigeedged.compile.inputs import Prepared
    from saigeedged.manifest import Entry

REPORT_IMAGES = 16
COSINE_FLAG = 0.99
# calibration_method -> (onnxruntime CalibrationMethod name, moving average)
METHODS = {"ema": ("MinMax", True), "minmax": ("MinMax", False), "normal": ("MinMax", False),
           "kl": ("Entropy", False), "auto": ("Percentile", False)}


def steps(entry: Entry) -> list[str]:
    return ["wrap", "quantize", "report"]


def wrap_uint8(model: onnx.ModelProto, input_name: str, size: tuple[int, int],
               mean: Sequence[float], scale: Sequence[float], bgr: bool = False) -> onnx.ModelProto:
    """Prepend Cast → Transpose (→ RGB to BGR) → (x - mean) * scale so the model takes raw uint8 RGB [1, H, W, 3]."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    inner = f"{input_name}__nchw"
    graph = model.graph
    for node in graph.node:
        node.input[:] = [inner if name == input_name else name for name in node.input]
    for out in graph.output:
        if out.name == input_name:
            raise ValueError("the input is also an output")
    old = next(i for i in graph.input if i.name == input_name)
    graph.input.remove(old)
    for stale in [v for v in graph.value_info if v.name == input_name]:  # the cut model's float NCHW shape of it
        graph.value_info.remove(stale)
    height, width = size
    graph.input.insert(0, helper.make_tensor_value_info(input_name, TensorProto.UINT8, [1, height, width, 3]))
    graph.initializer.extend([
        numpy_helper.from_array(np.asarray(mean, np.float32).reshape(1, 3, 1, 1), f"{input_name}__mean"),
        numpy_helper.from_array(np.asarray(scale, np.float32).reshape(1, 3, 1, 1), f"{input_name}__scale"),
    ])
    pre = [
        helper.make_node("Cast", [input_name], [f"{input_name}__f32"], to=TensorProto.FLOAT, name="saige_cast"),
        helper.make_node("Transpose", [f"{input_name}__f32"], [f"{input_name}__t"], perm=[0, 3, 1, 2], name="saige_nchw"),
        helper.make_node("Sub", [f"{input_name}__o" if bgr else f"{input_name}__t", f"{input_name}__mean"],
                         [f"{input_name}__c"], name="saige_mean"),
        helper.make_node("Mul", [f"{input_name}__c", f"{input_name}__scale"], [inner], name="saige_scale"),
    ]
    if bgr:  # a model trained on BGR images: the bundle still takes RGB like the boards (SPEC §14)
        graph.initializer.append(numpy_helper.from_array(np.array([2, 1, 0], np.int64), f"{input_name}__bgr"))
        pre.insert(2, helper.make_node("Gather", [f"{input_name}__t", f"{input_name}__bgr"], [f"{input_name}__o"], axis=1,
                                       name="saige_bgr"))
    nodes = pre + list(graph.node)
    del graph.node[:]
    graph.node.extend(nodes)
    onnx.checker.check_model(model)
    return model


@dataclass(frozen=True)
class Calib:
    """The calibration images as a child process needs them (picklable): uint8 NHWC batches at input size."""

    images: tuple[str, ...]
    size: tuple[int, int]
    letterbox: bool

    def batches(self) -> list[NDArray[np.uint8]]:
        return list(self.stream())

    def stream(self) -> Iterator[NDArray[np.uint8]]:
        """Each image decoded once as it is used, none kept."""
        from saigeedged.compile import images

        return (images.load_rgb(Path(p), self.size, self.letterbox)[None] for p in self.images)


def wrap_job(model: Path, wrapped: Path, input_name: str, size: tuple[int, int], mean: Sequence[float],
             scale: Sequence[float], bgr: bool) -> None:
    """Step `wrap`, run in the child process (the model is loaded there, never in the daemon)."""
    import onnx

    onnx.save(wrap_uint8(onnx.load(str(model)), input_name, size, mean, scale, bgr), str(wrapped))


def quantize_job(float_path: Path, int8_path: Path, input_name: str, calib: Calib, method: str, bits: int = 8) -> None:
    """Step `quantize`, run in the child process."""
    quantize(float_path, int8_path, input_name, calib.stream(), method, bits)


def report_job(float_path: Path, int8_path: Path, input_name: str, calib: Calib) -> dict[str, Any]:
    """Step `report`, run in the child process (only the images it compares are loaded)."""
    subset = Calib(calib.images[:REPORT_IMAGES], calib.size, calib.letterbox)
    return report(float_path, int8_path, input_name, subset.batches())


class _Reader:
    """onnxruntime CalibrationDataReader over the staged calibration images."""

    def __init__(self, input_name: str, batches: Iterable[NDArray[np.uint8]]) -> None:
        self._it: Iterator[NDArray[np.uint8]] = iter(batches)
        self._name = input_name

    def get_next(self) -> dict[str, NDArray[np.uint8]] | None:
        batch = next(self._it, None)
        return None if batch is None else {self._name: batch}

    def rewind(self) -> None:  # only called by some onnxruntime versions; one pass is enough here
        pass


# what onnxruntime's calibrators say of a tensor without a finite range: "scale issue" (an assert), numpy's histogram
# "supplied range of [nan, nan] is not finite" (Entropy)
UNDEFINED = ("scale issue", "is not finite")


def quantize(float_path: Path, int8_path: Path, input_name: str, batches: Iterable[NDArray[np.uint8]], method: str,
             bits: int = 8, keep_float: Sequence[str] = ()) -> None:
    """QDQ static quantization, asymmetric per tensor; `bits` 16 for int16 activations and weights (the emulation of
    a board's int16 qtype), `keep_float` the node names left in float (hybrid layers).

    MinMax methods: the ranges come from ranges.collect (one streaming pass exposing two floats a tensor, equal to
    onnxruntime's own calibration bit for bit, at about half its time), saved beside the output as
    `<name>.ranges.json` in onnxruntime's calibration cache format, which quantize_static reads instead of
    calibrating; Entropy and Percentile keep onnxruntime's calibrator."""
    import numpy as np
    from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType, quantize_static

    from saigeedged.compile import ranges

    calib_method, moving = METHODS[method]
    act, weight = (QuantType.QUInt8, QuantType.QInt8) if bits == 8 else (QuantType.QUInt16, QuantType.QInt16)
    cache: Path | None = None
    reader: _Reader | None = None
    if calib_method == "MinMax":
        cache = ranges_path(int8_path)
        ranges.save(ranges.collect(float_path, input_name, batches, moving), cache)
    else:
        reader = _Reader(input_name, batches)
    logging.disable(logging.WARNING)  # onnxruntime logs "consider pre-processing" advice to the root logger
    try:
        # an infinite range (quantized as onnxruntime does, ranges.collect) is a NaN zero point in its quant_utils
        # (-inf / inf, then cast): numpy's RuntimeWarnings reached the stderr of `saigeedged compile`; the report
        # measures what that quantization gives
        # and its Entropy and Percentile calibrators print their progress to stdout: `saigeedged compile`'s own output
        with np.errstate(invalid="ignore"), contextlib.redirect_stdout(io.StringIO()):
            quantize_static(str(float_path), str(int8_path), reader, calibration_cache_path=cache,
                            quant_format=QuantFormat.QDQ, activation_type=act, weight_type=weight,
                            calibrate_method=getattr(CalibrationMethod, calib_method), nodes_to_exclude=list(keep_float),
                            # 16-bit Q/DQ needs opset 21; below it onnxruntime's own (com.microsoft) Q/DQ ops take them
                            extra_options={"CalibMovingAverage": moving, "UseQDQContribOps": bits == 16})
    except (AssertionError, ValueError) as exc:  # onnxruntime's own calibrators (Entropy, Percentile) on NaN or inf
        if not any(words in str(exc) for words in UNDEFINED):
            raise
        ranges.undefined([], f" (onnxruntime: {exc})")
    finally:
        logging.disable(logging.NOTSET)


def ranges_path(int8_path: Path) -> Path:
    """The activation ranges a quantization used (onnxruntime's calibration cache JSON), beside its model."""
    return int8_path.with_name(f"{int8_path.name.removesuffix('.onnx')}.ranges.json")


def cosine(a: NDArray[np.float32], b: NDArray[np.float32]) -> float:
    """Cosine similarity of two flattened tensors; two zero tensors are identical."""
    import numpy as np

    x, y = a.astype(np.float64).ravel(), b.astype(np.float64).ravel()
    nx, ny = np.linalg.norm(x), np.linalg.norm(y)
    if nx == 0 or ny == 0:
        return 1.0 if nx == ny else 0.0
    with np.errstate(invalid="ignore"):  # an infinite tensor's inf / inf: NaN, flagged by report() (no RuntimeWarning)
        return float(np.dot(x, y) / (nx * ny))


def report(float_path: Path, int8_path: Path, input_name: str, batches: list[NDArray[np.uint8]]) -> dict[str, Any]:
    """Per output, over up to 16 images: the worst per-image cosine and the max abs error."""
    import numpy as np
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    # no busy-waiting worker threads: on a small compile host they would starve the daemon's main loop
    opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
    opts.add_session_config_entry("session.inter_op.allow_spinning", "0")
    sessions = [ort.InferenceSession(str(p), opts, providers=["CPUExecutionProvider"]) for p in (float_path, int8_path)]
    names = [o.name for o in sessions[0].get_outputs()]
    cos: dict[str, list[float]] = {n: [] for n in names}
    err: dict[str, float] = dict.fromkeys(names, 0.0)
    for batch in batches[:REPORT_IMAGES]:
        ref, got = (s.run(names, {input_name: batch}) for s in sessions)
        for name, r, g in zip(names, ref, got, strict=True):
            cos[name].append(cosine(r, g))
            with np.errstate(invalid="ignore"):  # inf - inf: NaN, flagged like the cosine
                err[name] = float(np.max([err[name], np.max(np.abs(r.astype(np.float64) - g.astype(np.float64)))]))
    # np.min keeps a NaN (min() kept whichever came first); a NaN is flagged, then null (accuracytable.nulled)
    worst = {n: float(np.min(cos[n])) for n in names}
    outputs = {n: {"cosine": round(worst[n], 6), "cosine_mean": round(float(np.mean(cos[n])), 6),
                   "max_abs_error": round(err[n], 6), "flagged": not worst[n] >= COSINE_FLAG} for n in names}
    nulled(outputs)
    return {"images": min(len(batches), REPORT_IMAGES), "threshold": COSINE_FLAG, "outputs": outputs,
            "flagged": [n for n in names if outputs[n]["flagged"]]}


def compile(prep: Prepared, ctx: Context) -> Artifact:
    """Run wrap, quantize and report; the bundle member is `<stem>.int8.onnx`."""
    entry = prep.entry
    mean, scale = mean_scale(entry.profile)
    ctx.step("wrap")
    wrapped = prep.work_dir / f"{prep.name}.uint8.onnx"
    # (a valid model whose wrap or quantization needs more memory than a bound allows: OUT_OF_MEMORY)
    ctx.in_child(wrap_job, (prep.model, wrapped, prep.info.input_name, prep.input_size, mean, scale,
                            entry.channels == "bgr"), "wrap")
    ctx.log.line(f"wrapped {prep.model.name}: input {prep.info.input_name} uint8 [1, {prep.input_size[0]}, "
                 f"{prep.input_size[1]}, 3] RGB, model channels {entry.channels}, mean {mean}, "
                 f"scale {[round(s, 6) for s in scale]}")
    calib = Calib(tuple(str(s.image) for s in prep.chosen), prep.input_size, entry.profile.letterbox)
    int8 = prep.work_dir / f"{prep.name}.int8.onnx"
    ctx.step("quantize")
    bits = 16 if entry.qtype == "int16" else 8  # a variant's `qtype: int16` (SPEC §17); uint8 otherwise
    ctx.in_child(quantize_job, (wrapped, int8, prep.info.input_name, calib, entry.calibration_method, bits), "quantize")
    ctx.log.line(f"quantized {len(calib.images)} calibration images ({entry.calibration_method}) -> {int8.name}")
    ctx.step("report")
    result = ctx.in_child(report_job, (wrapped, int8, prep.info.input_name, calib), "report")
    for name, row in result["outputs"].items():
        flag = "  << FLAGGED: INT8 output diverges" if row["flagged"] else ""
        ctx.log.line(f"report {name}: cosine {figure(row['cosine'])} max_abs_error {figure(row['max_abs_error'], '.4g')}{flag}")
    quant = {"format": "QDQ", "activations": f"uint{bits}", "weights": f"int{bits}",
             "method": METHODS[entry.calibration_method][0], "calibration_method": entry.calibration_method,
             "n_samples": len(prep.chosen), "seed": entry.seed}
    return Artifact(int8.name, {int8.name: int8}, quant, platform={"name": "host", "runtime": "onnxruntime"},
                    report=result)
