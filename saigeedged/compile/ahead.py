"""A job's host steps done ahead (SPEC §11): the work in one bounded child, when its result may be reused, and its
replay in the pipeline (the job's log and status say the steps were done, and when)."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from saigeedged.compile import inputs, prepare
from saigeedged.compile.inputs import PathPolicy, Prepared
from saigeedged.manifest import Entry

if TYPE_CHECKING:
    from saigeedged.adapters.joblog import JobLog

Stat = tuple[int, int, int] | None  # inode, size, mtime_ns; None when the file is gone


class HostSteps(Protocol):
    """What the pipeline calls for validate, surgery and calibration (prepare.Bounded runs them, Ready replays)."""

    def validate(self, entry: Entry, work_dir: Path, policy: PathPolicy, max_onnx_bytes: int | None,
                 on_digest: Callable[[str], None]) -> Prepared: ...

    def surgery(self, prep: Prepared) -> Prepared: ...

    def calibrate(self, prep: Prepared) -> None: ...


def host_steps(entry: Entry, work_dir: Path, policy: PathPolicy, max_onnx_bytes: int | None) -> Prepared:
    """In the child: validate, surgery and calibration as the pipeline runs them, one after the other."""
    digest = inputs.locate(entry, policy, max_onnx_bytes)
    prep = prepare.inspect_job(entry, work_dir, policy, digest)
    if inputs.needs_surgery(entry):
        prep = prepare.surgery_job(prep)
    prep.chosen, prep.dataset = prepare.calibrate_job(prep)
    return prep


def _stat(path: Path) -> Stat:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_ino, st.st_size, st.st_mtime_ns


def fingerprint(paths: list[Path]) -> tuple[Stat, ...]:
    """What tells a file was replaced (inode) or written (size, mtime) since; not ctime, which every hard link to
    a shared calibration image (another job's staging, or its removal) moves."""
    return tuple(_stat(p) for p in paths)


def doc_digest(doc: dict[str, Any]) -> str:
    """The job's resolved manifest entry, as stored in its row (a retry or a new attempt may not change it, but
    the prep is reused only for exactly what it was made from)."""
    return hashlib.sha256(json.dumps(doc, sort_keys=True, default=str).encode()).hexdigest()


@dataclass
class Prep:
    """One job's host steps done ahead, or being done: what they were made from and what they found."""

    job_id: str
    attempt: int
    doc: str
    work_dir: Path
    inputs: tuple[Stat, ...] = ()  # ONNX and calibration file, taken before the child read them
    result: Prepared | None = None
    images: tuple[Stat, ...] = ()  # the chosen calibration images, once known
    running: bool = True
    seconds: float = 0.0
    finished_at: str = ""
    beside: str = ""  # the job that was compiling meanwhile
    taken: Callable[[], str | None] | None = field(default=None, repr=False)  # the worker's interrupt, once taken

    def unusable(self, attempt: int, doc: str, entry: Entry) -> str | None:
        """Why this prep cannot stand for the job's host steps now (None: it can)."""
        result = self.result
        if result is None:
            return "its preparation did not finish"
        if attempt != self.attempt or doc != self.doc:
            return f"prepared for attempt {self.attempt}, the job is at attempt {attempt}"
        if fingerprint([entry.onnx, entry.calib]) != self.inputs or \
                fingerprint([s.image for s in result.chosen]) != self.images:
            return "an input changed after it was prepared"
        if not result.model.is_file() or result.dataset is None or not result.dataset.is_file():
            return "its work folder is incomplete"
        return None


class Replay:
    """Host steps already done: each step returns what they found and says so (`note`) in the job log."""

    def __init__(self, result: Prepared, log: JobLog, note: str) -> None:
        self.result, self.log, self.note = result, log, note

    def _note(self) -> None:
        self.log.line(self.note)

    def validate(self, entry: Entry, work_dir: Path, policy: PathPolicy, max_onnx_bytes: int | None,
                 on_digest: Callable[[str], None]) -> Prepared:
        on_digest(self.result.onnx_sha256)
        self._note()
        return self.result

    def surgery(self, prep: Prepared) -> Prepared:
        self._note()
        return self.result

    def calibrate(self, prep: Prepared) -> None:
        self._note()


class Ready(Replay):
    """The host steps of a prepared job, as the preparer left them."""

    def __init__(self, prep: Prep, log: JobLog) -> None:
        assert prep.result is not None
        beside = f" while {prep.beside} compiled" if prep.beside else ""
        super().__init__(prep.result, log, f"prepared ahead{beside} (finished {prep.finished_at}, "
                         f"host steps {prep.seconds:.2f}s)")
        self.prep = prep
