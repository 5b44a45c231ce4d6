"""The worker's view of its attempt's record in the store (SPEC §15): what it says before a step starts, after the host
steps, when the daemon leaves on purpose, and whether a re-attached attempt can go on."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from saigeedged.adapters.joblog import JobLog
from saigeedged.adapters.store import Store, StoreFull
from saigeedged.compile import ahead, resume
from saigeedged.compile.inputs import Prepared
from saigeedged.engines import CONTAINER_TARGETS
from saigeedged.errors import SaigeError
from saigeedged.jobs import Attempt, Job, Superseded
from saigeedged.records import AttemptRecord, UnreadableRecord


class Facts:
    """The record of the attempt a worker runs now (`attempt()`, None between jobs)."""

    def __init__(self, store: Store, attempt: Callable[[], Attempt | None]) -> None:
        self.store, self.attempt = store, attempt

    def of(self, job: Job) -> AttemptRecord | None:
        """The record of the attempt `job` is on; None when it has none or it cannot be read."""
        try:
            return self.store.current_record(job)
        except UnreadableRecord:
            return None

    def step_may_run(self, job: Job) -> bool:
        """May a container step of the job's attempt be running? (A host job runs none; no record, or one unreadable:
        it may.)"""
        if job.target not in CONTAINER_TARGETS:
            return False
        record = self.of(job)
        return record is None or record.started

    # -- detached.Book: the steps' exec ids and log offsets, in the record (never in the container's folder) --------
    def _step(self, work: Path, n: int) -> dict[str, Any]:
        attempt = self.attempt()
        record = None if attempt is None else self.store.record(attempt.job_id, attempt.take)
        return dict(record.steps.get(_key(record, work, n), {})) if record is not None else {}

    def _set_step(self, work: Path, n: int, started: bool = False, **fields: Any) -> None:
        attempt = self.attempt()
        if attempt is None:
            return
        record = self.store.record(attempt.job_id, attempt.take)
        steps = dict(record.steps) if record is not None else {}
        key = _key(record, work, n)
        steps[key] = {**steps.get(key, {}), **fields}
        changes: dict[str, Any] = {"steps": steps, **({"started": True} if started else {})}
        self.store.update_record(attempt.job_id, attempt.take, attempt, **changes)

    def launched(self, work: Path, n: int, exec_id: str) -> None:
        """Step `n` is about to start: the record says so first (Superseded: the attempt is over, it must not)."""
        self._set_step(work, n, started=True, exec=exec_id)

    def exec_id(self, work: Path, n: int) -> str | None:
        value = self._step(work, n).get("exec")
        return value if isinstance(value, str) and value else None

    def seen(self, work: Path, n: int) -> int:
        value = self._step(work, n).get("seen", 0)
        return value if isinstance(value, int) else 0

    def mark_seen(self, work: Path, n: int, offset: int) -> None:
        self._set_step(work, n, seen=offset)

    def prepared(self, prep: Prepared) -> None:
        """The host steps are done: their results go into the record, for a resume."""
        attempt = self.attempt()
        if attempt is not None:
            self.store.update_record(attempt.job_id, attempt.take, attempt, prepared=resume.to_doc(prep))

    def detach(self, job: Job) -> None:
        """The daemon leaves the attempt on purpose (a stop): the next start re-attaches, counting no crash. (On a full
        state_dir the mark is lost, and the stop counts as one crash.)"""
        with contextlib.suppress(Superseded, UnreadableRecord, StoreFull):
            self.store.update_record(job.job_id, len(job.attempts), Attempt.of(job), detached=True)

    def give_up(self, job: Job) -> None:
        """The attempt cannot go on: its step is killed by the engine monitor when its engine answers."""
        record = self.of(job)
        if record is not None and record.work:
            self.store.update_record(job.job_id, record.take, reap=True)

    def replay(self, job: Job, joblog: JobLog) -> ahead.Replay | None:
        """The host steps of a re-attached attempt as its record keeps them; None when none ran (nor any step). Host
        steps never run again beside a step that may be running: such an attempt raises, to be given up."""
        record = self.of(job)
        host = resume.replay(record.prepared if record else None, joblog)
        if host is None and (record is None or record.started):
            raise SaigeError("ENGINE_LOST", "the attempt's record cannot be resumed (unreadable, another version's, "
                             "or its host steps' files are gone): its step is killed and the job runs again",
                             step=job.step, unresumable=True)
        return host


def _key(record: AttemptRecord | None, work: Path, n: int) -> str:
    """Step `n`'s key in the record: its number for a step of the attempt's own folder, else prefixed by its folder
    under it (a variant's: each variant numbers its steps from 1 in its own folder)."""
    if record is None or not record.work or work == Path(record.work):
        return str(n)
    try:
        return f"{work.relative_to(record.work)}/{n}"
    except ValueError:
        return f"{work}/{n}"
