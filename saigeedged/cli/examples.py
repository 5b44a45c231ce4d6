"""Example inputs generated locally (no downloads): a YOLOX-style detector, a classifier, images, val.json."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
from PIL import Image

OPSET = [helper.make_opsetid("", 17)]


def const(name: str, array: np.ndarray) -> onnx.TensorProto:
    return numpy_helper.from_array(array.astype(np.float32), name)


def yolox(path: Path, num_classes: int = 3, size: tuple[int, int] = (64, 64), *, batch: int | str = 1,
          head_prefix: str = "/head/Concat", seed: int = 0, box_gain: float = 1.0) -> Path:
    """A tiny YOLOX-like detector: three stride heads named like the real export, then the decode tail.

    `box_gain` scales the box channels of each head (an export that put pixel-scale boxes next to 0-1 scores in one
    tensor, as a head without the output-cut surgery does): one uint8 scale per tensor then crushes the scores.
    """
    rng = np.random.default_rng(seed)
    ch = 5 + num_classes
    nodes, inits, flats = [], [], []
    for i, stride in enumerate((8, 16, 32)):
        suffix = "" if i == 0 else f"_{i}"
        box = f"rg{i}" if box_gain != 1.0 else f"r{i}"
        w = rng.normal(0, 0.05, (4, 3, stride, stride))
        inits += [const(f"w{i}", w), const(f"reg{i}", rng.normal(0, 0.5, (4, 4, 1, 1))),
                  const(f"obj{i}", rng.normal(0, 0.5, (1, 4, 1, 1))),
                  const(f"cls{i}", rng.normal(0, 0.5, (num_classes, 4, 1, 1)))]
        nodes += [
            helper.make_node("Conv", ["images", f"w{i}"], [f"feat{i}"], strides=[stride, stride], name=f"/backbone/Conv{suffix}"),
            helper.make_node("Relu", [f"feat{i}"], [f"act{i}"]),
            helper.make_node("Conv", [f"act{i}", f"reg{i}"], [f"r{i}"]),
            helper.make_node("Conv", [f"act{i}", f"obj{i}"], [f"o{i}"]),
            helper.make_node("Sigmoid", [f"o{i}"], [f"os{i}"]),
            helper.make_node("Conv", [f"act{i}", f"cls{i}"], [f"c{i}"]),
            helper.make_node("Sigmoid", [f"c{i}"], [f"cs{i}"]),
            *([helper.make_node("Mul", [f"r{i}", "box_gain"], [f"rg{i}"])] if box_gain != 1.0 else []),
            helper.make_node("Concat", [box, f"os{i}", f"cs{i}"], [f"{head_prefix}{suffix}_output_0"], axis=1,
                             name=f"{head_prefix}{suffix}"),
            helper.make_node("Reshape", [f"{head_prefix}{suffix}_output_0", "flat_shape"], [f"flat{i}"]),
        ]
        flats.append(f"flat{i}")
    inits.append(numpy_helper.from_array(np.array([1, ch, -1], dtype=np.int64), "flat_shape"))
    if box_gain != 1.0:
        inits.append(const("box_gain", np.array(box_gain)))
    nodes += [helper.make_node("Concat", flats, ["cat"], axis=2),
              helper.make_node("Transpose", ["cat"], ["output"], perm=[0, 2, 1])]
    h, w_ = size
    cells = sum((h // s) * (w_ // s) for s in (8, 16, 32))
    graph = helper.make_graph(nodes, "yolox_tiny",
                              [helper.make_tensor_value_info("images", TensorProto.FLOAT, [batch, 3, h, w_])],
                              [helper.make_tensor_value_info("output", TensorProto.FLOAT, [batch, cells, ch])], inits)
    model = helper.make_model(graph, opset_imports=OPSET)
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


def classifier(path: Path, num_classes: int = 4, size: tuple[int, int] = (224, 224), *, batch: int | str = 1,
               seed: int = 0, extra_input: bool = False) -> Path:
    """A small multi-label classifier: strided conv, global pool, linear, sigmoid."""
    rng = np.random.default_rng(seed)
    inits = [const("w", rng.normal(0, 0.1, (8, 3, 4, 4))), const("fc", rng.normal(0, 0.5, (8, num_classes))),
             const("b", rng.normal(0, 0.1, (num_classes,)))]
    nodes = [helper.make_node("Conv", ["input", "w"], ["f"], strides=[4, 4]), helper.make_node("Relu", ["f"], ["a"]),
             helper.make_node("GlobalAveragePool", ["a"], ["p"]), helper.make_node("Flatten", ["p"], ["v"]),
             helper.make_node("Gemm", ["v", "fc", "b"], ["logits"]), helper.make_node("Sigmoid", ["logits"], ["scores"])]
    inputs = [helper.make_tensor_value_info("input", TensorProto.FLOAT, [batch, 3, *size])]
    if extra_input:
        inputs.append(helper.make_tensor_value_info("aux", TensorProto.FLOAT, [1, num_classes]))
        nodes[-1] = helper.make_node("Add", ["logits", "aux"], ["mix"])
        nodes.append(helper.make_node("Sigmoid", ["mix"], ["scores"]))
    graph = helper.make_graph(nodes, "mlc_tiny", inputs,
                              [helper.make_tensor_value_info("scores", TensorProto.FLOAT, [batch, num_classes])], inits)
    model = helper.make_model(graph, opset_imports=OPSET)
    onnx.save(model, str(path))
    return path


def image(path: Path, seed: int, size: tuple[int, int] = (48, 64), *, grey: int | None = None) -> Path:
    """A random RGB image (or a noisy mid-grey one), saved in the format of its suffix."""
    rng = np.random.default_rng(seed)
    h, w = size
    if grey is None:
        pixels = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
    else:
        pixels = np.clip(rng.normal(grey, 20, (h, w, 3)), 0, 255).astype(np.uint8)
    Image.fromarray(pixels).save(path)
    return path


def valjson(folder: Path, labels: list[list[int]], *, n_classes: int | None = None, names: list[str] | None = None,
            relative: bool = False, suffix: str = ".jpg", grey: int | None = None) -> Path:
    """A val.json over freshly generated images, one per entry of `labels`."""
    img_dir = folder / "images"
    img_dir.mkdir(parents=True, exist_ok=True)
    rows: list[dict[str, Any]] = []
    for i, lab in enumerate(labels):
        p = image(img_dir / f"img{i:04d}{suffix}", seed=i, grey=grey)
        rows.append({"image": f"images/{p.name}" if relative else str(p.resolve()), "labels": lab})
    nc = n_classes if n_classes is not None else max([max(lab) for lab in labels if lab] + [0]) + 1
    data = {"n_classes": nc, "class_names": names or [f"class{i}" for i in range(nc)], "validation": rows}
    out = folder / "val.json"
    out.write_text(json.dumps(data))
    return out


def random_labels(n: int, num_classes: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(num_classes) for _ in range(rng.randint(1, 3))] for _ in range(n)]
