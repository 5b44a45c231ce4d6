"""COCO instances files (SPEC §5, §17): boxes, image ids and categories checked when read, boxes against their image."""

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
    ("nan", _bbox([float("nan"), 4, 20, 10]), "annotations[3] (id 103, image_id 1)"),
    ("inf", _bbox([4, 4, float("inf"), 10]), "annotations[3] (id 103, image_id 1)"),
    ("huge", _bbox([1e308, 1e308, 1e308, 1e308]), "not a box"),
    ("zero width", _bbox([4, 4, 0, 10]), "width and height above 0"),
    ("negative height", _bbox([4, 4, 20, -10]), "width and height above 0"),
    ("three numbers", _bbox([4, 4, 20]), "bbox must be [x, y, width, height]"),
    ("one without bbox", lambda data: data["annotations"][5].pop("bbox"), "annotations[5] (id 105, image_id 2) has no `bbox`"),
    ("repeated image id", lambda data: data["images"][2].update(id=1), "images[2] repeats image id 1"),
    ("unknown category", lambda data: data["annotations"][6].update(category_id=77),
     "annotations[6] (id 106, image_id 3) has category_id 77, not one of the categories' ids (1, 2, 3)"),
]


@pytest.mark.parametrize(("label", "mutate", "named"), BAD, ids=[b[0] for b in BAD])
def test_what_is_not_a_box_or_an_image_is_named(tmp_path: Path, label: str, mutate: Any, named: str) -> None:
    """Non-finite or empty boxes, a missing bbox among boxed annotations, a repeated image id and an unknown category
    are CALIB_INVALID naming the annotation or image and the value, with a hint; never a silently skewed mAP."""
    with pytest.raises(SaigeError) as err:
        calibration.read(coco(tmp_path, mutate), 3)
    assert err.value.code == "CALIB_INVALID" and named in err.value.message, err.value.message
    assert err.value.hint and "fix the calibration file: every image" not in err.value.hint


def test_no_bbox_at_all_is_a_file_without_boxes(tmp_path: Path) -> None:
    """COCO without any `bbox` is read (mlc, or detection without mAP against labels): its samples have no boxes."""
    calib = calibration.read(coco(tmp_path, lambda data: [a.pop("bbox") for a in data["annotations"]]), 3)
    assert all(s.boxes is None for s in calib.samples) and calib.samples[0].labels == (0, 1)


def test_a_box_entirely_outside_its_image_is_refused_when_chosen(tmp_path: Path) -> None:
    """A box that misses its image is CALIB_INVALID when the image is chosen (its size is known once it decodes); one
    partly outside is kept as it is (the report clips it)."""
    calib = calibration.read(coco(tmp_path, _bbox([50, 40, 100, 100])), 3)
    calibration.check_decodes(calib.source, calib.samples)
    calib = calibration.read(coco(tmp_path, _bbox([5000, 5000, 50, 50])), 3)
    with pytest.raises(SaigeError) as err:
        calibration.check_decodes(calib.source, calib.samples)
    assert err.value.code == "CALIB_INVALID" and "img1.jpg box 1" in err.value.message
    assert "entirely outside" in err.value.message and "[x, y, width, height]" in err.value.hint


def test_no_annotation_at_all_is_images_without_labels(tmp_path: Path) -> None:
    """COCO with an empty `annotations` is images with boxes but no label: the report says no image has a label
    (evaluate._labels_note), not that the file has no boxes."""
    calib = calibration.read(coco(tmp_path, lambda data: data.update(annotations=[])), 3)
    assert all(s.boxes == () and s.labels == () for s in calib.samples)
