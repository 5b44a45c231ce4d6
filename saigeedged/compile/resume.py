"""An attempt's host steps kept in its store record as versioned JSON (SPEC §15), so the attempt resumed after a
daemon restart goes on with its container steps as they were: the calibration images are not staged again under a
running quantize. Plain JSON, decoded field by field: the record is data, so a file in a folder the container can
write, or a class moved by an upgrade, cannot run code in the daemon or break the resume."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from saigeedged.compile.ahead import Replay
from saigeedged.compile.calibration import CalibSet, Sample
from saigeedged.compile.inputs import Prepared
from saigeedged.compile.onnxcheck import ModelInfo
from saigeedged.jobs import entry_from_doc, entry_to_doc

if TYPE_CHECKING:
    from saigeedged.adapters.joblog import JobLog

VERSION = 1  # of the prepared document; another version is not resumed (the attempt is requeued, its step killed)


def _sample_doc(sample: Sample) -> dict[str, Any]:
    return {"image": str(sample.image), "labels": list(sample.labels),
            "boxes": None if sample.boxes is None else [None if b is None else list(b) for b in sample.boxes],
            "dropped": sample.dropped}


def _sample(doc: dict[str, Any]) -> Sample:
    """A sample of to_doc(); one of a document written before labels could lack a box has every box and no
    `dropped` (0)."""
    boxes = doc["boxes"]
    return Sample(Path(doc["image"]), tuple(int(v) for v in doc["labels"]),
                  None if boxes is None else tuple(None if b is None else (float(b[0]), float(b[1]), float(b[2]), float(b[3]))
                                                   for b in boxes), int(doc.get("dropped", 0)))


def to_doc(prep: Prepared) -> dict[str, Any]:
    """What validate, surgery and calibration found, as JSON-able data."""
    info = asdict(prep.info)
    return {"version": VERSION, "entry": entry_to_doc(prep.entry), "work_dir": str(prep.work_dir), "name": prep.name,
            "model": str(prep.model),
            "info": {**info, "path": str(prep.info.path), "input_shape": list(prep.info.input_shape),
                     "output_names": list(prep.info.output_names),
                     "output_shapes": [list(s) for s in prep.info.output_shapes]},
            "input_size": list(prep.input_size),
            "calib": {"source": str(prep.calib.source), "samples": [_sample_doc(s) for s in prep.calib.samples],
                      "class_names": None if prep.calib.class_names is None else list(prep.calib.class_names)},
            "onnx_sha256": prep.onnx_sha256, "surgery": None if prep.surgery is None else list(prep.surgery),
            "chosen": [_sample_doc(s) for s in prep.chosen],
            "dataset": None if prep.dataset is None else str(prep.dataset),
            "held_out": [_sample_doc(s) for s in prep.held_out]}


def from_doc(doc: dict[str, Any]) -> Prepared:
    """The Prepared of `doc`; ValueError when it is not a document of this version (KeyError and TypeError become
    ValueError too: a damaged document is unreadable, not a bug)."""
    if doc.get("version") != VERSION:
        raise ValueError(f"prepared inputs of version {doc.get('version')!r}, this saigeedged reads {VERSION}")
    try:
        info = doc["info"]
        calib = doc["calib"]
        names = calib["class_names"]
        return Prepared(
            entry_from_doc(doc["entry"]), Path(doc["work_dir"]), str(doc["name"]), Path(doc["model"]),
            ModelInfo(Path(info["path"]), str(info["input_name"]), tuple(info["input_shape"]),
                      tuple(info["output_names"]), tuple(tuple(int(d) for d in s) for s in info["output_shapes"])),
            (int(doc["input_size"][0]), int(doc["input_size"][1])),
            CalibSet(Path(calib["source"]), tuple(_sample(s) for s in calib["samples"]),
                     None if names is None else tuple(str(n) for n in names)),
            str(doc["onnx_sha256"]), None if doc["surgery"] is None else tuple(doc["surgery"]),
            tuple(_sample(s) for s in doc["chosen"]), None if doc["dataset"] is None else Path(doc["dataset"]),
            tuple(_sample(s) for s in doc["held_out"]))
    except (KeyError, TypeError, IndexError, AttributeError) as exc:
        raise ValueError(f"prepared inputs are damaged: {type(exc).__name__}: {exc}") from None


def _readable(doc: dict[str, Any] | None) -> Prepared | None:
    """The Prepared of `doc` if it can be read and its dataset is still there, else None."""
    if doc is None:
        return None
    try:
        prep = from_doc(doc)
    except ValueError:
        return None
    return prep if prep.dataset is not None and prep.dataset.is_file() else None


def usable(doc: dict[str, Any] | None) -> bool:
    """Can an attempt resume from these host steps' results (readable, of this version, its dataset there)?"""
    return _readable(doc) is not None


def replay(doc: dict[str, Any] | None, log: JobLog) -> Replay | None:
    """The host steps of an attempt as they ended before the restart; None when they did not end (or their record
    cannot be read, or its dataset is gone): the caller must then not run them again beside a started step."""
    prep = _readable(doc)
    return None if prep is None else Replay(prep, log, "host steps done before the restart: kept as they were")
