"""Attempts a daemon of the release before attempt records (main at 2f35d79) left running: its facts were in the
attempt's folder (its host steps' results serialised as Python objects beside `.steps/<n>.exec`, `.steps/detached`,
`.steps/crashes`), which the compiler container can write: none of it is trusted as code, and those objects are never
loaded (SPEC §15, §16).

An upgrade during a container step finds such an attempt without a record. Its record is rebuilt here from what can
be checked: the entry from the job row; the ONNX facts by loading the model files already in the work dir (read only);
the calibration choice by running the seeded sampler again (SPEC §5: same calibration file, n_samples and seed give
the same choice), nothing staged or written; and the work dir must agree (the model copy has the dropped ONNX's
digest, the surgery model is there, dataset.txt lists exactly the staged images of that choice). The steps' book
(exec ids, log offsets) and the stop/crash markers become the record's fields. Anything that disagrees or cannot be
read: Unresumable, and the caller keeps the old behaviour (kill the step, requeue).

Delete this module (and its call in service/recovery.py and service/daemon.py) in a later release, once no host can
upgrade from a release before attempt records with a step running.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from saigeedged.compile import calibration, child, inputs, onnxcheck, resume
from saigeedged.compile.calibration import CalibSet
from saigeedged.compile.inputs import PathPolicy, Prepared
from saigeedged.config import Config
from saigeedged.errors import SaigeError
from saigeedged.jobs import Job, entry_from_doc
from saigeedged.manifest import Entry, safe_stem
from saigeedged.profiles import DETECTION_HEADS
from saigeedged.records import AttemptRecord

STEPS = ".steps"
MARKERS = ("detached", "crashes")  # the old release's stop and crash counts, now fields of the record
EXEC_ID = re.compile(r"[0-9a-f]{64}")


class Unresumable(Exception):
    """The legacy attempt's folder does not agree with what its job and inputs say (or cannot be read)."""


def started(work: Path) -> bool:
    """Did a daemon of the old release start a container step of this attempt (an exec id beside the steps)?"""
    return any((work / STEPS).glob("*.exec"))


def _disagrees(message: str) -> SaigeError:
    return SaigeError("INTERNAL", message)


def host_facts(entry: Entry, work: Path, policy: PathPolicy) -> Prepared:
    """In a bounded child: the host steps' results as the old daemon found them, checked against its work dir; nothing
    is written (a model loaded read only, the sampler run again)."""
    digest = inputs.locate(entry, policy)
    name = safe_stem(entry.onnx.stem)
    model = work / f"{name}.onnx"
    if not model.is_file() or inputs.sha256_file(model) != digest:
        raise _disagrees(f"{model.name} in the work dir is missing or is not the dropped model")
    info = onnxcheck.describe(onnxcheck.load(model, weights=False), model)
    wanted = entry.input_size if entry.task == "detection" else entry.input_size or entry.profile.input_size
    size = onnxcheck.check_input_size(info, wanted)
    calib = calibration.read(entry.calib, entry.num_classes, policy.check)
    picked = calibration.pick(calib, entry.n_samples, entry.seed, entry.profile.sampler)
    held = calibration.held_out(calib, picked, entry.eval_samples, entry.seed, entry.profile.sampler)
    prep = Prepared(entry, work, name, model, info, size, CalibSet(calib.source, tuple(picked), calib.class_names),
                    digest, held_out=tuple(held))
    if inputs.needs_surgery(entry):
        names = tuple(entry.surgery_outputs or DETECTION_HEADS)
        cut = work / f"{name}_surgery.onnx"
        if not cut.is_file():
            raise _disagrees(f"{cut.name} (the surgery model) is not in the work dir")
        prep.info = onnxcheck.describe(onnxcheck.load(cut, weights=False), cut)
        if tuple(prep.info.output_names) != names:
            raise _disagrees(f"{cut.name} has outputs {list(prep.info.output_names)}, not {list(names)}")
        prep.name, prep.model, prep.surgery = f"{name}_surgery", cut, names
    prep.chosen, prep.dataset = tuple(picked), _staged(work, picked)
    return prep


def _staged(work: Path, picked: list[calibration.Sample]) -> Path:
    """dataset.txt of `work`, once it lists exactly the staged images of the sampler's choice, each the same size as
    the image it stands for."""
    dataset = work / "dataset.txt"
    staged = [work / "calib" / f"{i:04d}_{calibration.staged_name(s.image)}" for i, s in enumerate(picked)]
    try:
        listed = dataset.read_text().splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise _disagrees(f"dataset.txt cannot be read: {exc}") from None
    if listed != [str(p.resolve()) for p in staged]:
        raise _disagrees(f"dataset.txt lists {len(listed)} images, not the {len(staged)} the seeded sampler chooses")
    for path, sample in zip(staged, picked, strict=True):
        if not path.is_file() or path.stat().st_size != sample.image.stat().st_size:
            raise _disagrees(f"the staged image {path.name} is missing or differs from {sample.image.name}")
    return dataset


def _int(path: Path) -> int:
    try:
        return max(0, int(path.read_text().strip() or 0))
    except (OSError, ValueError, UnicodeDecodeError):
        return 0


def book(work: Path) -> dict[str, dict[str, object]]:
    """The steps' exec ids and log offsets the old daemon kept beside the steps, as the record's `steps`."""
    steps: dict[str, dict[str, object]] = {}
    for path in sorted((work / STEPS).glob("*.exec")):
        try:
            exec_id = path.read_text().strip()
        except (OSError, UnicodeDecodeError) as exc:
            raise Unresumable(f"{path.name} cannot be read: {exc}") from None
        if not path.stem.isdigit() or not EXEC_ID.fullmatch(exec_id):
            raise Unresumable(f"{path.name} does not hold an exec id of step {path.stem}")
        steps[str(int(path.stem))] = {"exec": exec_id, "seen": _int(path.with_suffix(".seen"))}
    return steps


def rebuild(job: Job, work: Path, config: Config) -> AttemptRecord:
    """The record of the running `job`'s attempt a daemon of the old release left in `work`; Unresumable (saying why)
    when its folder does not agree with its job and inputs."""
    limits = config.limits
    try:
        entry = entry_from_doc(job.entry)
        policy = PathPolicy((Path(job.claim_dir), config.inbox, *config.allowed_roots))
        prep: Prepared = child.run(host_facts, (entry, work, policy), "legacy attempt", float(limits.step_timeout_s),
                                   lambda: None, (limits.child_memory_bytes, "ONNX_INVALID"))
    except SaigeError as exc:
        raise Unresumable(exc.message) from None
    except Exception as exc:  # a row or a file of some other shape: not resumable, never a crash of the start-up
        raise Unresumable(f"{type(exc).__name__}: {exc}") from None
    engine = str(job.attempts[-1]["engine"]) if job.attempts else ""
    return AttemptRecord(job.job_id, len(job.attempts), job.attempt, engine, job.target, str(work), started=True,
                         crashes=_int(work / STEPS / "crashes"), detached=(work / STEPS / "detached").exists(),
                         prepared=resume.to_doc(prep), steps=book(work))


def forget(work: Path) -> None:
    """The record now holds the markers: remove them (after it was written, so a kill between loses nothing)."""
    for name in MARKERS:
        try:
            os.unlink(work / STEPS / name)
        except FileNotFoundError:
            pass
