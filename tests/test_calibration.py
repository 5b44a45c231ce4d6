"""Calibration files, samplers and staging (SPEC §5)."""

import json
import os
from collections import Counter
from pathlib import Path

import pytest
from factory import image, random_labels, valjson

from saigeedged.compile import calibration
from saigeedged.compile.calibration import Sample, sample_balanced, sample_uniform
from saigeedged.errors import SaigeError


def samples(labels: list[list[int]]) -> list[Sample]:
    return [Sample(Path(f"/x/{i}.jpg"), tuple(lab)) for i, lab in enumerate(labels)]


def test_valjson_relative_images_and_names(tmp_path: Path) -> None:
    """Relative image paths resolve against the JSON's folder; class names are kept."""
    path = valjson(tmp_path, [[0], [1, 1], [2]], names=["helmet", "head", "person"], relative=True)
    calib = calibration.read(path, 3)
    assert [s.image for s in calib.samples][0] == tmp_path / "images" / "img0000.jpg"
    assert calib.class_names == ("helmet", "head", "person")
    assert calib.samples[1].labels == (1, 1)


def test_coco_instances(tmp_path: Path) -> None:
    """A COCO file is recognised by its keys; category ids map to 0-based classes in id order."""
    image(tmp_path / "a.jpg", 1)
    image(tmp_path / "b.jpg", 2)
    coco = {"images": [{"id": 10, "file_name": "a.jpg"}, {"id": 11, "file_name": "b.jpg"}],
            "annotations": [{"image_id": 10, "category_id": 7}, {"image_id": 11, "category_id": 3},
                            {"image_id": 11, "category_id": 7}],
            "categories": [{"id": 7, "name": "person"}, {"id": 3, "name": "helmet"}]}
    (tmp_path / "instances.json").write_text(json.dumps(coco))
    calib = calibration.read(tmp_path / "instances.json", 2)
    assert calib.class_names == ("helmet", "person")
    assert [s.labels for s in calib.samples] == [(1,), (0, 1)]


@pytest.mark.parametrize(("labels", "n_classes", "message"), [
    ([[0], [5]], 3, "outside [0, 3)"),
    ([], 3, "empty"),
    ([[0], [1]], 2, "n_classes is 2"),
])
def test_bad_calibration(tmp_path: Path, labels: list[list[int]], n_classes: int, message: str) -> None:
    """Out-of-range ids, an empty split and a class-count mismatch are CALIB_INVALID."""
    path = valjson(tmp_path, labels, n_classes=n_classes)
    with pytest.raises(SaigeError) as err:
        calibration.read(path, 3)
    assert err.value.code == "CALIB_INVALID" and message in err.value.message


def test_missing_and_undecodable_images_are_named(tmp_path: Path) -> None:
    """A missing image fails the read; a corrupt one fails when chosen, both naming the file."""
    path = valjson(tmp_path, [[0], [1], [2]])
    (tmp_path / "images" / "img0001.jpg").unlink()
    with pytest.raises(SaigeError, match="img0001.jpg"):
        calibration.read(path, 3)
    (tmp_path / "images" / "img0001.jpg").write_bytes(b"\xff\xd8 not a jpeg")
    calib = calibration.read(path, 3)
    with pytest.raises(SaigeError, match="img0001.jpg") as err:
        calibration.choose(calib, 10, 1, "uniform")
    assert err.value.code == "CALIB_INVALID"


def test_uniform_is_seeded_without_replacement() -> None:
    """Same seed, same sample; no image twice; fewer images than asked gives them all."""
    pool = samples([[0]] * 50)
    a, b = sample_uniform(pool, 20, 3), sample_uniform(pool, 20, 3)
    assert a == b and len(set(a)) == 20
    assert sample_uniform(pool, 20, 4) != a
    assert sorted(s.image for s in sample_uniform(pool, 80, 3)) == sorted(s.image for s in pool)


def test_balanced_covers_every_class_rarest_first() -> None:
    """With n >= classes present, every class is in the sample, the rarest picked first, no duplicates."""
    labels = [[0]] * 40 + [[1]] * 10 + [[2]] * 2 + [[0, 3]]
    pool = samples(labels)
    chosen = sample_balanced(pool, 4, seed=11)
    assert {c for s in chosen for c in s.labels} == {0, 1, 2, 3}
    assert chosen[0].labels == (0, 3)  # class 3: one image, the rarest
    assert 2 in chosen[1].labels
    many = sample_balanced(pool, 30, seed=11)
    assert len(many) == len(set(many)) == 30


def test_balanced_round_robin_balances_counts() -> None:
    """Visiting classes in turn keeps the per-class image counts within one of each other while all last."""
    pool = samples(random_labels(0, 3) + [[c] for c in (0, 1, 2) for _ in range(20)])
    chosen = sample_balanced(pool, 30, seed=5)
    counts = Counter(c for s in chosen for c in s.labels)
    assert counts == {0: 10, 1: 10, 2: 10}
    assert sample_balanced(pool, 30, seed=5) == chosen and sample_balanced(pool, 30, seed=6) != chosen


def test_balanced_uses_everything_when_short() -> None:
    """Fewer images than n_samples: all are used, unlabelled ones included."""
    pool = samples([[0], [1], [], [1]])
    assert sorted(s.image.name for s in sample_balanced(pool, 10, 0)) == ["0.jpg", "1.jpg", "2.jpg", "3.jpg"]


