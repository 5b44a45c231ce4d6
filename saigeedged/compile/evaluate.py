"""The accuracy report (SPEC §17): float ONNX against the compiled model on held-out images, run in the bounded child."""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from numpy.typing import NDArray
from onnx import numpy_helper

from saigeedged.compile import accuracy, images

WORST_LAYERS = 10
LAYER_IMAGES = 2  # per-layer errors on the first held-out images only: the worst 10 of a 640 detector are those of 16
Box = tuple[float, float, float, float]  # xyxy pixels
# (boxes or None: the file has none; else one per label, None where that label has no usable box), labels
Truth = tuple[tuple[Box | None, ...] | None, tuple[int, ...]]


@dataclass(frozen=True)
class Spec:
    """What one evaluation needs (picklable): both models taking uint8 NHWC RGB, the held-out images and labels."""

    float_model: Path  # the wrapped float ONNX (same uint8 input contract as the board)
    compiled: Path  # a QDQ ONNX: the host's INT8 model or the emulation of a board's quantization
    method: str  # "int8" or "int16" (host) | "emulated" | "simulator"
    input_name: str
    images: tuple[str, ...]
    truth: tuple[Truth, ...]
    size: tuple[int, int]
    letterbox: bool
    task: str
    num_classes: int
    conf: float = 0.25  # the task's postprocess threshold: what the float model "detects" for the agreement mAP
    notes: tuple[str, ...] = field(default=())
    dropped: int = 0  # boxes of the held-out images the calibration file gave that are not boxes (Sample.dropped)


