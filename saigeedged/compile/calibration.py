"""Calibration sets (SPEC §5): val.json and COCO readers, the seeded samplers, decode checks, staging."""

from __future__ import annotations

import json
import math
import os
import random
import re
import shutil
import stat
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from PIL import Image

from saigeedged import safeyaml
from saigeedged.errors import SaigeError

MAX_NAMED = 3  # offenders named in one message
Box = tuple[float, float, float, float]  # xyxy pixels


@dataclass(frozen=True)
class Sample:
    image: Path
    labels: tuple[int, ...]
    # COCO with boxes only: xyxy pixels, one per label; None where that label has no usable box (its annotation has
    # none, or one that is not a box: `dropped` counts those). The accuracy report leaves such an image out of mAP.
    boxes: tuple[Box | None, ...] | None = None
    dropped: int = 0


@dataclass(frozen=True)
class CalibSet:
    source: Path
    samples: tuple[Sample, ...]
    class_names: tuple[str, ...] | None


def _bad(path: Path, message: str, hint: str | None = None) -> SaigeError:
    return SaigeError("CALIB_INVALID", f"{path.name}: {message}", hint=hint)


def _from_valjson(path: Path, data: dict[str, Any], base: Path) -> tuple[list[Sample], list[str] | None, Any]:
    rows = data.get("validation")
    if not isinstance(rows, list):
        raise _bad(path, "`validation` must be a list of {image, labels}")
    samples = []
    for i, row in enumerate(rows):
        if not isinstance(row, dict) or not isinstance(row.get("image"), str) or not isinstance(row.get("labels", []), list):
            raise _bad(path, f"validation[{i}] must be {{image: str, labels: [int]}}")
        labels = row.get("labels", [])
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in labels):
            raise _bad(path, f"validation[{i}].labels must be integers, got {labels!r}")
        samples.append(Sample(base / row["image"], tuple(labels)))
    return samples, data.get("class_names"), data.get("n_classes")


def _from_coco(path: Path, data: dict[str, Any], base: Path) -> tuple[list[Sample], list[str] | None, Any]:
    categories = sorted(data["categories"], key=lambda c: c["id"])
    index = {c["id"]: i for i, c in enumerate(categories)}
    labels: dict[Any, list[int]] = {}
    for i, img in enumerate(data["images"]):
        if img["id"] in labels:
            raise _bad(path, f"images[{i}] repeats image id {safeyaml.shown(img['id'])} ({safeyaml.shown(img.get('file_name'))})",
                       "give every image its own `id`: annotations of a repeated id cannot be told apart")
        labels[img["id"]] = []
    boxes: dict[Any, list[Box | None]] = {key: [] for key in labels}
    dropped = dict.fromkeys(labels, 0)
    listed = [(i, ann) for i, ann in enumerate(data["annotations"]) if ann.get("image_id") in labels]
    with_box = _with_boxes(ann for _, ann in listed)
    for i, ann in listed:
        labels[ann["image_id"]].append(_category(path, i, ann, index))
        if with_box:
            box = _box(ann)
            boxes[ann["image_id"]].append(box)
            dropped[ann["image_id"]] += box is None and _given(ann)
    samples = [Sample(base / img["file_name"], tuple(labels[img["id"]]),
                      tuple(boxes[img["id"]]) if with_box else None, dropped[img["id"]]) for img in data["images"]]
    return samples, [str(c.get("name", c["id"])) for c in categories], len(categories)


def _named(i: int, ann: dict[str, Any]) -> str:
    """An annotation as a message names it: its index, its id and its image's id."""
    return f"annotations[{i}] (id {safeyaml.shown(ann.get('id'))}, image_id {safeyaml.shown(ann.get('image_id'))})"


def _given(ann: dict[str, Any]) -> bool:
    """Whether the annotation gives a box: `bbox` there, not null and not `[]` (a tag-style export's "no box")."""
    return ann.get("bbox") not in (None, [])


