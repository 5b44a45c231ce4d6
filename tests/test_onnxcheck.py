"""ONNX checks and the YOLOX output-cut surgery (SPEC §5)."""

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from factory import classifier, yolox

from saigeedged.compile import onnxcheck
from saigeedged.errors import SaigeError
from saigeedged.profiles import DETECTION_HEADS


def describe(path: Path) -> onnxcheck.ModelInfo:
    return onnxcheck.describe(onnxcheck.load(path), path)


def test_static_model_is_described(tmp_path: Path) -> None:
    """Input name/shape and output shapes are read from the graph."""
    info = describe(classifier(tmp_path / "c.onnx", 4, (96, 64)))
    assert info.input_name == "input" and info.input_hw == (96, 64)
    assert info.output_shapes == ((1, 4),)


def test_symbolic_output_names_output_and_dim(tmp_path: Path) -> None:
    """A dynamic batch is SYMBOLIC_DIM naming the output and the dim_param."""
    with pytest.raises(SaigeError) as err:
        describe(classifier(tmp_path / "c.onnx", batch="batch"))
    assert err.value.code == "SYMBOLIC_DIM"
    assert "`scores`" in err.value.message and "`batch`" in err.value.message


def test_two_inputs_are_refused(tmp_path: Path) -> None:
    """Exactly one input is supported."""
    with pytest.raises(SaigeError, match="exactly one input") as err:
        describe(classifier(tmp_path / "c.onnx", extra_input=True))
    assert err.value.code == "ONNX_INVALID"


def test_not_an_onnx_file(tmp_path: Path) -> None:
    """Garbage is ONNX_INVALID naming the file."""
    (tmp_path / "x.onnx").write_bytes(b"not protobuf at all")
    with pytest.raises(SaigeError, match="x.onnx") as err:
        onnxcheck.load(tmp_path / "x.onnx")
    assert err.value.code == "ONNX_INVALID"


def test_input_size_derived_or_checked(tmp_path: Path) -> None:
    """input_size defaults to the static ONNX input and must agree with it."""
    info = describe(classifier(tmp_path / "c.onnx", size=(224, 224)))
    assert onnxcheck.check_input_size(info, None) == (224, 224)
    assert onnxcheck.check_input_size(info, (224, 224)) == (224, 224)
    with pytest.raises(SaigeError) as err:
        onnxcheck.check_input_size(info, (256, 128))
    assert err.value.code == "INPUT_SIZE_MISMATCH"


def test_surgery_cuts_at_the_three_heads(tmp_path: Path) -> None:
    """The cut model's outputs are the head tensors, with static shapes, and compute the same values."""
    src = yolox(tmp_path / "best.onnx", num_classes=3, size=(64, 96))
    model = onnxcheck.load(src)
    cut = onnxcheck.cut_outputs(model, src, DETECTION_HEADS, tmp_path / "best_surgery.onnx")
    info = onnxcheck.describe(cut, tmp_path / "best_surgery.onnx")
    assert info.output_names == DETECTION_HEADS
    assert info.output_shapes == ((1, 8, 8, 12), (1, 8, 4, 6), (1, 8, 2, 3))
    assert not any(n.op_type == "Transpose" for n in cut.graph.node)
    x = np.random.default_rng(0).random((1, 3, 64, 96), dtype=np.float32)
    full = ort.InferenceSession(str(src))
    got = ort.InferenceSession(str(tmp_path / "best_surgery.onnx")).run(None, {"images": x})
    assert [g.shape for g in got] == [(1, 8, 8, 12), (1, 8, 4, 6), (1, 8, 2, 3)]
    flat = np.concatenate([g.reshape(1, 8, -1) for g in got], axis=2).transpose(0, 2, 1)
    assert np.allclose(flat, full.run(None, {"images": x})[0], atol=1e-5)


def test_surgery_twice_does_not_append(tmp_path: Path) -> None:
    """Re-cutting to the same path replaces the file."""
    src = yolox(tmp_path / "best.onnx")
    dest = tmp_path / "best_surgery.onnx"
    onnxcheck.cut_outputs(onnxcheck.load(src), src, DETECTION_HEADS, dest)
    size = dest.stat().st_size
    onnxcheck.cut_outputs(onnxcheck.load(src), src, DETECTION_HEADS, dest)
    assert dest.stat().st_size == size
    onnx.checker.check_model(str(dest))


def test_airockchip_style_export_has_no_heads(tmp_path: Path) -> None:
    """Missing head tensors are SURGERY_OUTPUTS_NOT_FOUND with the airockchip hint."""
    src = yolox(tmp_path / "rk.onnx", head_prefix="/model/Concat")
    with pytest.raises(SaigeError) as err:
        onnxcheck.cut_outputs(onnxcheck.load(src), src, DETECTION_HEADS, tmp_path / "x.onnx")
    assert err.value.code == "SURGERY_OUTPUTS_NOT_FOUND"
    assert "/head/Concat_output_0" in err.value.message and "airockchip" in err.value.hint