def session(path: Path | bytes) -> Any:
    """An onnxruntime session on one thread that does not spin: the report runs beside the next job's compile (the
    finishing stage), and a second thread cost 30% more CPU for 20% less wall time (a 640 detector: 34 ms of CPU a
    run on one thread, 45 on two): on a small compile host the other core is the compile's."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    opts.log_severity_level = 3
    opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
    opts.add_session_config_entry("session.inter_op.allow_spinning", "0")
    return ort.InferenceSession(path if isinstance(path, bytes) else str(path), opts, providers=["CPUExecutionProvider"])


def float_tensors(model: onnx.ModelProto) -> dict[str, str]:
    """Every float activation of the float model, as {name in the float model: same name}."""
    inits = {i.name for i in model.graph.initializer}
    return {o: o for n in model.graph.node for o in n.output if o and o not in inits and n.op_type != "Constant"}


def dequantized(model: onnx.ModelProto) -> dict[str, str]:
    """{float tensor name: its DequantizeLinear output} for every quantized activation of a QDQ model."""
    quantized = {n.output[0]: n.input[0] for n in model.graph.node if n.op_type == "QuantizeLinear"}
    return {quantized[n.input[0]]: n.output[0] for n in model.graph.node
            if n.op_type == "DequantizeLinear" and n.input[0] in quantized}


def defaults_left(model: onnx.ModelProto, input_name: str) -> list[str]:
    """Tensors whose quantization parameters stayed at defaults (scale 1.0, zero point 0): calibration never saw them.

    The wrapper's raw-pixel tensors (`<input>__*`, [0, 255] in uint8) have exactly that scale by right: not listed.
    """
    inits = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    left = []
    for node in model.graph.node:
        if node.op_type != "QuantizeLinear" or node.input[0] in inits or node.input[0].startswith(f"{input_name}__") \
                or node.input[0] == input_name:
            continue
        scale = inits.get(node.input[1])
        zero = inits.get(node.input[2]) if len(node.input) > 2 else np.zeros(1)
        if scale is not None and zero is not None and np.all(scale == 1.0) and np.all(zero == 0):
            left.append(node.input[0])
    return left


def exposed(model: onnx.ModelProto, names: Sequence[str]) -> bytes:
    """The model with `names` added as graph outputs (onnxruntime infers their types)."""
    have = {o.name for o in model.graph.output}
    out = onnx.ModelProto()
    out.CopyFrom(model)
    out.graph.output.extend([onnx.ValueInfoProto(name=n) for n in names if n not in have])
    data: bytes = out.SerializeToString()
    return data


class _Tally:
    """Per tensor over the images, streamed (no activation is kept): worst and mean cosine, max abs error."""

    def __init__(self) -> None:
        self.cos: dict[str, list[float]] = {}
        self.err: dict[str, float] = {}

    def add(self, name: str, ref: NDArray[Any], got: NDArray[Any]) -> None:
        if ref.shape != got.shape or not np.issubdtype(ref.dtype, np.floating):
            return
        cos, err = accuracy.compared(ref, got)
        self.cos.setdefault(name, []).append(cos)
        self.err[name] = float(np.max([self.err.get(name, 0.0), err]))  # NaN stays NaN (max() dropped it)

    def row(self, name: str) -> dict[str, float]:
        return {"cosine": round(float(np.min(self.cos[name])), 6), "cosine_mean": round(float(np.mean(self.cos[name])), 6),
                "max_abs_error": round(self.err[name], 6)}


def _inputs(spec: Spec) -> Iterator[dict[str, NDArray[np.uint8]]]:
    """Each held-out image as the board is fed it, decoded when its run comes (never all at once)."""
    for path in spec.images:
        yield {spec.input_name: images.load_rgb(Path(path), spec.size, spec.letterbox)[None]}


def _outputs(sess: Any, outputs: list[str], spec: Spec) -> list[list[NDArray[Any]]]:
    """The graph outputs of every held-out image (small: the heads or the scores)."""
    return [sess.run(outputs, x) for x in _inputs(spec)]


def run(spec: Spec) -> dict[str, Any]:
    """In the child: both models on every held-out image for the per-output errors and the task metric (sessions
    optimised for the graph outputs: the INT8 kernels the bundle runs), then the per-layer table on the first
    LAYER_IMAGES images only (sessions with every paired activation exposed)."""
    ref_sess, got_sess = session(spec.float_model), session(spec.compiled)
    outputs = [o.name for o in ref_sess.get_outputs()]  # the graph's outputs in its order, without a second parse
    ref_out, got_out = [], []
    for x in _inputs(spec):  # each image decoded and letterboxed once, for both models
        ref_out.append(ref_sess.run(outputs, x))
        got_out.append(got_sess.run(outputs, x))
    report = compare(spec, outputs, ref_out, got_out)
    compiled = onnx.load(str(spec.compiled))
    report["worst_layers"] = worst_layers(spec, outputs, compiled)
    report["layer_images"] = min(LAYER_IMAGES, len(spec.images)) if report["worst_layers"] else 0
    report["default_quantization"] = defaults_left(compiled, spec.input_name)
    return report


def worst_layers(spec: Spec, outputs: list[str], compiled: onnx.ModelProto) -> list[dict[str, Any]]:
    """The WORST_LAYERS activations (not graph outputs) with the lowest mean cosine over the first LAYER_IMAGES
    held-out images: the float tensor against its DequantizeLinear in the compiled model, one image's activations
    at a time, each pair dropped once tallied."""
    float_model = onnx.load(str(spec.float_model))
    activations = float_tensors(float_model)  # once: in the comprehension's test it walked the graph per tensor
    pairs = {k: v for k, v in dequantized(compiled).items() if k in activations and k not in outputs}
    if not pairs:
        return []
    ref_sess = session(exposed(float_model, list(pairs)))
    del float_model
    got_sess = session(exposed(compiled, list(pairs.values())))
    layers = _Tally()
    for x in itertools.islice(_inputs(spec), LAYER_IMAGES):
        ref = ref_sess.run(list(pairs), x)
        got = got_sess.run(list(pairs.values()), x)
        with np.errstate(invalid="ignore"):  # an infinite activation: NaN, as compare() says
            for name in reversed(pairs):  # popped: each activation is freed once tallied
                layers.add(name, ref.pop(), got.pop())
    worst = sorted(layers.cos, key=lambda n: (float(np.mean(layers.cos[n])), n))[:WORST_LAYERS]
    return [{"tensor": n, **layers.row(n)} for n in worst]


def run_given(spec: Spec, got_out: list[list[NDArray[Any]]], defaults: list[str]) -> dict[str, Any]:
    """In the child: the float model on every held-out image against outputs the compiled model gave elsewhere (the
    toolkit's simulator), one list per image in the float model's output order; no per-layer table."""
    ref_sess = session(spec.float_model)
    outputs = [o.name for o in ref_sess.get_outputs()]
    ref_out = _outputs(ref_sess, outputs, spec)
    got = [[g.reshape(r.shape) for r, g in zip(ref, given, strict=True)] for ref, given in zip(ref_out, got_out, strict=True)]
    report = compare(spec, outputs, ref_out, got)
    report["worst_layers"], report["layer_images"], report["default_quantization"] = [], 0, defaults
    return report


def compare(spec: Spec, outputs: list[str], ref_out: list[list[NDArray[Any]]],
            got_out: list[list[NDArray[Any]]]) -> dict[str, Any]:
    """Per output over the images: worst and mean cosine, max abs error; then the task metric."""
    outs = _Tally()
    # a model infinite on an image (a Log of 0) makes inf - inf, inf / inf or inf * 0 here: NaN, which the report names
    # and the gate fails (report.made); numpy's RuntimeWarning said nothing more, on `saigeedged compile`'s stderr
    with np.errstate(invalid="ignore"):
        for ref, got in zip(ref_out, got_out, strict=True):
            for name, r, g in zip(outputs, ref, got, strict=True):
                outs.add(name, r, g)
        task = task_metric(spec, ref_out, got_out)
    return {"method": spec.method, "images": len(spec.images), "notes": [*spec.notes, *task.pop("notes", [])],
            "held_out": [Path(p).name for p in spec.images],
            "outputs": {n: outs.row(n) for n in outputs if n in outs.cos}, "task": task}


def task_metric(spec: Spec, ref: list[list[NDArray[Any]]], got: list[list[NDArray[Any]]]) -> dict[str, Any]:
    """Detection: decoded-score cosine, mAP@0.5 against the float model's detections and, with boxes, against
    the labels; mlc: mAP against the labels on both models; reid: nothing beyond the output cosine."""
    if not ref:
        return {}
    if spec.task == "detection":
        heads = ref[0]
        if len(heads) == 3 and all(h.ndim == 4 and h.shape[0] == 1 and h.shape[1] == 5 + spec.num_classes for h in heads):
            return _detection(spec, ref, got)
        return {"metric": None, "labels": f"the outputs are not three YOLOX heads [1, {5 + spec.num_classes}, h, w]: "
                "no decoded scores, no mAP"}
    if spec.task == "mlc":
        labels = np.zeros((len(ref), spec.num_classes), bool)
        for i, (_, classes) in enumerate(spec.truth):
            labels[i, list(classes)] = True
        float_map = accuracy.multilabel_map(np.concatenate([r[0].reshape(1, -1) for r in ref]), labels)
        comp_map = accuracy.multilabel_map(np.concatenate([g[0].reshape(1, -1) for g in got]), labels)
        return {"metric": "mAP", **_both(float_map, comp_map), **_labels_note(spec)}
    return {}


def _both(float_map: float | None, comp_map: float | None) -> dict[str, Any]:
    """The metric on both models and its drop (None where nothing could be measured)."""
    if float_map is None or comp_map is None:
        return {"float": None, "compiled": None, "drop": None}
    return {"float": round(float_map, 6), "compiled": round(comp_map, 6), "drop": round(float_map - comp_map, 6)}


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 6)


def _detection(spec: Spec, ref: list[list[NDArray[Any]]], got: list[list[NDArray[Any]]]) -> dict[str, Any]:
    scores = [accuracy.cosine(*_centred(accuracy.yolox_scores(r), accuracy.yolox_scores(g)))
              for r, g in zip(ref, got, strict=True)]
    found_ref = [accuracy.decode_yolox(r) for r in ref]
    found_got = [accuracy.decode_yolox(g) for g in got]
    agreed = [(d.boxes[d.scores >= spec.conf], d.classes[d.scores >= spec.conf]) for d in found_ref]
    out: dict[str, Any] = {"metric": "mAP@0.5", "score_cosine": round(min(scores), 6),
                           "score_cosine_mean": round(float(np.mean(scores)), 6),
                           "map50_vs_float": _round(accuracy.map50(found_got, agreed, spec.num_classes))}
    if all(boxes is not None for boxes, _ in spec.truth):
        out.update(_against_labels(spec, found_ref, found_got))
    else:
        out.update(_both(None, None))
        out["labels"] = "the calibration file has no boxes (a val.json, or COCO without `bbox`): mAP against labels " \
            "not measured"
    return out


def _against_labels(spec: Spec, found_ref: list[accuracy.Detections], found_got: list[accuracy.Detections]
                    ) -> dict[str, Any]:
    """mAP@0.5 against the boxes, on the held-out images whose every label has a usable box: one with a label without
    (its annotation gave none, or one that is not a box or lies entirely outside the image) would count the model's
    detection of that object as a false positive, so it is left out; the notes count what was left out, dropped or
    clipped, and with no usable box left mAP is not measured, saying why (never measured on nothing)."""
    placed = [_letterboxed(spec, path, boxes or ()) for path, (boxes, _) in zip(spec.images, spec.truth, strict=True)]
    keep = [i for i, (arr, _, _) in enumerate(placed) if not np.isnan(arr).any()]
    dropped = spec.dropped + sum(outside for _, _, outside in placed)
    left_out = len(spec.truth) - len(keep)
    notes = [f"{dropped} ground-truth box(es) dropped: not a box (no finite [x, y, width, height] with width and height "
             "above 0) or entirely outside its image"] if dropped else []
    if left_out:
        notes.append(f"{left_out} held-out image(s) left out of mAP against labels: a label without a usable box")
    clipped = sum(placed[i][1] for i in keep)
    if clipped:
        notes.append(f"{clipped} ground-truth box(es) partly outside their image clipped to it")
    if not any(labels for _, labels in spec.truth):
        return {**_both(None, None), **_labels_note(spec)}
    if not any(len(placed[i][0]) for i in keep):
        return {**_both(None, None), "notes": notes, "labels": f"no held-out image has a usable box ({left_out} of "
                f"{len(spec.truth)} left out: a label without one): mAP against labels not measured"}
    truth = [(placed[i][0], np.asarray(spec.truth[i][1], np.int64)) for i in keep]
    return {**_both(accuracy.map50([found_ref[i] for i in keep], truth, spec.num_classes),
                    accuracy.map50([found_got[i] for i in keep], truth, spec.num_classes)), "notes": notes}


def _labels_note(spec: Spec) -> dict[str, Any]:
    """Why there is no mAP against the labels (`labels`, the table's line where a drop would be)."""
    if not any(labels for _, labels in spec.truth):
        return {"labels": f"none of the {len(spec.truth)} held-out images has a label: mAP against labels not measured"}
    return {}


def _centred(ref: NDArray[np.float64], got: NDArray[np.float64]) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """Both score maps less the float one's mean: scores are all positive, and the cosine of two positive vectors
    stays high even when one is quantized to a few levels (so this is the correlation, on the float's centre)."""
    centre = float(ref.mean())
    return ref - centre, got - centre


def _letterboxed(spec: Spec, path: str, boxes: Sequence[Box | None]) -> tuple[NDArray[np.float64], int, int]:
    """Ground-truth boxes in the model's input pixels (the letterbox scales by one ratio and pads right and bottom),
    each first clipped to its image; how many clipping changed; how many lie entirely outside the image. A label
    without a usable box (None: read() found none, or none that is a box; or one entirely outside) is a NaN row."""
    from PIL import Image

    with Image.open(path) as img:
        width, height = img.size
    if spec.letterbox:
        rx = ry = min(spec.size[0] / height, spec.size[1] / width)
    else:
        rx, ry = spec.size[1] / width, spec.size[0] / height
    given = np.asarray([(np.nan,) * 4 if box is None else box for box in boxes], np.float64).reshape(-1, 4)
    inside = np.clip(given, 0.0, np.array([width, height, width, height], np.float64))
    outside = (inside[:, 2] <= inside[:, 0]) | (inside[:, 3] <= inside[:, 1])  # NaN rows compare False
    inside[outside] = np.nan
    clipped = int((np.any(inside != given, axis=1) & ~np.isnan(inside).any(axis=1)).sum())
    arr: NDArray[np.float64] = inside * np.array([rx, ry, rx, ry])
    return arr, clipped, int(outside.sum())
