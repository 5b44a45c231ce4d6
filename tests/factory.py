"""Test-only inputs; the generic generators live in saigeedged.cli.examples (the demo uses them too)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import onnx
import yaml
from onnx import TensorProto, helper

from saigeedged.cli.examples import OPSET, classifier, const, image, random_labels, valjson, yolox

__all__ = ["checkpoint", "classifier", "collapsing", "det_manifest", "image", "manifest", "random_labels", "undefined",
           "valjson", "yolox", "infinite", "unbounded"]


def collapsing(path: Path, size: tuple[int, int] = (32, 32)) -> Path:
    """A sigmoid head fed a badly scaled input: on mid-grey images every output is below one INT8 step."""
    nodes = [helper.make_node("Mul", ["input", "gain"], ["g"]), helper.make_node("Sub", ["g", "gain"], ["z"]),
             helper.make_node("Sigmoid", ["z"], ["prob"])]
    graph = helper.make_graph(nodes, "collapse", [helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, 3, *size])],
                              [helper.make_tensor_value_info("prob", TensorProto.FLOAT, [1, 3, *size])],
                              [const("gain", np.array(20.0))])
    onnx.save(helper.make_model(graph, opset_imports=OPSET), str(path))
    return path


def undefined(path: Path, op: str, conv: bool = False, size: tuple[int, int] = (64, 64)) -> Path:
    """A re-id model whose `op` (Log, Sqrt) is undefined on part of its input: `conv`: after a random convolution,
    NaN in every image's activations; else on the pooled pixels, NaN in the embedding of dark images only (the re-id
    profile subtracts the ImageNet mean)."""
    rng = np.random.default_rng(0)
    head = [helper.make_node("Conv", ["input", "w"], ["f"], strides=[4, 4]), helper.make_node(op, ["f"], ["g"]),
            helper.make_node("GlobalAveragePool", ["g"], ["p"])] if conv else \
        [helper.make_node("GlobalAveragePool", ["input"], ["q"]), helper.make_node(op, ["q"], ["p"])]
    width = 8 if conv else 3
    graph = helper.make_graph([*head, helper.make_node("Flatten", ["p"], ["emb"])], "undefined",
                              [helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, 3, *size])],
                              [helper.make_tensor_value_info("emb", TensorProto.FLOAT, [1, width])],
                              [const("w", rng.normal(0, 0.1, (8, 3, 4, 4)))] if conv else [])
    onnx.save(helper.make_model(graph, opset_imports=OPSET), str(path))
    return path


def infinite(path: Path, size: tuple[int, int] = (64, 64)) -> Path:
    """A re-id model with an infinite tensor on every image, bounded after it (the 1/0 of a Relu below zero, clipped to
    10, as a -inf mask before a Softmax is): its range is infinite, its output finite."""
    nodes = [helper.make_node("GlobalAveragePool", ["input"], ["p"]), helper.make_node("Sub", ["p", "big"], ["s"]),
             helper.make_node("Relu", ["s"], ["z"]), helper.make_node("Reciprocal", ["z"], ["inv"]),
             helper.make_node("Clip", ["inv", "lo", "hi"], ["c"]), helper.make_node("Flatten", ["c"], ["emb"])]
    graph = helper.make_graph(nodes, "infinite", [helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, 3, *size])],
                              [helper.make_tensor_value_info("emb", TensorProto.FLOAT, [1, 3])],
                              [const("big", np.array(1000.0)), const("lo", np.array(0.0)), const("hi", np.array(10.0))])
    onnx.save(helper.make_model(graph, opset_imports=OPSET), str(path))
    return path


def unbounded(path: Path, size: tuple[int, int] = (64, 64)) -> Path:
    """A re-id model whose output is the Log of its Relu'd pooled pixels: -inf on dark images (the re-id profile
    subtracts the ImageNet mean), finite on bright ones, so its range is infinite and its report NaN."""
    nodes = [helper.make_node("GlobalAveragePool", ["input"], ["q"]), helper.make_node("Relu", ["q"], ["r"]),
             helper.make_node("Log", ["r"], ["p"]), helper.make_node("Flatten", ["p"], ["emb"])]
    graph = helper.make_graph(nodes, "unbounded", [helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, 3, *size])],
                              [helper.make_tensor_value_info("emb", TensorProto.FLOAT, [1, 3])])
    onnx.save(helper.make_model(graph, opset_imports=OPSET), str(path))
    return path


def manifest(path: Path, **fields: Any) -> Path:
    path.write_text(yaml.safe_dump(fields, sort_keys=False))
    return path


def det_manifest(tmp_path: Path, images: int = 20, **fields: Any) -> Path:
    """A tiny YOLOX detector, its calibration file of `images` images and det.yml with `fields` (cubie unless they
    say); the bundle goes to tmp_path/det.saigeedge."""
    src = yolox(tmp_path / "det.onnx", size=(64, 64))
    calib = valjson(tmp_path / "data", random_labels(images, 3))
    base = {"task": "detection", "num_classes": 3, "calib": str(calib), "onnx": str(src), "n_samples": 8,
            "output": str(tmp_path / "det.saigeedge")}
    return manifest(tmp_path / "det.yml", **{**base, **fields})


def checkpoint(bundle: Path) -> Any:
    """A bundle's checkpoint.yaml."""
    import zipfile

    with zipfile.ZipFile(bundle) as zf:
        return yaml.safe_load(zf.read("checkpoint.yaml"))
