"""COCO instances files (SPEC §5, §17): image ids and categories checked when read; a box that is none is dropped, never
refused (the accuracy report counts it)."""

import json
from pathlib import Path
from typing import Any

import pytest
from factory import image

from saigeedged.compile import calibration
from saigeedged.errors import SaigeError


def coco(folder: Path, mutate: Any = None, n: int = 4) -> Path:
    """A COCO file over `n` 64x48 images, two boxed annotations each, changed by `mutate(data)`."""
    for i in range(n):
        image(folder / f"img{i}.jpg", i)
    data: dict[str, Any] = {
        "images": [{"id": i, "file_name": f"img{i}.jpg", "width": 64, "height": 48} for i in range(n)],
        "annotations": [{"id": 100 + 2 * i + k, "image_id": i, "category_id": 1 + k, "bbox": [4.0, 4.0, 20.0, 10.0]}
                        for i in range(n) for k in range(2)],
        "categories": [{"id": 1, "name": "helmet"}, {"id": 2, "name": "head"}, {"id": 3, "name": "person"}]}
    if mutate is not None:
        mutate(data)
    path = folder / "instances.json"
    path.write_text(json.dumps(data))
    return path


def _bbox(value: Any) -> Any:
    return lambda data: data["annotations"][3].update(bbox=value)


BAD = [
    ("repeated image id", lambda data: data["images"][2].update(id=1), "images[2] repeats image id 1"),
    ("unknown category", lambda data: data["annotations"][6].update(category_id=77),
     "annotations[6] (id 106, image_id 3) has category_id 77, not one of the categories' ids (1, 2, 3)"),
]


@pytest.mark.parametrize(("label", "mutate", "named"), BAD, ids=[b[0] for b in BAD])
def test_what_can_never_be_right_is_named(tmp_path: Path, label: str, mutate: Any, named: str) -> None:
    """A repeated image id and an unknown category are CALIB_INVALID naming the image or annotation and the value,
    with a hint: their labels cannot be told apart or named."""
    with pytest.raises(SaigeError) as err:
        calibration.read(coco(tmp_path, mutate), 3)
    assert err.value.code == "CALIB_INVALID" and named in err.value.message, err.value.message
    assert err.value.hint and "fix the calibration file: every image" not in err.value.hint


NOT_BOXES = [
    ("nan", [float("nan"), 4, 20, 10]), ("inf", [4, 4, float("inf"), 10]), ("huge", [1e308, 1e308, 1e308, 1e308]),
    ("zero width", [4, 4, 0, 10]), ("negative height", [4, 4, 20, -10]), ("three numbers", [4, 4, 20]),
    ("a string", "4 4 20 10"),
]


@pytest.mark.parametrize(("label", "bbox"), NOT_BOXES, ids=[b[0] for b in NOT_BOXES])
def test_a_box_that_is_no_box_is_dropped_not_refused(tmp_path: Path, label: str, bbox: Any) -> None:
    """Non-finite, empty or malformed boxes leave their label without a box and are counted (the report's notes say
    so and leave the image out of mAP): the file is read, and its labels stay whole for mlc and reid."""
    calib = calibration.read(coco(tmp_path, _bbox(bbox)), 3)
    one = calib.samples[1]
    assert one.labels == (0, 1) and one.boxes == ((4.0, 4.0, 24.0, 14.0), None) and one.dropped == 1
    assert all(s.boxes == ((4.0, 4.0, 24.0, 14.0),) * 2 and s.dropped == 0 for k, s in enumerate(calib.samples) if k != 1)


@pytest.mark.parametrize("empty", [None, []], ids=["null", "empty list"])
def test_null_or_empty_bbox_is_no_box(tmp_path: Path, empty: Any) -> None:
    """`"bbox": null` or `[]` (tag-style exports) is no box: on every annotation the file has no boxes; on some, those
    labels have none (not a dropped box: nothing was given)."""
    calib = calibration.read(coco(tmp_path, lambda data: [a.update(bbox=empty) for a in data["annotations"]]), 3)
    assert all(s.boxes is None and s.labels == (0, 1) for s in calib.samples)
    calib = calibration.read(coco(tmp_path, _bbox(empty)), 3)
    assert calib.samples[1].boxes == ((4.0, 4.0, 24.0, 14.0), None) and calib.samples[1].dropped == 0