def _with_boxes(annotations: Iterable[dict[str, Any]]) -> bool:
    """Whether the file has boxes: one annotation of a listed image gives one (the others then have none: their images
    leave the report's mAP, not the file), or there is no such annotation at all (boxes, none of them: the report
    then says no image has a label, not that the file has no boxes)."""
    seen = False
    for ann in annotations:
        if _given(ann):
            return True
        seen = True
    return not seen


def _category(path: Path, i: int, ann: dict[str, Any], index: dict[Any, int]) -> int:
    if ann.get("category_id") not in index:
        known = ", ".join(safeyaml.shown(k) for k in list(index)[:8]) + (", ..." if len(index) > 8 else "")
        raise _bad(path, f"{_named(i, ann)} has category_id {safeyaml.shown(ann.get('category_id'))}, "
                   f"not one of the categories' ids ({known})", "add the category to `categories` or fix the annotation")
    return index[ann["category_id"]]


def _box(ann: dict[str, Any]) -> Box | None:
    """COCO `bbox` [x, y, w, h] as xyxy; None when there is none or it is not a box (four finite numbers, width and
    height above 0): that label has no box, its image leaves the report's mAP and the report counts the dropped boxes
    (a box never refuses the file: an mlc or reid job does not use them)."""
    bbox = ann.get("bbox")
    if not (isinstance(bbox, list) and len(bbox) == 4
            and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in bbox)):
        return None
    x, y, w, h = (float(v) for v in bbox)
    if not all(math.isfinite(v) for v in (x, y, w, h, x + w, y + h)) or w <= 0 or h <= 0:
        return None
    return (x, y, x + w, y + h)


def read(path: Path, num_classes: int, check_path: Callable[[Path], None] | None = None) -> CalibSet:
    """Read a val.json or COCO instances file; every image must exist and every label be in range."""
    try:
        return _parse(path, num_classes, check_path)
    except MemoryError:  # in the daemon's bounded child: this file, not the host, is too large
        raise _bad(path, "reading it needs more memory than limits.child_memory_bytes allows") from None


