"""What the accuracy report (SPEC §17) says of the labels it measured the task metric against."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from factory import image

from saigeedged.compile import evaluate

Box = tuple[float, float, float, float]


def _spec(tmp_path: Path, task: str, truth: list[tuple[tuple[Box | None, ...] | None, tuple[int, ...]]]) -> evaluate.Spec:
    paths = tuple(str(image(tmp_path / f"img{i}.jpg", i, size=(48, 64))) for i in range(len(truth)))
    return evaluate.Spec(tmp_path / "f.onnx", tmp_path / "c.onnx", "int8", "input", paths, tuple(truth), (64, 64), True,
                         task, 3)


def _heads(seed: int, n: int) -> list[list[Any]]:
    rng = np.random.default_rng(seed)
    return [[rng.random((1, 8, s, s)).astype(np.float32) for s in (8, 4, 2)] for _ in range(n)]


def _report(spec: evaluate.Spec, outputs: list[list[Any]]) -> dict[str, Any]:
    names = [f"out{i}" for i in range(len(outputs[0]))]
    return evaluate.compare(spec, names, outputs, [[o * 1.01 for o in row] for row in outputs])


def test_boxes_partly_outside_are_clipped_and_the_report_says_so(tmp_path: Path) -> None:
    """A ground-truth box reaching past its image is clipped to it before mAP, and a note counts the clipped boxes."""
    inside: Box = (4.0, 4.0, 30.0, 20.0)
    spec = _spec(tmp_path, "detection", [((inside, (50.0, 30.0, 90.0, 70.0)), (0, 1)), ((inside,), (2,))])
    rep = _report(spec, _heads(0, 2))
    assert "1 ground-truth box(es) partly outside their image clipped to it" in rep["notes"]
    assert rep["task"]["float"] is not None and "labels" not in rep["task"]
    assert evaluate._letterboxed(spec, spec.images[0], [(50.0, 30.0, 90.0, 70.0)])[0].tolist() == [[50.0, 30.0, 64.0, 48.0]]


def test_no_label_on_any_held_out_image_says_why_there_is_no_map(tmp_path: Path) -> None:
    """Detection with boxes but no annotation on the held-out images, and mlc with every label list empty: mAP is
    null and the report says why."""
    det = _report(_spec(tmp_path, "detection", [((), ()), ((), ())]), _heads(1, 2))
    assert det["task"]["float"] is None
    assert det["task"]["labels"] == "none of the 2 held-out images has a label: mAP against labels not measured"
    scores = [[np.random.default_rng(i).random((1, 3)).astype(np.float32)] for i in range(2)]
    mlc = _report(_spec(tmp_path, "mlc", [(None, ()), (None, ())]), scores)
    assert mlc["task"]["float"] is None and "none of the 2 held-out images has a label" in mlc["task"]["labels"]


def test_no_boxes_names_both_kinds_of_file(tmp_path: Path) -> None:
    """Detection without boxes says the file has none without calling a COCO file a val.json."""
    rep = _report(_spec(tmp_path, "detection", [(None, (0,)), (None, (1,))]), _heads(2, 2))
    assert rep["task"]["labels"].startswith("the calibration file has no boxes (a val.json, or COCO without `bbox`)")


def test_a_label_without_a_usable_box_leaves_its_image_out_of_map_and_says_so(tmp_path: Path) -> None:
    """A label whose box read() dropped (counted in Spec.dropped) or never had (None), or a box entirely outside its
    image: that image is left out of mAP against labels (its object would count as a false positive), and the notes
    count the dropped boxes and the images left out; the other images are measured."""
    inside: Box = (4.0, 4.0, 30.0, 20.0)
    truth = [((inside, None), (0, 1)), ((inside, (500.0, 400.0, 600.0, 450.0)), (0, 2)), ((inside,), (2,))]
    spec = evaluate.Spec(**{**_spec(tmp_path, "detection", truth).__dict__, "dropped": 1})
    rep = _report(spec, _heads(3, 3))
    assert "2 ground-truth box(es) dropped: not a box (no finite [x, y, width, height] with width and height above 0) " \
        "or entirely outside its image" in rep["notes"]
    assert "2 held-out image(s) left out of mAP against labels: a label without a usable box" in rep["notes"]
    assert rep["task"]["float"] is not None and "labels" not in rep["task"]
    alone = _report(_spec(tmp_path, "detection", [((inside,), (2,))]), _heads(3, 3)[2:])
    assert (rep["task"]["float"], rep["task"]["compiled"]) == (alone["task"]["float"], alone["task"]["compiled"])


def test_no_usable_box_on_any_held_out_image_is_no_map_with_a_reason(tmp_path: Path) -> None:
    """Every labelled held-out image left out (garbage boxes only): mAP against labels is not measured, and the report
    says why instead of measuring on nothing."""
    rep = _report(_spec(tmp_path, "detection", [((None,), (0,)), ((None, None), (1, 2)), ((), ())]), _heads(4, 3))
    assert rep["task"]["float"] is None and rep["task"]["drop"] is None
    assert rep["task"]["labels"] == "no held-out image has a usable box (2 of 3 left out: a label without one): mAP " \
        "against labels not measured"
    assert "2 held-out image(s) left out of mAP against labels: a label without a usable box" in rep["notes"]


def test_boxes_do_not_matter_for_mlc(tmp_path: Path) -> None:
    """mlc measures mAP against the labels whatever their boxes: none usable changes nothing, and no note about boxes."""
    scores = [[np.random.default_rng(i).random((1, 3)).astype(np.float32)] for i in range(3)]
    truth: list[tuple[tuple[Box | None, ...] | None, tuple[int, ...]]] = [((None,), (0,)), ((None, None), (1, 2)), (None, (0, 2))]
    rep = _report(evaluate.Spec(**{**_spec(tmp_path, "mlc", truth).__dict__, "dropped": 3}), scores)
    plain = _report(_spec(tmp_path, "mlc", [(None, (0,)), (None, (1, 2)), (None, (0, 2))]), scores)
    assert rep["task"] == plain["task"] and rep["task"]["float"] is not None and rep["notes"] == plain["notes"] == []