def test_some_annotations_without_bbox_leave_only_theirs_without_a_box(tmp_path: Path) -> None:
    """A file where some annotations have a bbox and some do not is read: those labels have no box, the image keeps
    them; whether the file has boxes is told from the listed images' annotations only (an orphan is ignored)."""
    calib = calibration.read(coco(tmp_path, lambda data: data["annotations"][5].pop("bbox")), 3)
    assert calib.samples[2].labels == (0, 1) and calib.samples[2].boxes == ((4.0, 4.0, 24.0, 14.0), None)
    assert calib.samples[0].boxes == ((4.0, 4.0, 24.0, 14.0),) * 2

    def orphan_with_box(data: dict[str, Any]) -> None:
        for ann in data["annotations"]:
            ann.pop("bbox")
        data["annotations"].append({"id": 999, "image_id": 77, "category_id": 1, "bbox": [1, 1, 5, 5]})
    calib = calibration.read(coco(tmp_path, orphan_with_box), 3)
    assert all(s.boxes is None for s in calib.samples)


def test_no_bbox_at_all_is_a_file_without_boxes(tmp_path: Path) -> None:
    """COCO without any `bbox` is read (mlc, or detection without mAP against labels): its samples have no boxes."""
    calib = calibration.read(coco(tmp_path, lambda data: [a.pop("bbox") for a in data["annotations"]]), 3)
    assert all(s.boxes is None for s in calib.samples) and calib.samples[0].labels == (0, 1)


def test_a_box_entirely_outside_its_image_does_not_stop_calibration(tmp_path: Path) -> None:
    """A box that misses its image is the accuracy report's to drop (evaluate._letterboxed): the calibration's decode
    check passes it, for the sample and the held-out images alike."""
    calib = calibration.read(coco(tmp_path, _bbox([5000, 5000, 50, 50])), 3)
    calibration.check_decodes(calib.source, calib.samples)
    assert calibration.evaluation(calib, calib.samples[:1], 3, 0, "uniform")


def test_the_same_file_on_two_image_entries_is_one_image_with_both_annotations(tmp_path: Path) -> None:
    """Two image entries (two ids) naming one file, or a hard link of it, are one image in the first entry's place,
    holding both entries' labels and boxes."""
    def twice(data: dict[str, Any]) -> None:
        data["images"].append({"id": 9, "file_name": "img1.jpg"})
        data["annotations"].append({"id": 900, "image_id": 9, "category_id": 3, "bbox": [30, 20, 10, 10]})
    calib = calibration.read(coco(tmp_path, twice), 3)
    assert [s.image.name for s in calib.samples] == ["img0.jpg", "img1.jpg", "img2.jpg", "img3.jpg"]
    assert calib.samples[1].labels == (0, 1, 2)
    assert calib.samples[1].boxes == ((4.0, 4.0, 24.0, 14.0), (4.0, 4.0, 24.0, 14.0), (30.0, 20.0, 40.0, 30.0))


def test_no_annotation_at_all_is_images_without_labels(tmp_path: Path) -> None:
    """COCO with an empty `annotations` is images with boxes but no label: the report says no image has a label
    (evaluate._labels_note), not that the file has no boxes."""
    calib = calibration.read(coco(tmp_path, lambda data: data.update(annotations=[])), 3)
    assert all(s.boxes == () and s.labels == () for s in calib.samples)


def test_a_resumed_attempt_keeps_labels_without_a_box(tmp_path: Path) -> None:
    """The attempt's stored samples (resume) keep a label's missing box and the dropped count; a document written
    before either existed reads as every box there and none dropped."""
    from saigeedged.compile import resume

    calib = calibration.read(coco(tmp_path, _bbox([4, 4, 0, 10])), 3)
    doc = json.loads(json.dumps(resume._sample_doc(calib.samples[1])))
    assert resume._sample(doc) == calib.samples[1] and calib.samples[1].dropped == 1
    old = {"image": "/d/a.jpg", "labels": [0], "boxes": [[1.0, 2.0, 3.0, 4.0]]}
    assert resume._sample(old) == calibration.Sample(Path("/d/a.jpg"), (0,), ((1.0, 2.0, 3.0, 4.0),), 0)
