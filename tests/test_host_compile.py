"""The host target through `saigeedged compile` (SPEC §6c): a real INT8 model taking raw uint8 NHWC."""

import zipfile
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import yaml
from factory import classifier, collapsing, manifest, random_labels, valjson, yolox

from saigeedged.cli import main as cli
from saigeedged.compile import images
from saigeedged.compile.backends import host


def compile_host(tmp_path: Path, config_path: Path, name: str, **fields: object) -> tuple[int, Path]:
    mf = manifest(tmp_path / f"{name}.yml", target="host", output=str(tmp_path / f"{name}.saigeedge"), **fields)
    return cli.main(["compile", str(mf), "-c", str(config_path)]), tmp_path / f"{name}.saigeedge"


def read_bundle(path: Path) -> tuple[dict, bytes]:
    with zipfile.ZipFile(path) as zf:
        ckpt = yaml.safe_load(zf.read("checkpoint.yaml"))
        return ckpt, zf.read(ckpt["model"])


def test_detector_compiles_to_uint8_nhwc_int8(tmp_path: Path, config_path: Path) -> None:
    """The bundle's model takes uint8 [1,H,W,3], holds Q/DQ nodes and gives the cut outputs' shapes."""
    yolox(tmp_path / "det.onnx", size=(64, 64))
    calib = valjson(tmp_path / "data", random_labels(12, 3))
    code, out = compile_host(tmp_path, config_path, "det", task="detection", num_classes=3, calib=str(calib), n_samples=8)
    assert code == 0
    ckpt, model_bytes = read_bundle(out)
    assert ckpt["task"] == "detection_yolox" and ckpt["target"] == "host" and ckpt["model"] == "det_surgery.int8.onnx"
    assert ckpt["input_layout"] == "nhwc_uint8" and ckpt["normalize"] is False
    assert ckpt["output_shapes"] == [[1, 8, 8, 8], [1, 8, 4, 4], [1, 8, 2, 2]]
    assert ckpt["quantization"]["n_samples"] == 8
    model = onnx.load_from_string(model_bytes)
    ops = {n.op_type for n in model.graph.node}
    assert {"QuantizeLinear", "DequantizeLinear"} <= ops
    session = ort.InferenceSession(model_bytes)
    (inp,) = session.get_inputs()
    assert inp.type == "tensor(uint8)" and inp.shape == [1, 64, 64, 3]
    x = np.random.default_rng(1).integers(0, 256, (1, 64, 64, 3), dtype=np.uint8)
    assert [o.shape for o in session.run(None, {inp.name: x})] == [(1, 8, 8, 8), (1, 8, 4, 4), (1, 8, 2, 2)]


def test_report_agrees_with_the_float_model(tmp_path: Path, config_path: Path) -> None:
    """The reported cosine is what the float and INT8 models give on the calibration images."""
    src = classifier(tmp_path / "cls.onnx", 4, (224, 224))
    calib = valjson(tmp_path / "data", random_labels(6, 4))
    code, out = compile_host(tmp_path, config_path, "cls", task="mlc", num_classes=4, calib=str(calib))
    assert code == 0
    ckpt, model_bytes = read_bundle(out)
    row = ckpt["quantization_report"]["outputs"]["scores"]
    assert ckpt["quantization_report"]["images"] == 6 and not row["flagged"]
    int8 = ort.InferenceSession(model_bytes)
    ref = ort.InferenceSession(str(src))
    cosines, errors = [], []
    for p in sorted((tmp_path / "data" / "images").iterdir()):
        u8 = images.load_rgb(p, (224, 224), letterbox=False)
        want = ref.run(None, {"input": (u8.astype(np.float32) / 255).transpose(2, 0, 1)[None]})[0]
        got = int8.run(None, {"input": u8[None]})[0]
        cosines.append(host.cosine(want, got))
        errors.append(float(np.abs(want - got).max()))
    assert row["cosine"] == pytest_approx(min(cosines))
    assert row["max_abs_error"] == pytest_approx(max(errors))


def pytest_approx(value: float):  # type: ignore[no-untyped-def]
    import pytest

    return pytest.approx(value, abs=2e-3)


def test_collapsing_output_is_flagged(tmp_path: Path, config_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    """A sigmoid fed a badly scaled input collapses under INT8 and is flagged in the bundle and the log."""
    collapsing(tmp_path / "bad.onnx", (32, 32))
    data = tmp_path / "data"
    calib = valjson(data, [[0]] * 6, n_classes=1, grey=128)
    images.Image.fromarray(np.full((32, 32, 3), 255, np.uint8)).save(data / "images" / "img0000.jpg", quality=100)
    code, out = compile_host(tmp_path, config_path, "bad", task="mlc", num_classes=1, calib=str(calib),
                             input_size=[32, 32])
    assert code == 0
    ckpt, _ = read_bundle(out)
    report = ckpt["quantization_report"]
    assert report["flagged"] == ["prob"] and report["outputs"]["prob"]["cosine"] < 0.99
    log = next((tmp_path / "state" / "logs").glob("bad-*.log")).read_text()
    assert "FLAGGED" in log