def test_stage_hardlinks_and_writes_dataset(tmp_path: Path) -> None:
    """Chosen images are hard-linked as calib/NNNN_<name>; dataset.txt lists absolute paths, no comments."""
    path = valjson(tmp_path / "src", [[0], [1], [2]])
    chosen = calibration.choose(calibration.read(path, 3), 3, 0, "uniform")
    dataset = calibration.stage(chosen, tmp_path / "work")
    lines = dataset.read_text().splitlines()
    assert len(lines) == 3 and all(Path(line).is_absolute() and Path(line).is_file() for line in lines)
    assert not any(line.startswith("#") for line in lines)
    first = Path(lines[0])
    assert first.name == f"0000_{chosen[0].image.name}"
    assert os.stat(first).st_ino == os.stat(chosen[0].image).st_ino


def _held_out_of(path: Path) -> tuple[calibration.CalibSet, list[Sample], list[Sample]]:
    calib = calibration.read(path, 3)
    chosen = calibration.pick(calib, 8, 1337, "balanced")
    return calib, chosen, calibration.held_out(calib, chosen, 16, 1337, "balanced")


@pytest.mark.parametrize("damage", ["truncated", "no image"])
def test_a_held_out_image_that_does_not_decode_is_named(tmp_path: Path, damage: str) -> None:
    """The held-out images are decode-checked when chosen, like the calibration sample: CALIB_INVALID naming the file."""
    calib, chosen, held = _held_out_of(valjson(tmp_path, random_labels(24, 3)))
    data = held[1].image.read_bytes()
    held[1].image.write_bytes(data[: len(data) // 2] if damage == "truncated" else b"not an image at all")
    with pytest.raises(SaigeError) as err:
        calibration.evaluation(calib, chosen, 16, 1337, "balanced")
    assert err.value.code == "CALIB_INVALID" and held[1].image.name in err.value.message
    assert "held-out" in err.value.message


def test_one_image_file_is_one_image_whatever_its_path(tmp_path: Path) -> None:
    """A row repeated, another spelling of a path and a symlink are the same image: once in the set, never both in the
    calibration sample and held out, never twice held out (SPEC §5: no image is chosen twice)."""
    path = valjson(tmp_path, random_labels(12, 3))
    data = json.loads(path.read_text())
    rows = data["validation"]
    os.symlink(rows[4]["image"], tmp_path / "images" / "link.jpg")
    again = [dict(r) for r in rows] + [{**rows[3], "image": str(tmp_path / "images" / ".." / "images" / "img0003.jpg")},
                                       {**rows[4], "image": str(tmp_path / "images" / "link.jpg")}]
    data["validation"] = again
    path.write_text(json.dumps(data))
    calib, chosen, held = _held_out_of(path)
    assert len(calib.samples) == 12
    files = [s.image.resolve() for s in [*chosen, *held]]
    assert len(files) == len(set(files)) == 12


def test_one_image_file_with_two_sets_of_labels_is_one_image_with_all_of_them(tmp_path: Path) -> None:
    """The same file listed on several rows with other labels (another spelling of its path, a hard link) is one image
    in its first row's place holding every row's labels; a row repeating one of them adds nothing."""
    path = valjson(tmp_path, [[0], [1], [2]])
    os.link(tmp_path / "images" / "img0001.jpg", tmp_path / "images" / "hard.jpg")
    data = json.loads(path.read_text())
    data["validation"] += [{"image": str(tmp_path / "images" / ".." / "images" / "img0001.jpg"), "labels": [2]},
                           {"image": str(tmp_path / "images" / "hard.jpg"), "labels": [0, 2]},
                           {"image": str(tmp_path / "images" / "img0001.jpg"), "labels": [2]}]
    path.write_text(json.dumps(data))
    calib = calibration.read(path, 3)
    assert [(s.image.name, s.labels) for s in calib.samples] == [("img0000.jpg", (0,)), ("img0001.jpg", (1, 2, 0, 2)),
                                                                  ("img0002.jpg", (2,))]


def test_the_sample_of_a_file_without_repeated_images_is_pinned(tmp_path: Path) -> None:
    """The seeded sample and held-out set of a duplicate-free file stay as they were (the cache key, calib_digests.txt
    and a resumed attempt depend on them): reading the file keeps its rows and their order."""
    labels = [[i % 3] + ([(i // 3) % 3] if i % 4 else []) for i in range(20)]
    calib = calibration.read(valjson(tmp_path, labels), 3)
    assert [s.labels for s in calib.samples] == [tuple(lab) for lab in labels]
    picked = {}
    for sampler in ("uniform", "balanced"):
        chosen = calibration.pick(calib, 6, 1337, sampler)
        held = calibration.held_out(calib, chosen, 5, 1337, sampler)
        picked[sampler] = ([s.image.name[3:7] for s in chosen], [s.image.name[3:7] for s in held])
    assert picked == {"uniform": (["0019", "0017", "0011", "0005", "0010", "0006"], ["0013", "0012", "0015", "0007", "0018"]),
                      "balanced": (["0002", "0013", "0001", "0007", "0003", "0009"], ["0004", "0011", "0000", "0016", "0008"])}


def test_n_classes_must_be_a_number(tmp_path: Path) -> None:
    """`"n_classes": "3"` is named as a string, not reported as a mismatch of 3 with 3."""
    path = valjson(tmp_path, [[0], [1], [2]])
    data = json.loads(path.read_text())
    data["n_classes"] = "3"
    path.write_text(json.dumps(data))
    with pytest.raises(SaigeError) as err:
        calibration.read(path, 3)
    assert err.value.code == "CALIB_INVALID" and "n_classes must be an integer, got '3'" in err.value.message
    assert "not a string" in err.value.hint
