"""Test-only inputs; the generic generators live in saigeedged.cli.examples (the demo uses them too)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import onnx
import yaml
from onnx import TensorProto, helper

from saigeedged.cli.examples import OPSET, classifier, const, image, random_labels, valjson, yolox

__all__ = ["classifier", "collapsing", "image", "manifest", "random_labels", "valjson", "yolox"]


def collapsing(path: Path, size: tuple[int, int] = (32, 32)) -> Path:
    """A sigmoid head fed a badly scaled input: on mid-grey images every output is below one INT8 step."""
    nodes = [helper.make_node("Mul", ["input", "gain"], ["g"]), helper.make_node("Sub", ["g", "gain"], ["z"]),
             helper.make_node("Sigmoid", ["z"], ["prob"])]
    graph = helper.make_graph(nodes, "collapse", [helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, 3, *size])],
                              [helper.make_tensor_value_info("prob", TensorProto.FLOAT, [1, 3, *size])],
                              [const("gain", np.array(20.0))])
    onnx.save(helper.make_model(graph, opset_imports=OPSET), str(path))
    return path


def manifest(path: Path, **fields: Any) -> Path:
    path.write_text(yaml.safe_dump(fields, sort_keys=False))
    return path
