"""Channel order (SPEC §14): bundles take RGB; a model trained on BGR gets its channels reversed on every target."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import yaml
from factory import manifest, random_labels, valjson, yolox
from onnx import TensorProto, helper
from PIL import Image

from saigeedged.cli import main as cli
from saigeedged.cli.examples import OPSET
from saigeedged.compile import images
from saigeedged.profiles import IMAGENET_MEAN, IMAGENET_STD

COLOURS = [(200, 100, 30), (30, 100, 200), (0, 0, 0), (255, 255, 255), (90, 160, 20)]


def channel_means(path: Path, size: int = 32) -> Path:
    """A model whose outputs are the per-channel means of its input: [1, 3, H, W] -> [1, 3]."""
    node = helper.make_node("ReduceMean", ["input"], ["means"], axes=[2, 3], keepdims=0)
    graph = helper.make_graph([node], "means", [helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, 3, size, size])],
                              [helper.make_tensor_value_info("means", TensorProto.FLOAT, [1, 3])])
    onnx.save(helper.make_model(graph, opset_imports=OPSET), str(path))
    return path


def solid_calibration(folder: Path) -> Path:
    """Solid-colour images so the INT8 ranges cover every mean the test feeds."""
    (folder / "images").mkdir(parents=True, exist_ok=True)
    rows = []
    for i, rgb in enumerate(COLOURS):
        path = folder / "images" / f"c{i}.png"
        Image.fromarray(np.full((32, 32, 3), rgb, np.uint8)).save(path)
        rows.append({"image": str(path), "labels": [0]})
    (folder / "val.json").write_text(json.dumps({"n_classes": 3, "validation": rows}))
    return folder / "val.json"


@pytest.mark.parametrize(("channels", "expected"), [("rgb", (200, 100, 30)), ("bgr", (30, 100, 200))])
def test_host_bundle_takes_rgb_and_feeds_the_model_its_channel_order(tmp_path: Path, config_path: Path,
                                                                      channels: str, expected: tuple[int, ...]) -> None:
    """Fed one RGB image, the host bundle of a per-channel-mean model gives the means in the trained channel order."""
    channel_means(tmp_path / "means.onnx")
    calib = solid_calibration(tmp_path / "data")
    out = tmp_path / "means.saigeedge"
    mf = manifest(tmp_path / "means.yml", task="mlc", num_classes=3, calib=str(calib), target="host",
                  input_size=[32, 32], output=str(out), input_channels=channels, calibration_method="minmax")
    assert cli.main(["compile", str(mf), "-c", str(config_path)]) == 0
    with zipfile.ZipFile(out) as zf:
        ckpt = yaml.safe_load(zf.read("checkpoint.yaml"))
        session = ort.InferenceSession(zf.read(ckpt["model"]))
    assert ckpt["input_channels"] == channels
    rgb = np.full((1, 32, 32, 3), (200, 100, 30), np.uint8)
    (got,) = session.run(None, {session.get_inputs()[0].name: rgb})
    assert np.allclose(got[0], np.array(expected) / 255, atol=0.02)


def test_validate_and_dry_run_print_the_channel_order(tmp_path: Path, config_path: Path, capsys: Any) -> None:
    """`validate` and `compile --dry-run` print the resolved channel order: the profile default or the manifest's."""
    yolox(tmp_path / "det.onnx", size=(64, 64))
    calib = valjson(tmp_path / "data", random_labels(4, 3))
    det = manifest(tmp_path / "det.yml", task="detection", num_classes=3, calib=str(calib))
    assert cli.main(["validate", str(det), "-c", str(config_path)]) == 0
    assert "channels    bgr" in capsys.readouterr().out
    det = manifest(tmp_path / "det.yml", task="detection", num_classes=3, calib=str(calib), input_channels="rgb")
    assert cli.main(["compile", str(det), "--dry-run", "-c", str(config_path)]) == 0
    assert "channels    rgb" in capsys.readouterr().out
    bad = manifest(tmp_path / "bad.yml", task="detection", num_classes=3, calib=str(calib), onnx="det.onnx",
                   input_channels="bgra")
    assert cli.main(["validate", str(bad), "-c", str(config_path)]) == 2
    assert "`input_channels` must be one of rgb, bgr" in capsys.readouterr().err


def keep_work(config: Path) -> None:
    data = yaml.safe_load(config.read_text())
    data["keep_work"] = True
    config.write_text(yaml.safe_dump(data))


@pytest.mark.docker
@pytest.mark.parametrize(("channels", "reverse"), [(None, True), ("rgb", False)])
def test_cubie_inputmeta_reverse_channel_follows_the_order(tmp_path: Path, docker_config: Path, channels: str | None,
                                                           reverse: bool) -> None:
    """The patched inputmeta has reverse_channel true for bgr (detection's default) and false for rgb."""
    keep_work(docker_config)
    yolox(tmp_path / "det.onnx", size=(64, 64))
    calib = valjson(tmp_path / "data", random_labels(4, 3))
    extra = {"input_channels": channels} if channels else {}
    mf = manifest(tmp_path / "det.yml", task="detection", num_classes=3, calib=str(calib),
                  output=str(tmp_path / "det.saigeedge"), **extra)
    assert cli.main(["compile", str(mf), "-c", str(docker_config)]) == 0
    meta = yaml.safe_load((tmp_path / "cubie_work_det" / "det_surgery_inputmeta.yml").read_text())
    pre = meta["input_meta"]["databases"][0]["ports"][0]["preprocess"]
    assert pre["reverse_channel"] is reverse and pre["preproc_node_params"]["preproc_type"] == "IMAGE_RGB"
    with zipfile.ZipFile(tmp_path / "det.saigeedge") as zf:
        assert yaml.safe_load(zf.read("checkpoint.yaml"))["input_channels"] == ("bgr" if reverse else "rgb")


@pytest.mark.docker
def test_mobilint_calibration_tensors_are_bgr_for_a_bgr_model(tmp_path: Path, docker_config: Path) -> None:
    """For `input_channels: bgr` the .npy calibration tensors hold the image's channels reversed."""
    from factory import classifier

    keep_work(docker_config)
    classifier(tmp_path / "person.onnx", 4, (256, 128))
    calib = valjson(tmp_path / "data", random_labels(3, 4))
    mf = manifest(tmp_path / "person.yml", task="reid", num_classes=4, calib=str(calib), target="mobilint",
                  device="aries-rb", input_channels="bgr", output=str(tmp_path / "person.saigeedge"))
    assert cli.main(["compile", str(mf), "-c", str(docker_config)]) == 0
    work = tmp_path / "cubie_work_person"
    staged = sorted((work / "calib").iterdir())[0]
    bgr = images.load_rgb(staged, (256, 128), letterbox=False)[..., ::-1]
    assert np.allclose(np.load(work / "calib_npy" / "0000.npy"), images.normalized(bgr, IMAGENET_MEAN, IMAGENET_STD))
