"""Attempt records in the store (SPEC §15): one row per time a job was taken, its facts as versioned JSON
(records.AttemptRecord). Written under the attempt's fence where the attempt writes them; read at start-up, at a
re-attach and by the engine monitor's reap."""

from __future__ import annotations

import dataclasses
import json
import sqlite3
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

from saigeedged.adapters.database import FENCE, StoreFull, fence_args, patient
from saigeedged.jobs import RUNNING, Attempt, Job, Superseded
from saigeedged.records import AttemptRecord, UnreadableRecord


def _decode(text: object) -> AttemptRecord:
    try:
        doc = json.loads(str(text))
    except ValueError as exc:
        raise UnreadableRecord(f"attempt record is not JSON: {exc}") from None
    return AttemptRecord.from_doc(doc)


def write(db: sqlite3.Connection, record: AttemptRecord) -> None:
    """Insert or replace `record` (inside the caller's transaction)."""
    db.execute("INSERT OR REPLACE INTO attempts (job_id, take, engine, reap, doc) VALUES (?, ?, ?, ?, ?)",
               (record.job_id, record.take, record.engine, int(record.reap), json.dumps(record.to_doc())))


class AttemptRecords:
    """The attempt records of the store (mixed into adapters.store.Store, which provides the connection)."""

    wait_for_room: Callable[[StoreFull], bool] | None

    def _rows(self, sql: str, args: tuple[object, ...] = ()) -> list[tuple[object, ...]]:
        raise NotImplementedError

    def _tx(self) -> AbstractContextManager[sqlite3.Connection]:
        raise NotImplementedError

    def record(self, job_id: str, take: int) -> AttemptRecord | None:
        """The record of the `take`-th attempt of the job; None when there is none; UnreadableRecord when it cannot be
        read (damaged, or another version's)."""
        rows = self._rows("SELECT doc FROM attempts WHERE job_id = ? AND take = ?", (job_id, take))
        return _decode(rows[0][0]) if rows else None

    def current_record(self, job: Job) -> AttemptRecord | None:
        """The record of the attempt `job` is on (its last take)."""
        return self.record(job.job_id, len(job.attempts))

    @patient
    def put_record(self, record: AttemptRecord) -> None:
        """Write a whole record (the daemon's own start-up: a crash counted, a record made anew to reap by)."""
        with self._tx() as db:
            write(db, record)

    @patient
    def update_record(self, job_id: str, take: int, fence: Attempt | None = None, /,
                      **changes: Any) -> AttemptRecord:
        """Change fields of a record; with `fence`, only while the job's row still names that attempt (Superseded
        otherwise). Returns the record as written."""
        with self._tx() as db:
            if fence is not None and not db.execute(f"SELECT 1 FROM jobs WHERE job_id = ? AND state = ? AND {FENCE}",
                                                    (fence.job_id, RUNNING, *fence_args(fence))).fetchone():
                raise Superseded(f"job {job_id} is on another attempt than {fence}")
            row = db.execute("SELECT doc FROM attempts WHERE job_id = ? AND take = ?", (job_id, take)).fetchone()
            if row is None:
                raise UnreadableRecord(f"no record of attempt take {take} of job {job_id}")
            record = dataclasses.replace(_decode(row[0]), **changes)
            write(db, record)
        return record

    def reaps(self, engine: str | None = None) -> list[AttemptRecord]:
        """The attempts given up on whose steps are still to be killed (on `engine`, or on any)."""
        sql = "SELECT doc FROM attempts WHERE reap = 1" + (" AND engine = ?" if engine is not None else "")
        found = []
        for (doc,) in self._rows(sql + " ORDER BY job_id, take", (engine,) if engine is not None else ()):
            try:
                found.append(_decode(doc))
            except UnreadableRecord:
                continue  # marked by this daemon: never written unreadable; a damaged one has nothing to kill by
        return found

    @patient
    def reaped(self, record: AttemptRecord) -> None:
        """Its step was killed and its folder removed: nothing is left to do for that attempt."""
        with self._tx() as db:
            write(db, dataclasses.replace(record, reap=False))
