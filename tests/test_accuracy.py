"""The accuracy report and gate (SPEC §17): held-out images, float vs compiled numbers, the gate, its surfaces."""

from __future__ import annotations

import hashlib
import json
import os
import warnings
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import yaml
from factory import classifier, image, infinite, manifest, random_labels, unbounded, undefined, valjson, yolox
from harness import container_output, drop, reported_beside
from realmodels import yolox_nano

from saigeedged.cli import main as cli
from saigeedged.compile import accuracy, calibration, evaluate, images, report
from saigeedged.compile.backends import host
from saigeedged.compile.calibration import CalibSet, Sample
from saigeedged.manifest import Entry
from saigeedged.profiles import DETECTION_HEADS, PROFILES, mean_scale


def _set(labels: list[list[int]]) -> CalibSet:
    return CalibSet(Path("val.json"), tuple(Sample(Path(f"/d/{i}.jpg"), tuple(lab)) for i, lab in enumerate(labels)), None)


def test_held_out_images_are_disjoint_deterministic_and_balanced() -> None:
    """The held-out images are none of the calibration images, the same on every call, and cover every class."""
    calib = _set(random_labels(60, 4, seed=3))
    chosen = calibration.pick(calib, 20, 7, "balanced")
    held = calibration.held_out(calib, chosen, 16, 7, "balanced")
    assert len(held) == 16 and not {s.image for s in held} & {s.image for s in chosen}
    assert held == calibration.held_out(calib, chosen, 16, 7, "balanced")
    assert {c for s in held for c in s.labels} == {0, 1, 2, 3}
    few = calibration.held_out(calib, calibration.pick(calib, 55, 7, "balanced"), 16, 7, "balanced")
    assert len(few) == 5  # fewer remain: what there is


def test_map_and_nms_on_known_boxes() -> None:
    """mAP@0.5 is 1 for exact boxes, 0.5 when one class of two is missed, and NMS drops an overlapping duplicate."""
    truth = [(np.array([[0, 0, 10, 10], [20, 20, 30, 30]], float), np.array([0, 1]))]
    exact = accuracy.Detections(truth[0][0], np.array([0.9, 0.8]), np.array([0, 1]))
    assert accuracy.map50([exact], truth, 2) == pytest.approx(1.0)
    half = accuracy.Detections(truth[0][0][:1], np.array([0.9]), np.array([0]))
    assert accuracy.map50([half], truth, 2) == pytest.approx(0.5)
    dup = accuracy.nms(np.array([[0, 0, 10, 10], [1, 1, 10, 10], [50, 50, 60, 60]], float), np.array([0.9, 0.8, 0.7]),
                       np.array([0, 0, 0]))
    assert dup.scores.tolist() == [0.9, 0.7]


def _tied_detections(rng: np.random.Generator, n_images: int) -> tuple[list[accuracy.Detections], list[Any]]:
    """Per image two labelled boxes and three detections whose scores sit on 4 INT8-like levels (they tie across
    images), one of them a miss."""
    found, truth = [], []
    for _ in range(n_images):
        corner = rng.uniform(0, 200, (2, 2))
        boxes = np.concatenate([corner, corner + 40], 1)
        det = np.concatenate([boxes, boxes[:1] + 60])  # the third detection overlaps no labelled box
        found.append(accuracy.Detections(det, rng.integers(1, 5, 3) / 4.0, np.array([0, 0, 0])))
        truth.append((boxes, np.array([0, 0])))
    return found, truth


def test_map_and_gate_do_not_depend_on_the_order_of_the_images() -> None:
    """Tied scores enter the precision/recall curve together: every order of the same held-out images gives the same
    detection mAP, the same multi-label mAP and so the same gate decision."""
    from saigeedged.compile import report

    rng = np.random.default_rng(5)
    found, truth = _tied_detections(rng, 16)
    scores = rng.integers(0, 4, (16, 3)) / 4.0  # a classifier's INT8 scores: 4 levels, ties across images
    labels = rng.random((16, 3)) < 0.5
    gate = {"min_cosine": 0.0, "max_map_drop": 0.1}
    seen = set()
    for _ in range(40):
        order = rng.permutation(16)
        det_map = accuracy.map50([found[i] for i in order], [truth[i] for i in order], 1)
        mlc_map = accuracy.multilabel_map(scores[order], labels[order])
        assert det_map is not None and mlc_map is not None
        verdict = report.judge({"outputs": {}, "task": {"metric": "mAP@0.5", "drop": round(0.75 - det_map, 6)}}, gate)
        seen.add((round(det_map, 12), round(mlc_map, 12), tuple(verdict)))
    assert len(seen) == 1, seen


def _greedy_nms(boxes: np.ndarray, scores: np.ndarray, classes: np.ndarray) -> list[int]:
    """Textbook per-class greedy NMS over the full IoU matrix, written here independently of accuracy.nms."""
    order = np.argsort(-scores, kind="stable")
    b = boxes[order]
    wh = np.clip(np.minimum(b[:, None, 2:], b[None, :, 2:]) - np.maximum(b[:, None, :2], b[None, :, :2]), 0, None)
    inter = wh[..., 0] * wh[..., 1]
    area = (b[:, 2] - b[:, 0]) * (b[:, 3] - b[:, 1])
    iou = inter / (area[:, None] + area[None, :] - inter)
    kept: list[int] = []
    dead = np.zeros(len(order), bool)
    for i in range(len(order)):
        if not dead[i]:
            kept.append(int(order[i]))
            dead |= (iou[i] > accuracy.IOU_NMS) & (classes[order] == classes[order][i])
    return kept[:accuracy.MAX_DETECTIONS]


