"""What the accuracy report (SPEC §17) says of the labels it measured the task metric against."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from factory import image

from saigeedged.compile import evaluate

Box = tuple[float, float, float, float]


def _spec(tmp_path: Path, task: str, truth: list[tuple[tuple[Box, ...] | None, tuple[int, ...]]]) -> evaluate.Spec:
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
