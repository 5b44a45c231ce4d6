"""The steps that load a model or a calibration list (validate, surgery, calibration) in a memory-bounded child.

The daemon's own memory must not grow with what is dropped: a 1 GB initializer or a million-entry val.json is
read by a child process that may map `limits.child_memory_bytes`, and one too large fails alone (ONNX_INVALID,
CALIB_INVALID). What comes back is small: shapes, names and the chosen images only.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from saigeedged.compile import calibration, child, inputs
from saigeedged.compile.calibration import CalibSet, Sample
from saigeedged.compile.inputs import PathPolicy, Prepared
from saigeedged.manifest import Entry

if TYPE_CHECKING:
    from saigeedged.config import Config

Interrupted = Callable[[], "str | None"]


def inspect_job(entry: Entry, work_dir: Path, policy: PathPolicy, digest: str) -> Prepared:
    """In the child: the model and calibration checks; the calibration set shrinks to its seeded sample (and the
    held-out evaluation images are chosen from what it left)."""
    prep = inputs.inspect(entry, work_dir, policy, digest)
    picked = calibration.pick(prep.calib, entry.n_samples, entry.seed, entry.profile.sampler)
    prep.held_out = tuple(calibration.evaluation(prep.calib, picked, entry.eval_samples, entry.seed, entry.profile.sampler))
    prep.calib = CalibSet(prep.calib.source, tuple(picked), prep.calib.class_names)
    return prep


def surgery_job(prep: Prepared) -> Prepared:
    inputs.surgery(prep)
    return prep


def calibrate_job(prep: Prepared) -> tuple[tuple[Sample, ...], Path]:
    """In the child: the sampled images decode and are staged with dataset.txt."""
    calibration.check_decodes(prep.calib.source, prep.calib.samples)
    return prep.calib.samples, calibration.stage(prep.calib.samples, prep.work_dir)


class Bounded:
    """Runs the three steps of one job in children with the config's memory bound and the step timeout."""

    def __init__(self, config: Config, interrupted: Interrupted, timeout_s: Callable[[], float]) -> None:
        self.memory = config.limits.child_memory_bytes
        self.interrupted, self.timeout_s = interrupted, timeout_s

    def validate(self, entry: Entry, work_dir: Path, policy: PathPolicy, max_onnx_bytes: int | None,
                 on_digest: Callable[[str], None]) -> Prepared:
        digest = inputs.locate(entry, policy, max_onnx_bytes)  # streams the file: constant memory, here
        on_digest(digest)
        prep: Prepared = child.run(inspect_job, (entry, work_dir, policy, digest), "validate", self.timeout_s(),
                                   self.interrupted, (self.memory, "ONNX_INVALID"))
        return prep

    def surgery(self, prep: Prepared) -> Prepared:
        cut: Prepared = child.run(surgery_job, (prep,), "surgery", self.timeout_s(), self.interrupted,
                                  (self.memory, "ONNX_INVALID"))
        return cut

    def calibrate(self, prep: Prepared) -> None:
        chosen, dataset = child.run(calibrate_job, (prep,), "calibration", self.timeout_s(), self.interrupted,
                                    (self.memory, "CALIB_INVALID"))
        prep.chosen, prep.dataset = chosen, dataset