def test_nms_keeps_what_greedy_nms_over_every_pair_keeps() -> None:
    """The row-at-a-time NMS keeps exactly the boxes, in the same order, that greedy NMS over the whole IoU matrix
    keeps, with tied scores and duplicate boxes among thousands of candidates."""
    rng = np.random.default_rng(2)
    for n in (1, 40, 3000):
        corner = rng.uniform(0, 600, (n, 2))
        boxes = np.concatenate([corner, corner + rng.uniform(1, 80, (n, 2))], 1)
        boxes[: n // 10] = boxes[0]
        scores, classes = np.round(rng.uniform(0, 1, n), 2), rng.integers(0, 3, n)
        kept = accuracy.nms(boxes, scores, classes)
        want = _greedy_nms(boxes, scores, classes)
        assert kept.scores.tolist() == scores[want].tolist() and np.array_equal(kept.boxes, boxes[want])


def _compile(tmp_path: Path, config_path: Path, name: str, onnx_path: Path, **fields: Any) -> tuple[int, Path]:
    out = tmp_path / f"{name}.saigeedge"
    mf = manifest(tmp_path / f"{name}.yml", target="host", output=str(out), onnx=str(onnx_path), **fields)
    return cli.main(["compile", str(mf), "-c", str(config_path)]), out


def _members(path: Path) -> tuple[dict[str, Any], dict[str, Any], bytes]:
    with zipfile.ZipFile(path) as zf:
        ckpt = yaml.safe_load(zf.read("checkpoint.yaml"))
        return ckpt, json.loads(zf.read("accuracy.json")), zf.read(ckpt["model"])


def _float_heads(src: Path) -> ort.InferenceSession:
    """The float ONNX with its three head tensors as outputs (what the surgery keeps), built here with onnx."""
    model = onnx.load(str(src))
    model.graph.output.extend([onnx.ValueInfoProto(name=n) for n in DETECTION_HEADS])
    return ort.InferenceSession(model.SerializeToString())


def test_host_report_is_what_onnxruntime_gives(tmp_path: Path, config_path: Path) -> None:
    """Every per-output cosine and max abs error of accuracy.json is recomputed from the float ONNX and the INT8
    model on the held-out images, fed as the board is (uint8 RGB to the bundle, BGR /255 NCHW to the float model)."""
    src = yolox(tmp_path / "det.onnx", size=(64, 64))
    calib = valjson(tmp_path / "data", random_labels(30, 3))
    code, out = _compile(tmp_path, config_path, "det", src, task="detection", num_classes=3, calib=str(calib),
                         n_samples=8, eval_samples=12)
    assert code == 0
    ckpt, rep, model_bytes = _members(out)
    assert rep["method"] == "int8" and rep["images"] == 12 and len(rep["worst_layers"]) == 10
    assert rep["layer_images"] == evaluate.LAYER_IMAGES < 12  # the per-layer table on a few images only
    assert rep["cost"]["seconds"] > 0 and rep["cost"]["peak_rss_bytes"] > 50 << 20  # the child's, onnxruntime loaded
    assert rep["cost"]["nice"] == min(19, os.nice(0) + report.REPORT_NICE)  # the child yields the CPU to compiles
    assert rep["gate"]["passed"] and rep["task"]["labels"].startswith("the calibration file has no boxes")
    staged = {Path(p).name for p in (tmp_path / "data" / "images").iterdir()}
    assert set(rep["held_out"]) <= staged
    ref, int8 = _float_heads(src), ort.InferenceSession(model_bytes)
    cos: dict[str, list[float]] = {n: [] for n in DETECTION_HEADS}
    err = dict.fromkeys(DETECTION_HEADS, 0.0)
    for name in rep["held_out"]:
        u8 = images.load_rgb(tmp_path / "data" / "images" / name, (64, 64), letterbox=True)
        want = ref.run(list(DETECTION_HEADS), {"images": (u8[..., ::-1].astype(np.float32) / 255).transpose(2, 0, 1)[None]})
        got = int8.run(list(DETECTION_HEADS), {"images": u8[None]})
        for head, w, g in zip(DETECTION_HEADS, want, got, strict=True):
            w64, g64 = w.astype(np.float64).ravel(), g.astype(np.float64).ravel()
            cos[head].append(float(w64 @ g64 / np.linalg.norm(w64) / np.linalg.norm(g64)))
            err[head] = max(err[head], float(np.abs(w64 - g64).max()))
    for head in DETECTION_HEADS:
        assert rep["outputs"][head]["cosine"] == pytest.approx(min(cos[head]), abs=1e-4)
        assert rep["outputs"][head]["max_abs_error"] == pytest.approx(err[head], abs=1e-3)
    assert ckpt["quantization_report"]  # the §6c report stays


def test_mlc_report_has_map_on_both_models(tmp_path: Path, config_path: Path) -> None:
    """A classifier's report holds mAP against the labels for the float and the INT8 model, and their drop."""
    src = classifier(tmp_path / "cls.onnx", 4, (224, 224))
    calib = valjson(tmp_path / "data", random_labels(20, 4))
    # the gate off for the drop: this untrained classifier's INT8 scores tie across images (they span a few uint8
    # steps), and tied scores enter the ranking together, so its INT8 mAP is below the float one by more than 0.1
    code, out = _compile(tmp_path, config_path, "cls", src, task="mlc", num_classes=4, calib=str(calib), n_samples=6,
                         accuracy={"max_map_drop": 1.0})
    assert code == 0
    _, rep, _ = _members(out)
    task = rep["task"]
    assert rep["images"] == 14 and task["metric"] == "mAP" and 0 < task["float"] <= 1
    assert task["drop"] == pytest.approx(task["float"] - task["compiled"], abs=1e-5)


def test_the_next_host_job_compiles_while_the_report_is_made(daemon: Any, tmp_path: Path) -> None:
    """A host job hands its report to the finishing stage after its quantize and §6c report: the next job starts before
    the first one ends (its compile does not wait for the report), and both succeed with their reports, published."""
    calib = valjson(tmp_path / "data", random_labels(40, 3))
    fields = {"task": "detection", "num_classes": 3, "calib": str(calib), "n_samples": 8}
    d = daemon()
    drop(d.inbox, "first", yolox_nano(tmp_path / "first.onnx", 320), fields)
    drop(d.inbox, "second", yolox_nano(tmp_path / "second.onnx", 320, seed=1), fields)
    reported_beside(d, "int8")


def test_mixed_head_trips_the_gate_the_normal_detector_passes(daemon: Any, tmp_path: Path) -> None:
    """Pixel-scale boxes in the same tensor as the scores (no output cut) crush the scores under one uint8 scale:
    the job ends failed ACCURACY_GATE, its bundle kept under failed/<job_id>/ and not published; the normal
    detector with the same images and the default gate succeeds."""
    calib = valjson(tmp_path / "data", random_labels(40, 3))
    fields = {"task": "detection", "num_classes": 3, "calib": str(calib), "n_samples": 8}
    d = daemon()
    drop(d.inbox, "good", yolox(tmp_path / "good.onnx", size=(64, 64)), fields)
    drop(d.inbox, "mixed", yolox(tmp_path / "mixed.onnx", size=(64, 64), box_gain=30.0), fields)
    good, bad = d.wait_job("good"), d.wait_job("mixed")
    assert good["state"] == "succeeded", good
    assert bad["state"] == "failed" and bad["error"]["code"] == "ACCURACY_GATE", bad
    assert "decoded scores mean cosine" in bad["error"]["message"]
    assert not (d.outbox / "mixed.host.saigeedge").exists()
    kept = d.inbox / ".saigeedged" / "failed" / bad["job_id"] / f"{bad['job_id']}.saigeedge"
    with zipfile.ZipFile(kept) as zf:
        rep = json.loads(zf.read("accuracy.json"))
    assert not rep["gate"]["passed"] and rep["task"]["score_cosine_mean"] < 0.95
    log = (d.outbox / bad["log"]).read_text()
    assert "accuracy (int8, 16 held-out images)" in log and "FAILED" in log
    with zipfile.ZipFile(d.outbox / good["bundle"]["path"]) as zf:
        assert json.loads(zf.read("accuracy.json"))["gate"]["passed"]


def test_gate_reads_the_mean_over_the_held_out_images() -> None:
    """One held-out image below `min_cosine` (quantization noise) passes when every mean is above it; a mean below
    it, of an output or of the decoded scores, fails and is named."""
    from saigeedged.compile import report

    gate = {"min_cosine": 0.95, "max_map_drop": 0.1}
    noisy = {"outputs": {"out": {"cosine": 0.92, "cosine_mean": 0.98, "max_abs_error": 1.0}},
             "task": {"metric": "mAP@0.5", "score_cosine": 0.91, "score_cosine_mean": 0.97, "drop": None}}
    assert report.judge(noisy, gate) == []
    noisy["task"]["score_cosine_mean"] = 0.93
    noisy["outputs"]["out"]["cosine_mean"] = 0.94
    assert report.judge(noisy, gate) == ["out mean cosine 0.9400 < 0.95", "decoded scores mean cosine 0.9300 < 0.95"]
    noisy["outputs"]["out"]["cosine_mean"] = 0.999996  # the digits that show it is below (it read "1.0000 < 1")
    assert report.judge(noisy, {**gate, "min_cosine": 1})[0] == "out mean cosine 0.999996 < 1"


@pytest.mark.parametrize("method", ["ema", "minmax", "kl"])
def test_a_model_undefined_on_every_calibration_image_is_onnx_invalid(tmp_path: Path, config_path: Path, capsys: Any,
                                                                      method: str) -> None:
    """A Log of negative activations is NaN on every image: ONNX_INVALID naming the tensor (onnxruntime's quantizer
    failed `AssertionError: scale issue`, an INTERNAL)."""
    calib = valjson(tmp_path / "data", [[0]] * 12)
    mf = manifest(tmp_path / "m.yml", task="reid", num_classes=1, calib=str(calib), n_samples=8, target="host",
                  onnx=str(undefined(tmp_path / "m.onnx", "Log", conv=True)), input_size=[64, 64],
                  calibration_method=method, output=str(tmp_path / "m.saigeedge"))
    assert cli.main(["compile", str(mf), "-c", str(config_path)]) == 2  # invalid input, as a validation failure
    err = capsys.readouterr().err
    assert "ONNX_INVALID: the float model computes no number (NaN)" in err and "INTERNAL" not in err
    assert " in emb, p on the calibration images" in err if method != "kl" else \
        "(NaN), or an infinite one, on the calibration images, so it has no range to quantize (onnxruntime: " in err
    assert not (tmp_path / "m.saigeedge").exists()


def test_an_infinite_range_quantizes_as_before(tmp_path: Path, config_path: Path) -> None:
    """A tensor that is inf on every image, bounded after it (a -inf mask before a Softmax): onnxruntime quantizes it,
    so it is no ONNX_INVALID (only NaN is: it has no range at all)."""
    calib = valjson(tmp_path / "data", [[0]] * 12)
    mf = manifest(tmp_path / "m.yml", task="reid", num_classes=1, calib=str(calib), n_samples=8, target="host",
                  onnx=str(infinite(tmp_path / "m.onnx")), input_size=[64, 64], output=str(tmp_path / "m.saigeedge"))
    assert cli.main(["compile", str(mf), "-c", str(config_path)]) == 0
    assert (tmp_path / "m.saigeedge").is_file()


def test_a_model_infinite_on_some_images_quantizes_and_reports_without_runtime_warnings(tmp_path: Path) -> None:
    """A model -inf on the dark images (a Log of 0) is quantized, and its §6c report and accuracy report are NaN there,
    without a numpy RuntimeWarning (NaN zero points in onnxruntime's quantizer, inf - inf and inf / inf in the
    comparisons: their warnings reached the stderr of `saigeedged compile`)."""
    paths = tuple(str(image(tmp_path / f"img{i}.jpg", seed=i, grey=20 if i % 2 else 200)) for i in range(6))
    wrapped, int8 = tmp_path / "m.uint8.onnx", tmp_path / "m.int8.onnx"
    host.wrap_job(unbounded(tmp_path / "m.onnx"), wrapped, "input", (64, 64), *mean_scale(PROFILES["reid"]), False)
    calib = host.Calib(paths, (64, 64), PROFILES["reid"].letterbox)
    spec = evaluate.Spec(wrapped, int8, "int8", "input", paths, tuple((None, (0,)) for _ in paths), (64, 64),
                         calib.letterbox, "reid", 1)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        host.quantize(wrapped, int8, "input", calib.stream(), "minmax")
        quantization = host.report(wrapped, int8, "input", calib.batches())
        rep = evaluate.run(spec)
    assert quantization["flagged"] == ["emb"] and quantization["outputs"]["emb"]["cosine"] is None
    assert np.isnan(rep["outputs"]["emb"]["cosine"]) and np.isnan(rep["outputs"]["emb"]["max_abs_error"])


def test_infinite_detection_heads_are_compared_without_runtime_warnings() -> None:
    """YOLOX heads infinite in one cell (obj inf, cls 0: inf * 0; the box inf: inf - inf) give NaN score cosines, not
    a numpy RuntimeWarning."""
    rng = np.random.default_rng(0)
    ref = [rng.normal(size=(1, 8, s, s)).astype(np.float32) for s in (8, 4, 2)]
    got = [h.copy() for h in ref]
    ref[0][0, 4, 0, 0], ref[0][0, 5, 0, 0], ref[0][0, 0, 1, 1] = np.inf, 0, np.inf
    spec = evaluate.Spec(Path("f.onnx"), Path("c.onnx"), "emulated", "images", ("a.jpg",), ((None, (0,)),), (64, 64),
                         True, "detection", 3)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        rep = evaluate.compare(spec, list(DETECTION_HEADS), [ref], [got])
    assert np.isnan(rep["task"]["score_cosine"]) and np.isnan(rep["outputs"][DETECTION_HEADS[0]]["cosine"])


def test_a_quantization_report_with_nan_stays_json_and_is_flagged(daemon: Any, tmp_path: Path) -> None:
    """The host's own quantization report (the calibration images) of a model NaN on some of them: the cosine is null
    and flagged, the job succeeds (it published, then ended INTERNAL "malformed JSON": the store's doc held NaN)."""
    calib = valjson(tmp_path / "data", [[0]] * 12, grey=200)
    for i in range(0, 12, 2):
        image(tmp_path / "data" / "images" / f"img{i:04d}.jpg", seed=i, grey=20)
    d = daemon()
    drop(d.inbox, "qnan", undefined(tmp_path / "qnan.onnx", "Log"),
         {"task": "reid", "num_classes": 1, "calib": str(calib), "n_samples": 8, "input_size": [64, 64],
          "eval_samples": 0})
    doc = d.wait_job("qnan")
    assert doc["state"] == "succeeded", doc
    row = doc["quantization_report"]["outputs"]["emb"]
    assert row["cosine"] is None and row["flagged"] and doc["quantization_report"]["flagged"] == ["emb"]


def test_a_host_job_below_the_gate_has_its_quantization_report_in_its_status(daemon: Any, tmp_path: Path) -> None:
    """A host job that fails the accuracy gate still carries its §6c `quantization_report` in its status file, as a
    succeeded one does (it was null)."""
    calib = valjson(tmp_path / "data", random_labels(24, 3))
    d = daemon()
    drop(d.inbox, "gated", yolox(tmp_path / "gated.onnx", size=(64, 64)),
         {"task": "detection", "num_classes": 3, "calib": str(calib), "n_samples": 8, "accuracy": {"min_cosine": 1}})
    doc = d.wait_job("gated")
    assert doc["state"] == "failed" and doc["error"]["code"] == "ACCURACY_GATE", doc
    assert doc["quantization_report"] and doc["quantization_report"]["outputs"], doc
    assert doc["accuracy"] and not doc["accuracy"]["gate"]["passed"]


def test_a_report_with_nan_fails_the_gate_and_its_status_stays_json(daemon: Any, tmp_path: Path) -> None:
    """A model that is NaN on some held-out images (a Log of the dark ones' pooled pixels): the gate fails, naming what
    was not a number (NaN < min_cosine is false: it passed and published), and the status file and accuracy.json
    carry null (the status doc's NaN made the job INTERNAL, "malformed JSON")."""
    calib = valjson(tmp_path / "data", [[0]] * 24, grey=200)
    for i in range(0, 24, 2):
        image(tmp_path / "data" / "images" / f"img{i:04d}.jpg", seed=i, grey=20)
    d = daemon()
    drop(d.inbox, "nan", undefined(tmp_path / "nan.onnx", "Log"),
         {"task": "reid", "num_classes": 1, "calib": str(calib), "n_samples": 8, "input_size": [64, 64]})
    doc = d.wait_job("nan")
    assert doc["state"] == "failed" and doc["error"]["code"] == "ACCURACY_GATE", doc
    assert "not a finite number (NaN or inf on the held-out images): outputs.emb.cosine" in doc["error"]["message"]
    assert doc["accuracy"]["outputs"]["emb"]["cosine"] is None and not doc["accuracy"]["gate"]["passed"]
    kept = d.inbox / ".saigeedged" / "failed" / doc["job_id"] / f"{doc['job_id']}.saigeedge"
    with zipfile.ZipFile(kept) as zf:
        rep = json.loads(zf.read("accuracy.json"), parse_constant=lambda c: pytest.fail(f"{c} in accuracy.json"))
    assert "outputs.emb.cosine" in rep["non_finite"]
    assert "cosine mean NaN/inf worst NaN/inf" in (d.outbox / doc["log"]).read_text()
    assert not (d.outbox / "nan.host.saigeedge").exists()


def test_a_gate_failure_of_saigeedged_compile_keeps_the_bundle_under_failed(tmp_path: Path, config_path: Path,
                                                                           capsys: Any) -> None:
    """`saigeedged compile` below the gate: exit 1, nothing published, the bundle kept under failed/<job_id>/ beside
    the output (SPEC §17; it was thrown away, "not kept (no claimed folder)") and its path printed in the error."""
    calib = valjson(tmp_path / "data", random_labels(24, 3))
    output = tmp_path / "out" / "m.saigeedge"  # a folder that does not exist yet
    mf = manifest(tmp_path / "m.yml", task="detection", num_classes=3, calib=str(calib), n_samples=8, target="host",
                  onnx=str(yolox(tmp_path / "m.onnx", size=(64, 64))), accuracy={"min_cosine": 1}, output=str(output))
    assert cli.main(["compile", str(mf), "-c", str(config_path)]) == 1
    err = capsys.readouterr().out  # a compile's failure is collected with the others' results
    [kept] = (tmp_path / "out" / "failed").glob("*/m.saigeedge")
    assert kept.parent.name.startswith("m-") and "ACCURACY_GATE" in err and f"the bundle was kept as {kept}" in err, err
    assert "hint: the compiled model is too far from the float ONNX (the report is in the job log and the kept " \
        "bundle's accuracy.json): try" in err and "<inbox>" not in err, err
    with zipfile.ZipFile(kept) as zf:
        assert not json.loads(zf.read("accuracy.json"))["gate"]["passed"]
    assert not output.exists()


def test_report_shows_in_status_dashboard_and_table(config_path: Path, capsys: Any) -> None:
    """A job's accuracy is in its status file, its dashboard row and the printed table with the gate's verdict, which
    `saigeedged status JOB` prints line by line (it printed one line of literal `\\n`s)."""
    from saigeedged import accuracytable
    from saigeedged import config as configmod
    from saigeedged.adapters import dashboard, outbox
    from saigeedged.adapters.store import Store
    from saigeedged.jobs import Job

    acc = {"method": "emulated", "images": 3, "outputs": {"out": {"cosine": 0.91, "cosine_mean": 0.95, "max_abs_error": 2.0}},
           "task": {"metric": "mAP@0.5", "score_cosine": 0.8, "float": 0.5, "compiled": 0.2, "drop": 0.3},
           "worst_layers": [], "default_quantization": ["x"], "notes": [],
           "gate": {"min_cosine": 0.95, "max_map_drop": 0.1, "passed": False, "failures": ["out cosine 0.9100 < 0.95"]}}
    job = Job("j-1", "j", "mobilint", "detection", {"onnx": "/x/j.onnx"}, "", "/c", "j.yml", state="failed", accuracy=acc)
    assert outbox.status_doc(job)["accuracy"] == acc
    assert accuracytable.worst_cosine(acc) == 0.8
    lines = accuracytable.table(acc)
    assert lines[0] == "accuracy (emulated, 3 held-out images)" and any("drop 0.3000" in line for line in lines)
    assert any("FAILED: out cosine 0.9100 < 0.95" in line for line in lines)
    row = dashboard._recent([job])
    assert "BELOW THE GATE, cosine ≥ 0.8000" in row and "left at default quantization" in row
    state_dir = configmod.load(config_path).state_dir
    state_dir.mkdir(parents=True)
    Store(state_dir / "saigeedged.db").add(job)
    capsys.readouterr()
    assert cli.main(["status", "j-1", "-c", str(config_path)]) == 0
    printed = capsys.readouterr().out.splitlines()
    assert printed[1:1 + len(lines)] == lines


@pytest.mark.parametrize(("fields", "bits", "note"), [
    ({}, 8, "onnxruntime QDQ uint8 asymmetric per tensor (emulating asymmetric_affine uint8), MinMax moving average (ema)"),
    ({"quantizer": "dynamic_fixed_point", "qtype": "int16", "calibration_method": "minmax"}, 16,
     "onnxruntime QDQ uint16 asymmetric per tensor (emulating dynamic_fixed_point int16), MinMax (minmax)"),
    ({"quantizer": "perchannel_symmetric_affine", "qtype": "int8", "calibration_method": "kl"}, 8,
     "onnxruntime QDQ uint8 asymmetric per tensor (emulating perchannel_symmetric_affine int8), Entropy (kl)"),
])
def test_the_emulation_note_names_what_it_runs_and_the_board_setting(fields: dict[str, Any], bits: int,
                                                                     note: str) -> None:
    """An emulated report's note says what onnxruntime runs and which board quantization and calibration it stands in
    for (it called cubie's default `ema` plain MinMax and a dynamic_fixed_point int16 only "uint16 asymmetric")."""
    entry = Entry(task="detection", num_classes=3, calib=Path("/c.json"), onnx=Path("/m.onnx"), stem="m",
                  manifest=Path("/m.yml"), **fields)
    assert report.emulation_note(entry, bits) == note


@pytest.mark.docker
def test_a_mobilint_qtype_qbcompiler_never_gets_is_emulated_as_what_it_compiles(tmp_path: Path,
                                                                              docker_config: Path) -> None:
    """Mobilint `qtype: float16` (qbcompiler is never given it: its .mxq is int8) is emulated as the uint8 quantization
    the .mxq has, with the manifest's calibration method, and no hybrid note: it was the float model against itself, a
    cosine of 1 that passed any gate."""
    src = classifier(tmp_path / "tags.onnx", 3, (224, 224))
    calib = valjson(tmp_path / "data", random_labels(12, 3))
    out = tmp_path / "tags.saigeedge"
    mf = manifest(tmp_path / "tags.yml", task="mlc", num_classes=3, calib=str(calib), target="mobilint",
                  device="regulus-rb", output=str(out), onnx=str(src), n_samples=4, qtype="float16",
                  calibration_method="minmax", hybrid_topn=2)
    assert cli.main(["compile", str(mf), "-c", str(docker_config)]) == 0
    with zipfile.ZipFile(out) as zf:
        rep = json.loads(zf.read("accuracy.json"))
    assert rep["notes"][0] == "onnxruntime QDQ uint8 asymmetric per tensor (emulating asymmetric_affine uint8), " \
        "MinMax (minmax)", rep["notes"]
    assert not any("hybrid" in n or "float32" in n for n in rep["notes"]), rep["notes"]


def test_mobilint_report_is_emulated(tmp_path: Path, docker_config: Path) -> None:
    """A mobilint bundle carries a report made by the host emulation of its quantization, labelled `emulated`."""
    src = classifier(tmp_path / "tags.onnx", 3, (224, 224))
    calib = valjson(tmp_path / "data", random_labels(12, 3))
    out = tmp_path / "tags.saigeedge"
    mf = manifest(tmp_path / "tags.yml", task="mlc", num_classes=3, calib=str(calib), target="mobilint",
                  device="regulus-rb", output=str(out), onnx=str(src), n_samples=4)
    assert cli.main(["compile", str(mf), "-c", str(docker_config)]) == 0
    with zipfile.ZipFile(out) as zf:
        rep = json.loads(zf.read("accuracy.json"))
    assert rep["method"] == "emulated" and rep["images"] == 8 and rep["gate"]["passed"]
    assert rep["notes"][0] == "onnxruntime QDQ uint8 asymmetric per tensor (emulating asymmetric_affine uint8), " \
        "MinMax moving average (ema)" and rep["task"]["metric"] == "mAP"
    assert rep["outputs"]["scores"]["cosine"] > 0.95
    assert not any("made before" in n for n in rep["notes"])
    # the same drop again: a cache hit, whose report takes the emulated model of that compile instead of quantizing
    assert cli.main(["compile", str(mf), "-c", str(docker_config)]) == 0
    with zipfile.ZipFile(out) as zf:
        again = json.loads(zf.read("accuracy.json"))
    assert any("made before (no new quantization)" in n for n in again["notes"])
    state = Path(yaml.safe_load(docker_config.read_text())["state_dir"])
    assert len(list((state / "cache" / ".emulated").glob("*.onnx"))) == 1
    assert again["outputs"] == rep["outputs"] and again["task"] == rep["task"]
    # `cache: false` asks for everything from scratch: the emulation quantizes again, to the same model
    fresh = manifest(tmp_path / "tags.yml", task="mlc", num_classes=3, calib=str(calib), target="mobilint",
                     device="regulus-rb", output=str(out), onnx=str(src), n_samples=4, cache=False)
    assert cli.main(["compile", str(fresh), "-c", str(docker_config)]) == 0
    with zipfile.ZipFile(out) as zf:
        scratch = json.loads(zf.read("accuracy.json"))
    assert not any("made before" in n for n in scratch["notes"]) and scratch["outputs"] == rep["outputs"]
    assert cli.main(["cache", "clear", "-c", str(docker_config)]) == 0  # the kept emulated models go with the cache
    assert not (state / "cache" / ".emulated").exists()


@pytest.mark.docker
@pytest.mark.parametrize("damage", ["truncated", "random bytes"])
def test_a_damaged_emulated_model_is_made_again(tmp_path: Path, docker_config: Path, damage: str) -> None:
    """A cache hit whose kept emulated model was damaged (truncated, or other bytes) quantizes again and keeps a sound
    one; the next hit takes that (the damaged model was taken and every later report ended INTERNAL "InvalidProtobuf")."""
    src = classifier(tmp_path / "tags.onnx", 3, (64, 64))
    calib = valjson(tmp_path / "data", random_labels(12, 3))
    out = tmp_path / "tags.saigeedge"
    mf = manifest(tmp_path / "tags.yml", task="mlc", num_classes=3, calib=str(calib), target="mobilint",
                  device="regulus-rb", output=str(out), onnx=str(src), n_samples=4, input_size=[64, 64],
                  accuracy={"max_map_drop": 1.0})  # the gate off: this untrained classifier's INT8 scores tie
    assert cli.main(["compile", str(mf), "-c", str(docker_config)]) == 0
    with zipfile.ZipFile(out) as zf:
        rep = json.loads(zf.read("accuracy.json"))
    [kept] = (Path(yaml.safe_load(docker_config.read_text())["state_dir"]) / "cache" / ".emulated").iterdir()
    good = kept.read_bytes()
    kept.write_bytes(good[:len(good) // 2] if damage == "truncated" else os.urandom(len(good)))
    for made_before in (False, True):
        assert cli.main(["compile", str(mf), "-c", str(docker_config)]) == 0
        with zipfile.ZipFile(out) as zf:
            again = json.loads(zf.read("accuracy.json"))
        assert any("made before (no new quantization)" in n for n in again["notes"]) == made_before
        assert again["outputs"] == rep["outputs"]
    assert [p.read_bytes() for p in kept.parent.iterdir()] == [good]


@pytest.mark.docker
def test_a_report_over_the_memory_bound_fails_out_of_memory(tmp_path: Path, docker_config: Path, capsys: Any) -> None:
    """A cubie job whose report needs more than limits.child_memory_bytes (128 MiB; a 320 YOLOX-nano-shaped detector's
    emulation) fails OUT_OF_MEMORY in step bundle naming that bound, also when onnxruntime's own arena is what fails
    (a plain `Fail`, not MemoryError: it was INTERNAL)."""
    from realmodels import yolox_nano

    settings = yaml.safe_load(docker_config.read_text())
    settings["limits"]["child_memory_bytes"] = 128 << 20
    docker_config.write_text(yaml.safe_dump(settings))
    calib = valjson(tmp_path / "data", random_labels(30, 3))
    mf = manifest(tmp_path / "det.yml", task="detection", num_classes=3, calib=str(calib), target="cubie", n_samples=8,
                  onnx=str(yolox_nano(tmp_path / "det.onnx", 320)), output=str(tmp_path / "det.saigeedge"))
    assert cli.main(["compile", str(mf), "-c", str(docker_config)]) == 1
    out = capsys.readouterr().out
    assert f"OUT_OF_MEMORY: accuracy needs more than limits.child_memory_bytes ({128 << 20} bytes)" in out, out
    log = next((tmp_path / "state" / "logs").iterdir()).read_text()
    assert "----- bundle: failed OUT_OF_MEMORY" in log and not (tmp_path / "det.saigeedge").exists()


def _reference_tar(src: Path, folder: Path, held_out: list[str]) -> tuple[bytes, dict[str, list[float]]]:
    """What the stand-in simulator answers: the float heads of each held-out image (BGR /255 NCHW, as the NBG's
    preprocess feeds them) rounded to 256 levels per tensor, as .tensor text files keyed by the image's md5; and
    the cosines those give against the float outputs."""
    import hashlib
    import io
    import tarfile

    ref = _float_heads(src)
    cos: dict[str, list[float]] = {n: [] for n in DETECTION_HEADS}
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name in held_out:
            path = folder / name
            u8 = images.load_rgb(path, (64, 64), letterbox=True)
            heads = ref.run(list(DETECTION_HEADS), {"images": (u8[..., ::-1].astype(np.float32) / 255).transpose(2, 0, 1)[None]})
            digest = hashlib.md5(path.read_bytes()).hexdigest()
            for head, value in zip(DETECTION_HEADS, heads, strict=True):
                step = (value.max() - value.min()) / 255
                got = np.round((value - value.min()) / step) * step + value.min()
                w, g = value.astype(np.float64).ravel(), got.astype(np.float64).ravel()
                cos[head].append(float(w @ g / np.linalg.norm(w) / np.linalg.norm(g)))
                text = "\n".join(f"{v:.6f}" for v in got.ravel()).encode() + b"\n"
                layer = head.strip("/").replace("/", "_")
                info = tarfile.TarInfo(f"quantized/{digest}/attach_{layer}_out0_{'_'.join(map(str, value.shape))}.tensor")
                info.size = len(text)
                tar.addfile(info, io.BytesIO(text))
    return buf.getvalue(), {head: [min(c)] for head, c in cos.items()}


@pytest.mark.docker
def test_cubie_report_comes_from_the_simulator(tmp_path: Path, docker_config: Path, docker_client: Any) -> None:
    """Without simulator answers the cubie report is emulated (and says why); once the image's `pegasus inference`
    answers, the report is labelled `simulator` and its cosines are those of the .tensor files it wrote."""
    src = yolox(tmp_path / "det.onnx", size=(64, 64))
    calib = valjson(tmp_path / "data", random_labels(20, 3))
    out = tmp_path / "det.saigeedge"
    mf = manifest(tmp_path / "det.yml", task="detection", num_classes=3, calib=str(calib), target="cubie", output=str(out),
                  onnx=str(src), n_samples=8, eval_samples=4, cache=False)
    assert cli.main(["compile", str(mf), "-c", str(docker_config)]) == 0
    with zipfile.ZipFile(out) as zf:
        first = json.loads(zf.read("accuracy.json"))
    assert first["method"] == "emulated" and any("`pegasus inference` exited 1" in n for n in first["notes"])
    data, want = _reference_tar(src, tmp_path / "data" / "images", first["held_out"])
    container = yaml.safe_load(docker_config.read_text())["cubie"]["container"]
    ctr = docker_client.containers.get(container)
    ctr.exec_run(["mkdir", "-p", "/standin/tensors"])
    assert ctr.put_archive("/standin/tensors", data)
    assert cli.main(["compile", str(mf), "-c", str(docker_config)]) == 0
    with zipfile.ZipFile(out) as zf:
        rep = json.loads(zf.read("accuracy.json"))
    assert rep["method"] == "simulator" and rep["held_out"] == first["held_out"] and rep["worst_layers"] == []
    calls = [c for c in container_output(ctr, ["cat", "/tmp/standin-calls.log"]).splitlines() if " inference " in c]
    assert len(calls) == 2 and all("--iterations 4 " in c for c in calls)  # one toolkit start-up per report
    for head in DETECTION_HEADS:
        assert rep["outputs"][head]["cosine"] == pytest.approx(want[head][0], abs=1e-4)
    assert rep["default_quantization"] == []  # the stand-in's .quantize has calibrated scales


@pytest.mark.docker
def test_an_unreadable_simulator_output_is_emulated_and_the_emulation_kept(tmp_path: Path, docker_config: Path,
                                                                         docker_client: Any) -> None:
    """`pegasus inference` answering with .tensor files that match no output: the report is emulated (and says why),
    and its emulated model is kept like any emulation's, so the same compile's next report (a cache hit) takes it
    instead of quantizing again."""
    import io
    import tarfile

    src = yolox(tmp_path / "det.onnx", size=(64, 64))
    calib = valjson(tmp_path / "data", random_labels(20, 3))
    out = tmp_path / "det.saigeedge"
    mf = manifest(tmp_path / "det.yml", task="detection", num_classes=3, calib=str(calib), target="cubie", output=str(out),
                  onnx=str(src), n_samples=8, eval_samples=4)
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:  # three values an image, whatever the image: no output has 3
        for image in (tmp_path / "data" / "images").iterdir():
            info = tarfile.TarInfo(f"quantized/{hashlib.md5(image.read_bytes()).hexdigest()}/attach_x_out0_3.tensor")
            info.size = len(b"1.0\n2.0\n3.0\n")
            tar.addfile(info, io.BytesIO(b"1.0\n2.0\n3.0\n"))
    warm = manifest(tmp_path / "warm.yml", task="detection", num_classes=3, calib=str(calib), target="cubie",
                    output=str(tmp_path / "warm.saigeedge"), onnx=str(src), n_samples=6, eval_samples=0)
    assert cli.main(["compile", str(warm), "-c", str(docker_config)]) == 0  # makes the container (another key)
    ctr = docker_client.containers.get(yaml.safe_load(docker_config.read_text())["cubie"]["container"])
    ctr.exec_run(["mkdir", "-p", "/standin/tensors"])
    assert ctr.put_archive("/standin/tensors", buf.getvalue())
    assert cli.main(["compile", str(mf), "-c", str(docker_config)]) == 0
    with zipfile.ZipFile(out) as zf:
        first = json.loads(zf.read("accuracy.json"))
    assert first["method"] == "emulated" and any("`pegasus inference` output unreadable" in n for n in first["notes"])
    assert not any("made before" in n for n in first["notes"])
    assert cli.main(["compile", str(mf), "-c", str(docker_config)]) == 0
    with zipfile.ZipFile(out) as zf:
        again = json.loads(zf.read("accuracy.json"))
    assert any("made before (no new quantization)" in n for n in again["notes"])
    assert again["outputs"] == first["outputs"]


def test_three_variant_sweep_publishes_the_best_and_shows_all(tmp_path: Path, config_path: Path, capsys: Any) -> None:
    """Three variants are each compiled and evaluated; the bundle is the one with the best cosine that passes the
    gate (int16 here), the report's table lists all three, and a second run takes all three from the cache."""
    src = yolox(tmp_path / "det.onnx", size=(64, 64))
    calib = valjson(tmp_path / "data", random_labels(24, 3))
    sweep = [{"calibration_method": "minmax"}, {"calibration_method": "kl"},
             {"name": "int16", "qtype": "int16", "calibration_method": "minmax"}]
    fields = {"task": "detection", "num_classes": 3, "calib": str(calib), "n_samples": 8, "variants": sweep}
    assert _compile(tmp_path, config_path, "det", src, **fields)[0] == 0
    ckpt, rep, model_bytes = _members(tmp_path / "det.saigeedge")
    rows = rep["variants"]
    assert [r["name"] for r in rows] == ["calibration_method minmax", "calibration_method kl", "int16"]
    assert all(r["passed"] and not r["cache_hit"] for r in rows)
    assert rep["chosen"] == 3 == max(rows, key=lambda r: r["worst_cosine"])["variant"]
    assert ckpt["quantization"]["activations"] == "uint16"
    assert any(n.input[0] for n in onnx.load_from_string(model_bytes).graph.node if n.op_type == "QuantizeLinear")
    log = next((tmp_path / "state" / "logs").iterdir()).read_text()
    assert "variant 3/3: int16" in log and "* 3. int16" in log
    assert _compile(tmp_path, config_path, "det", src, **fields)[0] == 0
    assert all(r["cache_hit"] for r in _members(tmp_path / "det.saigeedge")[1]["variants"])


@pytest.mark.parametrize(("fields", "text"), [
    ({"accuracy": {"min_cosine": 1.5}}, "`accuracy.min_cosine` must be a number in [0, 1]"),
    ({"accuracy": {"min_cos": 0.9}}, "unknown key `accuracy.min_cos`"),
    ({"variants": [{"qtype": "int16"}] * 9}, "`variants` must list 1 to 8 variants, got 9"),
    ({"variants": [{"platform": "t527"}]}, "`variants[0]`: unknown key `platform`"),
    ({"variants": [{"qtype": "int4"}]}, "`variants[0].qtype` must be one of"),
    ({"eval_samples": -1}, "`eval_samples` must be >= 0"),
])
def test_gate_and_variants_are_validated(tmp_path: Path, fields: dict[str, Any], text: str) -> None:
    """A bad gate, too many variants or a variant key that is not a quantization setting is MANIFEST_INVALID."""
    from saigeedged import manifest as manifestmod
    from saigeedged.errors import SaigeError

    mf = manifest(tmp_path / "m.yml", task="mlc", num_classes=3, calib="val.json", **fields)
    with pytest.raises(SaigeError) as err:
        manifestmod.load(mf)
    assert err.value.code == "MANIFEST_INVALID" and text in err.value.message