def _parse(path: Path, num_classes: int, check_path: Callable[[Path], None] | None) -> CalibSet:
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise SaigeError("INPUT_NOT_FOUND", f"calibration file {path} not found") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise _bad(path, f"not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise _bad(path, "must be a JSON object (val.json or COCO instances)")
    try:
        return _read(path, data, num_classes, check_path)
    except SaigeError:
        raise
    except (KeyError, TypeError, AttributeError, ValueError, OSError) as exc:  # a file of some other shape
        kind = "COCO instances file" if {"images", "annotations", "categories"} <= set(data) else "val.json"
        detail = f"`{exc.args[0]}` missing" if isinstance(exc, KeyError) and exc.args else type(exc).__name__
        raise _bad(path, f"not a valid {kind} ({safeyaml.shown(detail)})") from None


def _read(path: Path, data: dict[str, Any], num_classes: int, check_path: Callable[[Path], None] | None) -> CalibSet:
    base = path.parent
    coco = {"images", "annotations", "categories"} <= set(data)
    samples, names, n_classes = (_from_coco if coco else _from_valjson)(path, data, base)
    _check(path, samples, n_classes, num_classes)
    samples = distinct(path, samples)
    if check_path is not None:
        for sample in samples:
            check_path(sample.image)
    class_names = tuple(str(n) for n in names) if isinstance(names, list) else None
    return CalibSet(path, tuple(samples), class_names)


def _check(path: Path, samples: list[Sample], n_classes: Any, num_classes: int) -> None:
    """An empty split, a class count mismatch and out-of-range labels are CALIB_INVALID."""
    if not samples:
        raise _bad(path, "the split is empty")
    if n_classes is not None and (not isinstance(n_classes, int) or isinstance(n_classes, bool)):
        raise _bad(path, f"n_classes must be an integer, got {safeyaml.shown(n_classes)}",
                   f"write `\"n_classes\": {num_classes}` (a number, not a string), or leave it out")
    if n_classes is not None and n_classes != num_classes:
        raise _bad(path, f"n_classes is {n_classes} but the manifest's num_classes is {num_classes}")
    out_of_range = [s for s in samples if any(not 0 <= v < num_classes for v in s.labels)]
    if out_of_range:
        listed = ", ".join(f"{s.image.name} {list(s.labels)}" for s in out_of_range[:MAX_NAMED])
        raise _bad(path, f"{len(out_of_range)} image(s) with class ids outside [0, {num_classes}): {listed}")


def distinct(path: Path, samples: Sequence[Sample]) -> list[Sample]:
    """Each image file once, told by the file itself (device and inode: another spelling of its path, a symlink or
    a hard link is the same image), in its first row's place: a row repeating one before it for that file (the same
    labels and boxes) adds nothing, one with others adds its labels (and boxes) to the image's. A missing image (or
    one that is no regular file) is CALIB_INVALID, naming the first. A file without such rows keeps its order and
    samples as they were (the seeded sample, and so the cache key and a resumed attempt, depend on it)."""
    first: dict[tuple[int, int], int] = {}  # file -> its place in `kept`
    rows: dict[tuple[int, int], list[list[tuple[int, Box | None]]]] = {}  # file -> the truths of its rows so far
    kept: list[Sample] = []
    missing: list[Path] = []
    for sample in samples:
        try:
            st = sample.image.stat()
        except (OSError, ValueError):  # ValueError: a NUL in the path
            st = None
        if st is None or not stat.S_ISREG(st.st_mode):
            missing.append(sample.image)
            continue
        key = (st.st_dev, st.st_ino)
        truth = _truth(sample)
        if key not in first:
            first[key], rows[key] = len(kept), [truth]
            kept.append(sample)
        elif truth not in rows[key]:
            rows[key].append(truth)
            kept[first[key]] = _merged(kept[first[key]], sample)
    if missing:
        raise _bad(path, f"{len(missing)} image(s) missing: {', '.join(str(p) for p in missing[:MAX_NAMED])}")
    return kept


def _merged(into: Sample, more: Sample) -> Sample:
    """`into` (the image's first row, whose path it keeps) with the labels, boxes and dropped boxes of `more`."""
    boxes = None if into.boxes is None or more.boxes is None else into.boxes + more.boxes
    return Sample(into.image, into.labels + more.labels, boxes, into.dropped + more.dropped)


def _truth(sample: Sample) -> list[tuple[int, Box | None]]:
    """A sample's labels (with their boxes), in no particular order."""
    boxes: Sequence[Box | None] = sample.boxes if sample.boxes is not None else [None] * len(sample.labels)
    return sorted(zip(sample.labels, boxes, strict=True), key=repr)


def sample_uniform(samples: Sequence[Sample], n: int, seed: int) -> list[Sample]:
    """A seeded sample without replacement."""
    rng = random.Random(seed)
    return [samples[i] for i in rng.sample(range(len(samples)), min(n, len(samples)))]


def sample_balanced(samples: Sequence[Sample], n: int, seed: int) -> list[Sample]:
    """Image-level class-balanced: classes round-robin from the rarest, each taking its next unchosen image."""
    order = list(range(len(samples)))
    random.Random(seed).shuffle(order)
    by_class: dict[int, list[int]] = {}
    for i in order:
        for c in sorted(set(samples[i].labels)):
            by_class.setdefault(c, []).append(i)
    classes = sorted(by_class, key=lambda c: (len(by_class[c]), c))
    cursor = dict.fromkeys(classes, 0)
    chosen: list[int] = []
    taken: set[int] = set()
    target = min(n, len(samples))
    while len(chosen) < target and classes:
        for c in list(classes):
            images = by_class[c]
            while cursor[c] < len(images) and images[cursor[c]] in taken:
                cursor[c] += 1
            if cursor[c] == len(images):
                classes.remove(c)
                continue
            chosen.append(images[cursor[c]])
            taken.add(images[cursor[c]])
            if len(chosen) == target:
                break
    # images without any label only fill up when every labelled image is used
    chosen += [i for i in order if i not in taken][: target - len(chosen)]
    return [samples[i] for i in chosen]


def choose(calib: CalibSet, n: int, seed: int, sampler: str) -> list[Sample]:
    """Pick the calibration images and check that each one decodes."""
    chosen = pick(calib, n, seed, sampler)
    check_decodes(calib.source, chosen)
    return chosen


def pick(calib: CalibSet, n: int, seed: int, sampler: str) -> list[Sample]:
    """The seeded sample (no image is opened)."""
    sample = sample_balanced if sampler == "balanced" else sample_uniform
    return sample(calib.samples, n, seed)


def held_out(calib: CalibSet, chosen: Sequence[Sample], n: int, seed: int, sampler: str) -> list[Sample]:
    """Up to `n` images calibration did not use, by the same seeded sampler (SPEC §17): disjoint from `chosen`,
    deterministic, every image there is when fewer remain. (read() left each image file once in the set.)"""
    used = {s.image for s in chosen}
    rest = [s for s in calib.samples if s.image not in used]
    return pick(CalibSet(calib.source, tuple(rest), calib.class_names), n, seed, sampler) if rest and n > 0 else []


def evaluation(calib: CalibSet, chosen: Sequence[Sample], n: int, seed: int, sampler: str) -> list[Sample]:
    """held_out(), each image checked like the calibration sample (check_decodes): at validate, not after the
    compile, where a broken one would end the report."""
    held = held_out(calib, chosen, n, seed, sampler)
    check_decodes(calib.source, held, "held-out image(s) for the accuracy report")
    return held


def check_decodes(source: Path, chosen: Sequence[Sample], what: str = "image(s)") -> None:
    """Every chosen image decodes (JPEG/PNG/BMP), else CALIB_INVALID naming the first that do not. (A box entirely
    outside its image is the accuracy report's to drop and count, evaluate._letterboxed: never the calibration's.)"""
    broken = [sample.image for sample in chosen if not _decodes(sample.image)]
    if broken:
        raise _bad(source, f"{len(broken)} {what} do not decode: {', '.join(str(p) for p in broken[:MAX_NAMED])}")


def _decodes(image: Path) -> bool:
    try:
        with Image.open(image) as img:
            img.load()
    except MemoryError:
        raise  # the child's memory bound: child.run names the limit
    except Exception:  # Pillow raises many types for broken files
        return False
    return True


def staged_name(image: Path) -> str:
    """The image's name reduced to [A-Za-z0-9._-] and 100 characters (its end, to keep the extension): one line
    of dataset.txt each, whatever the original name holds (a newline, a space, an escape)."""
    return re.sub(r"[^A-Za-z0-9._-]", "_", image.name)[-100:].lstrip(".") or "image"


def stage(chosen: Sequence[Sample], work_dir: Path, folder_name: str = "calib", listing: str = "dataset.txt") -> Path:
    """Hard-link (or copy) the images to work_dir/calib/NNNN_<name> and write dataset.txt; return its path.
    (The held-out images go to eval/ and eval_dataset.txt, where the cubie container sees them too.)"""
    folder = work_dir / folder_name
    folder.mkdir(parents=True, exist_ok=True)
    lines = []
    for i, sample in enumerate(chosen):
        dest = folder / f"{i:04d}_{staged_name(sample.image)}"
        if not dest.exists():
            try:
                os.link(sample.image.resolve(), dest)
            except OSError:
                shutil.copyfile(sample.image, dest)
        lines.append(str(dest.resolve()))
    dataset = work_dir / listing
    dataset.write_text("\n".join(lines) + "\n")
    return dataset
