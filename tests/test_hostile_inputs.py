"""Hostile inputs beside the manifest (issue 9 classes 6 and 7, issue 8 item 13): broken calibration files, odd
images and names, external data, and multi-model inputs elsewhere in the inbox."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from factory import classifier, image, yolox
from harness import drop
from hostile import canary, final
from PIL import Image

from saigeedged.compile import calibration
from saigeedged.compile.images import load_rgb, to_rgb
from saigeedged.compile.inputs import sha256_file
from saigeedged.errors import SaigeError

GOOD_COCO = {"images": [{"id": 1, "file_name": "a.jpg"}], "annotations": [{"image_id": 1, "category_id": 7}],
             "categories": [{"id": 7, "name": "x"}]}
BROKEN_COCO = [  # each a COCO instances file of the wrong shape
    {**GOOD_COCO, "images": None},
    {**GOOD_COCO, "images": [{"file_name": "a.jpg"}]},
    {**GOOD_COCO, "images": [{"id": 1}]},
    {**GOOD_COCO, "images": [{"id": 1, "file_name": 5}]},
    {**GOOD_COCO, "images": [["not", "a", "mapping"]]},
    {**GOOD_COCO, "images": [{"id": [1], "file_name": "a.jpg"}]},
    {**GOOD_COCO, "annotations": 3},
    {**GOOD_COCO, "annotations": ["x"]},
    {**GOOD_COCO, "categories": [{"name": "no id"}]},
    {**GOOD_COCO, "categories": [{"id": 1}, {"id": "b"}]},
    {**GOOD_COCO, "categories": "x"},
    {**GOOD_COCO, "images": [{"id": 1, "file_name": "a\0b.jpg"}]},
]


@pytest.mark.parametrize("coco", BROKEN_COCO)
def test_broken_coco_is_calib_invalid(tmp_path: Path, coco: dict[str, Any]) -> None:
    """Every malformed COCO file is CALIB_INVALID naming the file, never another error."""
    image(tmp_path / "a.jpg", 0)
    path = tmp_path / "instances.json"
    path.write_text(json.dumps(coco))
    with pytest.raises(SaigeError) as caught:
        calibration.read(path, 1)
    assert caught.value.code == "CALIB_INVALID" and "instances.json" in caught.value.message


def test_sixteen_bit_grey_is_scaled_not_clipped(tmp_path: Path) -> None:
    """16-bit grey PNGs (and 32-bit grey in memory) keep their gradient on the host target instead of turning white."""
    ramp = np.linspace(0, 65535, 64 * 64).reshape(64, 64)
    path = tmp_path / "g.png"
    Image.fromarray(ramp.astype(np.uint16)).save(path)
    rgb = load_rgb(path, (64, 64), letterbox=False)
    wide = np.asarray(to_rgb(Image.fromarray(ramp.astype(np.int32))))
    for pixels in (rgb, wide):
        assert 100 < pixels.mean() < 155 and pixels.min() == 0 and pixels.max() >= 250


def test_image_names_with_newlines_stage_one_line_each(tmp_path: Path) -> None:
    """An image name holding a newline or an escape still gives one dataset.txt line per image, each a real file."""
    names = ["new\nline.jpg", "esc\x1b[2J.jpg", "plain.jpg"]
    samples = [calibration.Sample(image(tmp_path / name, i), (0,)) for i, name in enumerate(names)]
    dataset = calibration.stage(samples, tmp_path / "work")
    lines = dataset.read_text().splitlines()
    assert len(lines) == 3 and all(Path(line).is_file() for line in lines)


def external(path: Path, location: str | None = None) -> Path:
    """A classifier whose weights live in an external-data file beside it (`<name>.data`, or `location`)."""
    model = onnx.load(str(classifier(path, 3, (32, 32))))
    onnx.save(model, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
              location=location or f"{path.name}.data", size_threshold=0)
    return path


def test_submit_takes_a_models_external_data_with_it(daemon: Any, det_inputs: dict[str, Any], tmp_path: Path) -> None:
    """`saigeedged submit` of a model whose weights are in a file beside it copies that file too (it copied the model
    alone, and the job always failed ONNX_INVALID); while a file of that name waits in the inbox, it refuses."""
    import subprocess
    import sys

    d = daemon()
    (tmp_path / "src").mkdir()
    src = external(tmp_path / "src" / "ext.onnx")
    mf = tmp_path / "src" / "ext.yml"
    mf.write_text(json.dumps({"task": "mlc", "num_classes": 3, "input_size": [32, 32], "n_samples": 4, "target": "host",
                              "calib": det_inputs["manifest"]["calib"]}))
    submit = [sys.executable, "-m", "saigeedged", "submit", str(src), str(mf), "-c", str(d.config)]
    run = subprocess.run([*submit, "--wait", "--timeout", "120"], capture_output=True, text=True)
    assert run.returncode == 0 and "succeeded" in run.stdout, run.stdout + run.stderr
    assert not (d.inbox / "ext.onnx.data").exists()  # claimed with the model
    (d.inbox / "ext.onnx.data").write_bytes(b"another drop's weights")
    refused = subprocess.run(submit, capture_output=True, text=True)
    assert refused.returncode == 2 and "INPUT_INCOMPLETE" in refused.stderr and "ext.onnx.data" in refused.stderr
    assert (d.inbox / "ext.onnx.data").read_bytes() == b"another drop's weights"


def test_external_data_travels_with_the_drop(daemon: Any, det_inputs: dict[str, Any], tmp_path: Path) -> None:
    """An ONNX with its external data beside it in the drop compiles; one whose data is a symlink out of the drop fails."""
    d = daemon()
    calib = det_inputs["manifest"]["calib"]
    base = {"task": "mlc", "num_classes": 3, "input_size": [32, 32], "calib": calib, "n_samples": 4}
    (tmp_path / "src").mkdir()
    src = external(tmp_path / "src" / "ext.onnx")
    team = d.inbox / "team"
    team.mkdir()
    (team / "ext.onnx.data").write_bytes((tmp_path / "src" / "ext.onnx.data").read_bytes())
    drop(team, "ext", src, base)
    done = final(d, "ext.yml")
    assert done["state"] == "succeeded", done
    assert not (team / "ext.onnx.data").exists()  # claimed with the model, deleted on success
    secret = tmp_path / "secret.data"
    secret.write_bytes((tmp_path / "src" / "ext.onnx.data").read_bytes())
    (team / "leak.onnx.data").symlink_to(secret)
    drop(team, "leak", external(tmp_path / "src" / "leak.onnx"), base)
    leak = final(d, "leak.yml")
    assert leak["state"] == "failed" and leak["error"]["code"] == "ONNX_INVALID", leak
    canary(d, det_inputs)


def test_multi_model_inputs_elsewhere_in_the_inbox(daemon: Any, det_inputs: dict[str, Any], tmp_path: Path) -> None:
    """`onnx: ../shared/x.onnx` is claimed; two such inputs with the same file name each compile their own model."""
    d = daemon()
    for folder, seed in (("a", 1), ("b", 2)):
        (d.inbox / "shared" / folder).mkdir(parents=True)
        yolox(d.inbox / "shared" / folder / "m.onnx", size=(64, 64), seed=seed)
    digests = {f: sha256_file(d.inbox / "shared" / f / "m.onnx") for f in ("a", "b")}
    assert digests["a"] != digests["b"]
    batch = {"target": "host", "models": [{**det_inputs["manifest"], "onnx": f"../shared/{f}/m.onnx", "name": f"model_{f}"}
                                          for f in ("a", "b")]}
    (d.inbox / "team").mkdir()
    (d.inbox / "team" / "batch.yml").write_text(json.dumps(batch))
    for f in ("a", "b"):
        doc = d.wait_job(f"model_{f}", timeout=120)
        assert doc["state"] == "succeeded" and doc["inputs"]["onnx_sha256"] == digests[f], doc
    assert not list((d.inbox / "shared").rglob("*.onnx"))
    canary(d, det_inputs)


def test_calibration_edge_cases_in_the_daemon(daemon: Any, det_inputs: dict[str, Any], tmp_path: Path) -> None:
    """A broken COCO file fails CALIB_INVALID naming it; 16-bit grey images with odd names compile; the canary follows."""
    data = tmp_path / "data"
    coco = data / "broken" / "instances.json"
    coco.parent.mkdir(parents=True)
    coco.write_text(json.dumps(BROKEN_COCO[1]))
    odd = data / "odd"
    odd.mkdir()
    rows = []
    for i, name in enumerate(["grey\nnewline.png", "esc\x1b[1m.png", "plain.png"]):
        ramp = (np.linspace(0, 65535, 48 * 64).reshape(48, 64) * (i + 1) / 3).astype(np.uint16)
        Image.fromarray(ramp).save(odd / name)
        rows.append({"image": name, "labels": [i]})
    (odd / "val.json").write_text(json.dumps({"n_classes": 3, "validation": rows}))
    d = daemon()
    drop(d.inbox, "coco", det_inputs["onnx"], {**det_inputs["manifest"], "calib": str(coco)})
    drop(d.inbox, "odd", det_inputs["onnx"], {**det_inputs["manifest"], "calib": str(odd / "val.json")})
    bad = final(d, "coco.yml")
    assert bad["error"]["code"] == "CALIB_INVALID" and "instances.json" in bad["error"]["message"], bad
    assert final(d, "odd.yml")["state"] == "succeeded"
    canary(d, det_inputs)
