"""Real-size model shapes for the benches and the tests that need one (seeded random weights, no downloads): a
YOLOX-nano-shaped detector (CSPDarknet with depthwise convs, PAFPN, decoupled heads, the export's decode tail) and a
MobileNetV3-Small-shaped classifier. The numbers are not a trained model's; the graph's size, depth, operators and
activation volume are.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = [helper.make_opsetid("", 17)]


class _Graph:
    """A graph under construction: unique names, He-scaled seeded weights, conv + SiLU/hardswish blocks."""

    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self.count = 0

    def name(self, stem: str) -> str:
        self.count += 1
        return f"/{stem}_{self.count}"

    def const(self, array: np.ndarray, dtype: type = np.float32) -> str:
        name = self.name("w")
        self.inits.append(numpy_helper.from_array(array.astype(dtype), name))
        return name

    def op(self, op: str, inputs: list[str], out: str | None = None, **attrs: object) -> str:
        name = self.name(op)
        output = out or f"{name}_output_0"
        self.nodes.append(helper.make_node(op, inputs, [output], name=name if out is None else out.removesuffix("_output_0"),
                                           **attrs))
        return output

    def conv(self, x: str, cin: int, cout: int, k: int = 1, s: int = 1, groups: int = 1, act: str = "silu") -> str:
        fan_in = cin // groups * k * k
        w = self.const(self.rng.normal(0, np.sqrt(2.0 / fan_in), (cout, cin // groups, k, k)))
        b = self.const(self.rng.normal(0, 0.05, (cout,)))
        y = self.op("Conv", [x, w, b], kernel_shape=[k, k], strides=[s, s], pads=[k // 2] * 4, group=groups)
        if act == "silu":
            return self.op("Mul", [y, self.op("Sigmoid", [y])])
        if act == "hswish":
            return self.op("HardSwish", [y])
        if act == "relu":
            return self.op("Relu", [y])
        return y

    def dwconv(self, x: str, cin: int, cout: int, k: int = 3, s: int = 1) -> str:
        return self.conv(self.conv(x, cin, cin, k, s, groups=cin), cin, cout)

    def model(self, name: str, inp: str, shape: list[int], outputs: list[tuple[str, list[int]]]) -> onnx.ModelProto:
        graph = helper.make_graph(self.nodes, name, [helper.make_tensor_value_info(inp, TensorProto.FLOAT, shape)],
                                  [helper.make_tensor_value_info(o, TensorProto.FLOAT, s) for o, s in outputs], self.inits)
        model = helper.make_model(graph, opset_imports=OPSET)
        onnx.checker.check_model(model)
        return model


def _csp(g: _Graph, x: str, cin: int, cout: int, n: int, shortcut: bool = True) -> str:
    hidden = cout // 2
    a, b = g.conv(x, cin, hidden), g.conv(x, cin, hidden)
    for _ in range(n):
        y = g.dwconv(g.conv(a, hidden, hidden), hidden, hidden)
        a = g.op("Add", [a, y]) if shortcut else y
    return g.conv(g.op("Concat", [a, b], axis=1), 2 * hidden, cout)


def _focus(g: _Graph, x: str) -> str:
    """Space-to-depth with four strided Slices, as the YOLOX export writes it."""
    parts = []
    for dy, dx in ((0, 0), (1, 0), (0, 1), (1, 1)):
        starts, ends = g.const(np.array([dy, dx]), np.int64), g.const(np.array([1 << 30, 1 << 30]), np.int64)
        axes, steps = g.const(np.array([2, 3]), np.int64), g.const(np.array([2, 2]), np.int64)
        parts.append(g.op("Slice", [x, starts, ends, axes, steps]))
    return g.op("Concat", parts, axis=1)


def _upsample(g: _Graph, x: str) -> str:
    return g.op("Resize", [x, "", g.const(np.array([1, 1, 2, 2]))], mode="nearest")


def _pafpn(g: _Graph, x: str) -> tuple[str, str, str]:
    """CSPDarknet (width 0.25, depth 0.33, depthwise) and its PAFPN: features at strides 8, 16, 32 (64/128/256 ch)."""
    x = g.conv(_focus(g, x), 12, 16, 3)
    x = _csp(g, g.dwconv(x, 16, 32, 3, 2), 32, 32, 1)
    c3 = _csp(g, g.dwconv(x, 32, 64, 3, 2), 64, 64, 3)
    c4 = _csp(g, g.dwconv(c3, 64, 128, 3, 2), 128, 128, 3)
    x = g.conv(g.dwconv(c4, 128, 256, 3, 2), 256, 128)
    pools = [g.op("MaxPool", [x], kernel_shape=[k, k], pads=[k // 2] * 4, strides=[1, 1]) for k in (5, 9, 13)]
    c5 = _csp(g, g.conv(g.op("Concat", [x, *pools], axis=1), 512, 256), 256, 256, 1, shortcut=False)
    p5 = g.conv(c5, 256, 128)
    f4 = _csp(g, g.op("Concat", [_upsample(g, p5), c4], axis=1), 256, 128, 1, shortcut=False)
    p4 = g.conv(f4, 128, 64)
    out3 = _csp(g, g.op("Concat", [_upsample(g, p4), c3], axis=1), 128, 64, 1, shortcut=False)
    out4 = _csp(g, g.op("Concat", [g.dwconv(out3, 64, 64, 3, 2), p4], axis=1), 128, 128, 1, shortcut=False)
    out5 = _csp(g, g.op("Concat", [g.dwconv(out4, 128, 128, 3, 2), p5], axis=1), 256, 256, 1, shortcut=False)
    return out3, out4, out5


def yolox_nano(path: Path, size: int = 640, num_classes: int = 3, seed: int = 0) -> Path:
    """A YOLOX-nano-shaped detector [1, 3, size, size] -> [1, cells, 5 + C], with the three /head/Concat tensors the
    output-cut surgery keeps."""
    g = _Graph(seed)
    feats = _pafpn(g, "images")
    flats = []
    for i, (feat, cin) in enumerate(zip(feats, (64, 128, 256), strict=True)):
        stem = g.conv(feat, cin, 64)
        cls = g.dwconv(g.dwconv(stem, 64, 64), 64, 64)
        reg = g.dwconv(g.dwconv(stem, 64, 64), 64, 64)
        cls_out = g.op("Sigmoid", [g.conv(cls, 64, num_classes, act="none")])
        reg_out = g.conv(reg, 64, 4, act="none")
        obj_out = g.op("Sigmoid", [g.conv(reg, 64, 1, act="none")])
        suffix = "" if i == 0 else f"_{i}"
        head = g.op("Concat", [reg_out, obj_out, cls_out], f"/head/Concat{suffix}_output_0", axis=1)
        flats.append(g.op("Reshape", [head, g.const(np.array([1, 5 + num_classes, -1]), np.int64)]))
    out = g.op("Transpose", [g.op("Concat", flats, axis=2)], "output", perm=[0, 2, 1])
    assert out == "output"
    cells = sum((size // s) ** 2 for s in (8, 16, 32))
    onnx.save(g.model("yolox_nano", "images", [1, 3, size, size], [("output", [1, cells, 5 + num_classes])]), str(path))
    return path


# MobileNetV3-Small's bneck table: kernel, expansion, out channels, squeeze-excite, activation, stride
_BNECK = [(3, 16, 16, True, "relu", 2), (3, 72, 24, False, "relu", 2), (3, 88, 24, False, "relu", 1),
          (5, 96, 40, True, "hswish", 2), (5, 240, 40, True, "hswish", 1), (5, 240, 40, True, "hswish", 1),
          (5, 120, 48, True, "hswish", 1), (5, 144, 48, True, "hswish", 1), (5, 288, 96, True, "hswish", 2),
          (5, 576, 96, True, "hswish", 1), (5, 576, 96, True, "hswish", 1)]


def _squeeze_excite(g: _Graph, x: str, ch: int) -> str:
    s = g.conv(g.op("GlobalAveragePool", [x]), ch, max(8, ch // 4), act="relu")
    return g.op("Mul", [x, g.op("HardSigmoid", [g.conv(s, max(8, ch // 4), ch, act="none")], alpha=1 / 6, beta=0.5)])


def mobilenet_v3(path: Path, num_classes: int = 4, size: int = 224, seed: int = 0) -> Path:
    """A MobileNetV3-Small-shaped multi-label classifier [1, 3, size, size] -> sigmoid scores [1, C]."""
    g = _Graph(seed)
    x, cin = g.conv("input", 3, 16, 3, 2, act="hswish"), 16
    for k, exp, out, se, act, s in _BNECK:
        y = g.conv(x, cin, exp, act=act) if exp != cin else x
        y = g.conv(y, exp, exp, k, s, groups=exp, act=act)
        y = _squeeze_excite(g, y, exp) if se else y
        y = g.conv(y, exp, out, act="none")
        x, cin = (g.op("Add", [x, y]) if s == 1 and cin == out else y), out
    x = g.op("Flatten", [g.op("GlobalAveragePool", [g.conv(x, cin, 576, act="hswish")])])
    w1, b1 = g.const(g.rng.normal(0, np.sqrt(2 / 576), (576, 1024))), g.const(np.zeros(1024))
    x = g.op("HardSwish", [g.op("Gemm", [x, w1, b1])])
    w2, b2 = g.const(g.rng.normal(0, np.sqrt(1 / 1024), (1024, num_classes))), g.const(np.zeros(num_classes))
    g.op("Sigmoid", [g.op("Gemm", [x, w2, b2])], "scores")
    onnx.save(g.model("mobilenet_v3_small", "input", [1, 3, size, size], [("scores", [1, num_classes])]), str(path))
    return path
