"""Queries over the job history (final rows): retention, metrics, the dashboard and `status` read them along the
partial indexes of the final rows (database.FINAL), naming their index, without decoding a long history whole."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator
from contextlib import AbstractContextManager
from typing import Any

from saigeedged.adapters.database import FINAL, FINISHED, PAGE, TARGET
from saigeedged.jobs import STOPPED, Job


class History:
    """The history queries of the store (mixed into adapters.store.Store, which provides the connection)."""

    def _rows(self, sql: str, args: tuple[object, ...] = ()) -> list[tuple[object, ...]]:
        raise NotImplementedError

    def _jobs(self, sql: str, args: tuple[object, ...] = ()) -> list[Job]:
        raise NotImplementedError

    def _tx(self) -> AbstractContextManager[sqlite3.Connection]:
        raise NotImplementedError

    def end_keys_since(self, stamp: str) -> list[tuple[str, str | None, int]]:
        """(job_id, finished_at, seq) of the final jobs whose `finished_at` is `stamp` or later (UTC ISO strings sort by
        time; "" = every final job), by seq, without their docs: a caller that has seen most of them decodes only the
        others (`paged`)."""
        if not stamp:
            rows = self._rows(f"SELECT job_id, {FINISHED}, seq FROM jobs WHERE {FINAL} ORDER BY seq")
        else:
            rows = self._rows(f"SELECT job_id, {FINISHED}, seq FROM jobs INDEXED BY jobs_finished WHERE {FINAL} AND "
                              f"{FINISHED} >= ? ORDER BY seq", (stamp,))
        return [(str(i), None if f is None else str(f), int(str(n))) for i, f, n in rows]

    def newest_end(self) -> str:
        """The latest `finished_at` of a final job ("" when none): one step along jobs_finished."""
        rows = self._rows(f"SELECT MAX({FINISHED}) FROM jobs INDEXED BY jobs_finished WHERE {FINAL}")
        return str(rows[0][0] or "")

    def ended_before(self, stamp: str) -> list[int]:
        """The seqs of final jobs that ended before `stamp` (or never said when), oldest first; read from the index
        alone, so a caller decodes only the pages it takes (`by_seqs`)."""
        rows = self._rows(f"SELECT seq FROM jobs INDEXED BY jobs_finished WHERE {FINAL} AND "
                          f"({FINISHED} < ? OR {FINISHED} IS NULL) ORDER BY {FINISHED}, seq", (stamp,))
        return [int(str(r[0])) for r in rows]

    def by_seqs(self, seqs: list[int]) -> list[Job]:
        marks = ",".join("?" * len(seqs))
        return self._jobs(f"SELECT doc FROM jobs WHERE seq IN ({marks}) ORDER BY seq", tuple(seqs)) if seqs else []

    def paged(self, seqs: list[int]) -> Iterator[Job]:
        """The jobs of `seqs`, decoded PAGE at a time (a long history is never whole in memory)."""
        for start in range(0, len(seqs), PAGE):
            yield from self.by_seqs(seqs[start:start + PAGE])

    def crowded_names(self, keep: int) -> list[str]:
        """Names with more than `keep` final jobs (from jobs_final_name alone)."""
        rows = self._rows(f"SELECT name FROM jobs INDEXED BY jobs_final_name WHERE {FINAL} GROUP BY name HAVING COUNT(*) > ? "
                          "ORDER BY name", (keep,))
        return [str(r[0]) for r in rows]

    def final_named(self, name: str) -> list[Job]:
        """Every final job of `name` (jobs_name)."""
        return self._jobs(f"SELECT doc FROM jobs WHERE name = ? AND {FINAL} ORDER BY seq", (name,))

    def with_bundle(self, path: str) -> list[Job]:
        """The jobs whose bundle is at `path` (relative to the outbox; several builds may share one, jobs_bundle)."""
        return self._jobs("SELECT doc FROM jobs WHERE json_extract(doc, '$.bundle.path') = ? ORDER BY seq", (path,))

    @staticmethod
    def _ended_in(after: str) -> str:
        """Final rows that ended in [after, before) (the `?`s); from the first end ("" after), rows that never said
        when they ended count too."""
        if after:
            return f"{FINAL} AND {FINISHED} >= ? AND {FINISHED} < ?"
        return f"{FINAL} AND ? = '' AND ({FINISHED} < ? OR {FINISHED} IS NULL)"

    def ended_groups(self, after: str, before: str,
                     bounds: tuple[float, ...]) -> list[tuple[str, str, str, int, int | None, int, float, str]]:
        """The final jobs that ended in [after, before), summed by SQLite along jobs_finished (no doc is decoded in
        Python): per (target, state, error code, cache hit, run-time bucket or None when it never ran), the jobs, the
        sum of their run times and the latest end."""
        ran = f"json_extract(doc, '$.started_at') <> '' AND json_extract(doc, '$.step') <> '' AND {FINISHED} <> ''"
        seconds = f"MAX(0.0, (julianday({FINISHED}) - julianday(json_extract(doc, '$.started_at'))) * 86400.0)"
        cases = " ".join(f"WHEN d <= {b!r} THEN {i}" for i, b in enumerate(bounds[:-1]))
        rows = self._rows(
            f"SELECT target, state, code, hit, CASE WHEN d IS NULL THEN NULL {cases} ELSE {len(bounds) - 1} END, "
            "COUNT(*), COALESCE(SUM(d), 0.0), COALESCE(MAX(finished), '') FROM (SELECT json_extract(doc, '$.target') AS "
            "target, state, COALESCE(json_extract(doc, '$.error.code'), '') AS code, CASE WHEN "
            f"json_extract(doc, '$.cache.hit') THEN 1 ELSE 0 END AS hit, CASE WHEN {ran} THEN {seconds} END AS d, "
            f"{FINISHED} AS finished FROM jobs INDEXED BY jobs_finished WHERE {self._ended_in(after)}) "
            "GROUP BY 1, 2, 3, 4, 5", (after, before))
        return [(str(t), str(st), str(c), int(str(h)), None if b is None else int(str(b)), int(str(n)), float(str(d)),
                 str(f)) for t, st, c, h, b, n, d, f in rows]

    def ended_attempts(self, after: str, before: str) -> list[tuple[str, str, int]]:
        """(engine, error code, `stopped` (a stop ended it) or "", attempts) over the attempts of the jobs that ended
        in [after, before) (jobs.attempt_outcome)."""
        rows = self._rows(
            "SELECT json_extract(a.value, '$.engine'), COALESCE(json_extract(a.value, '$.error'), "
            f"CASE WHEN json_extract(a.value, '$.stopped') THEN '{STOPPED}' ELSE '' END), COUNT(*) "
            f"FROM jobs INDEXED BY jobs_finished, json_each(jobs.doc, '$.attempts') AS a WHERE {self._ended_in(after)} "
            "GROUP BY 1, 2", (after, before))
        return [(str(e), str(c), int(str(n))) for e, c, n in rows]

    def last_measured(self, after: str, before: str) -> list[tuple[str, str, str, dict[str, Any]]]:
        """Per (target, task), the accuracy report of the job that ended last in [after, before) with one: (target,
        task, its end, the report). One pass along jobs_finished; SQLite takes a bare column from the MAX() row."""
        rows = self._rows(
            f"SELECT {TARGET}, json_extract(doc, '$.task'), MAX({FINISHED}), "
            f"json_extract(doc, '$.accuracy') FROM jobs INDEXED BY jobs_finished WHERE {self._ended_in(after)} "
            "AND json_type(doc, '$.accuracy') = 'object' GROUP BY 1, 2", (after, before))
        return [(str(t), str(k), str(f or ""), json.loads(str(a))) for t, k, f, a in rows]

    def tally(self, name: str) -> dict[str, Any] | None:
        """A summary kept beside the rows (the metrics' counts up to some end), or None."""
        rows = self._rows("SELECT doc FROM tallies WHERE name = ?", (name,))
        doc = json.loads(str(rows[0][0])) if rows else None
        return doc if isinstance(doc, dict) else None

    def set_tally(self, name: str, doc: dict[str, Any]) -> None:
        with self._tx() as db:
            db.execute("INSERT INTO tallies (name, doc) VALUES (?, ?) ON CONFLICT (name) DO UPDATE SET doc = excluded.doc",
                       (name, json.dumps(doc)))

    def forget(self, ends: list[tuple[str, str | None]]) -> int:
        """Delete the rows of final jobs (retention's `keep_rows_days`), each only if it still ended at that time (a
        `retry` meanwhile makes it a new job); returns how many went."""
        deleted = 0
        with self._tx() as db:
            for job_id, finished_at in ends:
                cur = db.execute(f"DELETE FROM jobs WHERE job_id = ? AND {FINAL} AND {FINISHED} IS ?", (job_id, finished_at))
                if cur.rowcount:
                    deleted += cur.rowcount
                    db.execute("DELETE FROM behind WHERE job_id = ?", (job_id,))
                    db.execute("DELETE FROM attempts WHERE job_id = ? AND reap = 0", (job_id,))
        return deleted
