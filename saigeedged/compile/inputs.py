"""A job's inputs checked and staged before any compiler runs (SPEC §5): path policy, ONNX, surgery, calibration."""

from __future__ import annotations

import shutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from saigeedged import external
from saigeedged.compile import calibration, onnxcheck
from saigeedged.compile.calibration import CalibSet, Sample
from saigeedged.compile.onnxcheck import ModelInfo
from saigeedged.errors import SaigeError
from saigeedged.files import sha256_file as sha256_file  # re-exported: callers import it from here
from saigeedged.manifest import Entry, safe_stem
from saigeedged.profiles import DETECTION_HEADS

if TYPE_CHECKING:
    import onnx


@dataclass(frozen=True)
class PathPolicy:
    """Where a drop's inputs may live once symlinks are followed; `roots=None` allows anything (CLI use)."""

    roots: tuple[Path, ...] | None = None

    def check(self, path: Path) -> None:
        if self.roots is None:
            return
        real = path.resolve()
        if not any(real.is_relative_to(root.resolve()) for root in self.roots):
            raise SaigeError("PATH_NOT_ALLOWED", f"{path} resolves to {real}, outside the inbox and allowed_roots")


@dataclass
class Prepared:
    """The checked inputs of one entry; `name`/`model` switch to the cut model after surgery."""

    entry: Entry
    work_dir: Path
    name: str
    model: Path
    info: ModelInfo
    input_size: tuple[int, int]
    calib: CalibSet
    onnx_sha256: str
    surgery: tuple[str, ...] | None = None
    chosen: Sequence[Sample] = ()
    dataset: Path | None = None
    held_out: tuple[Sample, ...] = ()  # the evaluation images calibration did not use (SPEC §17)


def validate(entry: Entry, work_dir: Path, policy: PathPolicy, max_onnx_bytes: int | None = None,
             on_digest: Callable[[str], None] = lambda digest: None) -> Prepared:
    """Step `validate`: paths, ONNX load/check/shapes, input size, calibration file; copies the model into work_dir.

    `on_digest` gets the ONNX's sha256 as soon as the file is known to be there (a later check may still fail).
    """
    digest = locate(entry, policy, max_onnx_bytes)
    on_digest(digest)
    return inspect(entry, work_dir, policy, digest)


def locate(entry: Entry, policy: PathPolicy, max_onnx_bytes: int | None = None) -> str:
    """The inputs are where the policy allows and the ONNX is not too large; returns the ONNX's sha256."""
    for path in (entry.onnx, entry.calib):
        policy.check(path)
        if not path.is_file():
            raise SaigeError("INPUT_NOT_FOUND", f"{path} not found (from {entry.manifest.name})")
    if max_onnx_bytes is not None and entry.onnx.stat().st_size > max_onnx_bytes:
        raise SaigeError("ONNX_INVALID", f"{entry.onnx.name} is larger than limits.max_onnx_bytes ({max_onnx_bytes})",
                         hint="raise limits.max_onnx_bytes in the daemon config")
    return sha256_file(entry.onnx)


def inspect(entry: Entry, work_dir: Path, policy: PathPolicy, digest: str) -> Prepared:
    """The rest of `validate`, which loads the model and reads the calibration file (memory grows with both)."""
    model = onnxcheck.load(entry.onnx, weights=False)
    info = onnxcheck.describe(model, entry.onnx)
    if entry.task != "detection":  # detection outputs are checked on the cut model
        size = onnxcheck.check_input_size(info, entry.input_size or entry.profile.input_size)
    else:
        size = onnxcheck.check_input_size(info, entry.input_size)
    calib = calibration.read(entry.calib, entry.num_classes, policy.check)
    work_dir.mkdir(parents=True, exist_ok=True)
    name = safe_stem(entry.onnx.stem)
    dest = work_dir / f"{name}.onnx"
    copy_model(entry.onnx, model, dest)
    return Prepared(entry, work_dir, name, dest, replace(info, path=dest), size, calib, digest)


def copy_model(src: Path, model: onnx.ModelProto, dest: Path) -> None:
    """The model file as dropped, and its external data files beside it (the checker kept them in its folder)."""
    shutil.copyfile(src, dest)
    for location in external.tensor_locations(model):
        target = dest.parent / location
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src.parent / location, target)


def surgery(prep: Prepared) -> None:
    """Step `surgery` (detection): cut at the three head tensors; from now on the stem is `<stem>_surgery`."""
    names = prep.entry.surgery_outputs or DETECTION_HEADS
    model = onnxcheck.load(prep.model)
    name = f"{prep.name}_surgery"
    dest = prep.work_dir / f"{name}.onnx"
    cut = onnxcheck.cut_outputs(model, prep.entry.onnx, names, dest)
    prep.info = onnxcheck.describe(cut, dest)
    prep.name, prep.model, prep.surgery = name, dest, names


def needs_surgery(entry: Entry) -> bool:
    return entry.task == "detection"
