"""Calibration sets (SPEC §5): val.json and COCO readers, the seeded samplers, decode checks, staging."""

from __future__ import annotations

import json
import os
import random
import re
import shutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from PIL import Image

from saigeedged import safeyaml
from saigeedged.errors import SaigeError

MAX_NAMED = 3  # offenders named in one message


@dataclass(frozen=True)
class Sample:
    image: Path
    labels: tuple[int, ...]
    boxes: tuple[tuple[float, float, float, float], ...] | None = None  # COCO only: xyxy pixels, one per label


@dataclass(frozen=True)
class CalibSet:
    source: Path
    samples: tuple[Sample, ...]
    class_names: tuple[str, ...] | None


def _bad(path: Path, message: str) -> SaigeError:
    return SaigeError("CALIB_INVALID", f"{path.name}: {message}")


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
    labels: dict[Any, list[int]] = {img["id"]: [] for img in data["images"]}
    boxes: dict[Any, list[tuple[float, float, float, float]] | None] = {img["id"]: [] for img in data["images"]}
    for ann in data["annotations"]:
        if ann.get("image_id") in labels:
            labels[ann["image_id"]].append(index.get(ann.get("category_id"), -1))
            boxes[ann["image_id"]] = _box(ann, boxes[ann["image_id"]])
    samples = [Sample(base / img["file_name"], tuple(labels[img["id"]]), _boxes(boxes[img["id"]]))
               for img in data["images"]]
    return samples, [str(c.get("name", c["id"])) for c in categories], len(categories)


def _box(ann: dict[str, Any], found: list[tuple[float, float, float, float]] | None
         ) -> list[tuple[float, float, float, float]] | None:
    """COCO `bbox` [x, y, w, h] appended as xyxy; an annotation without one leaves the image without boxes."""
    bbox = ann.get("bbox")
    if found is None or not (isinstance(bbox, list) and len(bbox) == 4
                             and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in bbox)):
        return None
    x, y, w, h = (float(v) for v in bbox)
    return [*found, (x, y, x + w, y + h)]


def _boxes(found: list[tuple[float, float, float, float]] | None) -> tuple[tuple[float, float, float, float], ...] | None:
    return tuple(found) if found is not None else None


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
    if {"images", "annotations", "categories"} <= set(data):
        samples, names, n_classes = _from_coco(path, data, base)
    else:
        samples, names, n_classes = _from_valjson(path, data, base)
    _check(path, samples, n_classes, num_classes)
    if check_path is not None:
        for sample in samples:
            check_path(sample.image)
    class_names = tuple(str(n) for n in names) if isinstance(names, list) else None
    return CalibSet(path, tuple(samples), class_names)


def _check(path: Path, samples: list[Sample], n_classes: Any, num_classes: int) -> None:
    """An empty split, a class count mismatch, out-of-range labels and missing images are CALIB_INVALID."""
    if not samples:
        raise _bad(path, "the split is empty")
    if n_classes is not None and n_classes != num_classes:
        raise _bad(path, f"n_classes is {n_classes} but the manifest's num_classes is {num_classes}")
    out_of_range = [s for s in samples if any(not 0 <= v < num_classes for v in s.labels)]
    if out_of_range:
        listed = ", ".join(f"{s.image.name} {list(s.labels)}" for s in out_of_range[:MAX_NAMED])
        raise _bad(path, f"{len(out_of_range)} image(s) with class ids outside [0, {num_classes}): {listed}")
    missing = [s.image for s in samples if not s.image.is_file()]
    if missing:
        raise _bad(path, f"{len(missing)} image(s) missing: {', '.join(str(p) for p in missing[:MAX_NAMED])}")


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
    deterministic, every image there is when fewer remain."""
    used = {s.image for s in chosen}
    rest = [s for s in calib.samples if s.image not in used]
    return pick(CalibSet(calib.source, tuple(rest), calib.class_names), n, seed, sampler) if rest and n > 0 else []


def check_decodes(source: Path, chosen: Sequence[Sample]) -> None:
    """Every chosen image decodes (JPEG/PNG/BMP), else CALIB_INVALID naming the first that do not."""
    broken = []
    for sample in chosen:
        try:
            with Image.open(sample.image) as img:
                img.load()
        except MemoryError:
            raise  # the child's memory bound: child.run names the limit
        except Exception:  # Pillow raises many types for broken files
            broken.append(sample.image)
    if broken:
        raise _bad(source, f"{len(broken)} image(s) do not decode: {', '.join(str(p) for p in broken[:MAX_NAMED])}")


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
