"""The mobilint target (SPEC §6b) through `saigeedged compile` and the stand-in qbcompiler image."""

from __future__ import annotations

import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from conftest import STANDIN_MOBILINT
from factory import classifier, manifest, random_labels, valjson, yolox

from saigeedged.cli import main as cli
from saigeedged.compile import images
from saigeedged.compile.backends import mobilint
from saigeedged.profiles import IMAGENET_MEAN, IMAGENET_STD


class Ctx:
    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []

    def progress(self, event: dict[str, Any]) -> None:
        self.events.append(event)


def test_argv_and_presets() -> None:
    """parse/quantize argv as the SPEC lists them, with the task's default preset."""
    assert mobilint.parse_args("m", "aries-rb") == ["parse", "--model", "m.onnx", "--backend", "onnx",
                                                    "--target-device", "aries-rb", "--output", "m.mblt"]
    assert mobilint.quantize_args("m", "regulus-rb", "detection")[-2:] == ["--config-preset", "detection"]
    argv = mobilint.quantize_args("m", "regulus-rb", None, "cpu")
    assert argv[-4:] == ["--device", "cpu", "--config-save-path", "m_config.yaml"]
    assert mobilint.parse_args("m", "aries-rb", "cpu")[-2:] == ["--device", "cpu"]


def test_output_events_are_read() -> None:
    """JSON progress events are forwarded; `error` events and `ERROR [CODE]: message` lines are captured."""
    ctx = Ctx()
    events = mobilint.Events(ctx, "quantize")  # type: ignore[arg-type]
    events.lines.feed(b'{"type": "progress", "done": 1, "tot')
    events.lines.feed(b'al": 4}\nplain log\n{"type": "error", "code": "INTERNAL_ERROR", "message": "boom"}\n')
    assert ctx.events == [{"step": "quantize", "done": 1, "total": 4}]
    assert events.error == ("INTERNAL_ERROR", "boom")
    other = mobilint.Events(ctx, "parse")  # type: ignore[arg-type]
    other.lines.feed(b"ERROR [ARGUMENT_ERROR]: invalid target device 'x'")
    other.lines.flush()
    assert other.error == ("ARGUMENT_ERROR", "invalid target device 'x'")


pytest_docker = pytest.mark.docker


def setup(tmp_path: Path, name: str, task: str = "mlc", device: str = "regulus-rb", **fields: Any) -> Path:
    size = {"mlc": (224, 224), "reid": (256, 128)}.get(task)
    if task == "detection":
        yolox(tmp_path / f"{name}.onnx", size=(64, 64))
    else:
        classifier(tmp_path / f"{name}.onnx", 3, size or (224, 224))
    calib = valjson(tmp_path / "data", random_labels(5, 3))
    return manifest(tmp_path / f"{name}.yml", task=task, num_classes=3, calib=str(calib), target="mobilint",
                    device=device, output=str(tmp_path / f"{name}.saigeedge"), **fields)


@pytest_docker
def test_classifier_to_mxq(tmp_path: Path, docker_config: Path) -> None:
    """A regulus-rb classifier compiles to a bundle with the .mxq, the saved compiler config and the info JSON
    (and .mblt with keep_mblt)."""
    assert cli.main(["compile", str(setup(tmp_path, "tags", keep_mblt=True)), "-c", str(docker_config)]) == 0
    with zipfile.ZipFile(tmp_path / "tags.saigeedge") as zf:
        ckpt = yaml.safe_load(zf.read("checkpoint.yaml"))
        assert sorted(zf.namelist()) == ["calib_digests.txt", "checkpoint.yaml", "tags.mblt", "tags.mxq",
                                         "tags_config.yaml", "tags_info.json"]
        assert zf.read("tags.mxq").startswith(b"MXQ1regulus-rb")
    assert ckpt["target"] == "mobilint" and ckpt["model"] == "tags.mxq" and ckpt["platform"] == {"device": "regulus-rb"}
    assert ckpt["quantization"]["preset"] == "classification" and ckpt["task"] == "mlc"


@pytest_docker
def test_calibration_tensors(tmp_path: Path, docker_config: Path) -> None:
    """reid tensors are HWC float32 at input_size with ImageNet normalisation; detection is letterboxed."""
    data = yaml.safe_load(docker_config.read_text())
    data["keep_work"] = True
    docker_config.write_text(yaml.safe_dump(data))
    assert cli.main(["compile", str(setup(tmp_path, "person", task="reid")), "-c", str(docker_config)]) == 0
    work = tmp_path / "cubie_work_person"
    listed = (work / "calib.txt").read_text().split()
    assert len(listed) == 5
    assert all(p.endswith(f"/calib_npy/{i:04d}.npy") for i, p in enumerate(listed))
    first = np.load(work / "calib_npy" / "0000.npy")  # the work dir moved next to the output
    assert first.shape == (256, 128, 3) and first.dtype == np.float32
    staged = sorted((work / "calib").iterdir())[0]
    want = images.normalized(images.load_rgb(staged, (256, 128), letterbox=False), IMAGENET_MEAN, IMAGENET_STD)
    assert np.allclose(first, want)
    box = images.load_rgb(staged, (128, 128), letterbox=True)
    assert (box[96:] == 114).all()  # 48x64 image letterboxed into 128x128: bottom rows are padding


@pytest_docker
@pytest.mark.parametrize(("name", "text"), [("qbfail", "INTERNAL_ERROR: unsupported layer 'If'"),
                                            ("qbnooutput", "wrote no qbnooutput.mblt")])
def test_failures(tmp_path: Path, docker_config: Path, capsys: Any, name: str, text: str) -> None:
    """An error event becomes STEP_FAILED with the tool's code; a missing output after exit 0 too."""
    assert cli.main(["compile", str(setup(tmp_path, name)), "-c", str(docker_config)]) == 1
    out = capsys.readouterr().out
    assert f"FAIL  {name}: STEP_FAILED" in out and text in out


def test_chip_name_is_refused(tmp_path: Path, config_path: Path, capsys: Any) -> None:
    """`device: ARIES` is MANIFEST_INVALID listing the exact device strings."""
    assert cli.main(["validate", str(setup(tmp_path, "chip", device="ARIES")), "-c", str(config_path)]) == 2
    assert "aries-rb, regulus-ra, regulus-rb, regulus-rb-usb" in capsys.readouterr().err


@pytest_docker
def test_check_reports_qbcompiler(docker_config: Path, capsys: Any) -> None:
    """check finds the qbcompiler image and its entry point."""
    assert cli.main(["check", "-c", str(docker_config)]) == 0
    out = capsys.readouterr().out
    assert f"mobilint {STANDIN_MOBILINT}" in out and "python3 -m qbcompiler" in out
    assert "qb Compiler 1.3.0" in out
