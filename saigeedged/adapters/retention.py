"""Retention (SPEC §13): which final jobs' outputs have aged out (pure), and removing them (`saigeedged prune`).

A final job's files are its status file, its log, its bundle and its inputs under failed/. A job is pruned when
no rule keeps it: `max_age_days` keeps what ended or was written more recently than that, `keep_last_per_name`
keeps the newest N final jobs of each name (per drop folder). Nothing of a queued or running job, and no file another
kept job still points at (several builds of one name share a bundle path), is ever removed. The rows stay in the
queue, marked `pruned_at` (what shows them then names no file of theirs), unless `keep_rows_days` is set: then a
pruned job's row goes too once it ended that long ago.

A round reads only the jobs a rule may give up, by index (those that ended before the age cutoff, or the names with
more than N final jobs), a page at a time: its cost follows what is due, not the length of the history.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TextIO

import structlog

from saigeedged import config
from saigeedged.adapters.metrics import seconds
from saigeedged.adapters.store import Store
from saigeedged.jobid import iso
from saigeedged.jobs import QUEUED, RUNNING, TERMINAL, Job, bundle_rel

log = structlog.get_logger()
DAY_S = 86400.0


@dataclass(frozen=True)
class Policy:
    """`retention:` of the config; both 0 = off."""

    max_age_days: float = 0.0
    keep_last_per_name: int = 0
    keep_rows_days: float = 0.0  # 0: rows stay

    @classmethod
    def from_config(cls, section: config.Retention) -> Policy:
        return cls(section.max_age_days, section.keep_last_per_name, section.keep_rows_days)

    @property
    def enabled(self) -> bool:
        return self.max_age_days > 0 or self.keep_last_per_name > 0


def kept(aged: list[tuple[Job, float]], policy: Policy, now: float) -> set[str]:
    """The ids of the final jobs some rule keeps; `aged` pairs each with when its files were last written."""
    keep = {job.job_id for job, when in aged if policy.max_age_days > 0 and now - when < policy.max_age_days * DAY_S}
    if policy.keep_last_per_name > 0:
        groups: dict[tuple[str, str], list[Job]] = {}
        for job, _ in aged:
            groups.setdefault((job.subdir, job.name), []).append(job)
        for group in groups.values():
            group.sort(key=lambda j: (j.finished_at or "", j.job_id), reverse=True)
            keep.update(j.job_id for j in group[:policy.keep_last_per_name])
    return keep


@dataclass(frozen=True)
class Outputs:
    """Where a job's files are."""

    outbox: Path
    failed: Path  # <inbox>/.saigeedged/failed

    def files(self, job: Job) -> list[Path]:
        found = [self.outbox / "status" / f"{job.job_id}.json", self.outbox / "logs" / f"{job.job_id}.log"]
        if job.bundle:
            found.append(self.outbox / job.bundle["path"])
        elif job.state not in TERMINAL:
            found.extend(self._future_bundle(job))
        if Path(job.claim_dir).parent == self.failed:
            found.append(Path(job.claim_dir))
        return found

    def contained(self, path: Path) -> bool:
        """Is `path` where it says, inside the outbox or failed/, once symlinks and `..` in its folders are followed?
        (A folder of the share replaced by a symlink must not lead a prune elsewhere.)"""
        if path.name in ("", ".", ".."):
            return False
        folder = path.parent.resolve()
        return any(folder.is_relative_to(root.resolve()) for root in (self.outbox, self.failed))

    def _future_bundle(self, job: Job) -> list[Path]:
        """Where a queued or running job will publish (it may be replacing that file right now)."""
        try:
            return [self.outbox / bundle_rel(job)]
        except (KeyError, TypeError, ValueError):
            return []

    def written(self, job: Job) -> float:
        """When the job's outputs were last written: its status file's mtime (its end), else its end in the row."""
        for path in (self.outbox / "status" / f"{job.job_id}.json", self.outbox / "logs" / f"{job.job_id}.log"):
            try:
                return path.stat().st_mtime
            except OSError:
                continue
        return seconds(job.finished_at) if job.finished_at else time.time()


def _stamp(epoch: float) -> str:
    return iso(datetime.fromtimestamp(epoch, UTC))


def unkept(store: Store, outputs: Outputs, policy: Policy, now: float) -> Iterator[Job]:
    """The final jobs no rule keeps, found by index: with an age rule only jobs that ended before its cutoff can
    qualify (a job's files are written when it ends, or later), else only jobs of names with more than N."""
    if not policy.enabled:
        return
    if policy.max_age_days > 0:
        candidates: Iterator[Job] = store.paged(store.ended_before(_stamp(now - policy.max_age_days * DAY_S)))
    else:
        candidates = (job for name in store.crowded_names(policy.keep_last_per_name) for job in store.final_named(name))
    groups: dict[str, set[str]] = {}  # name -> ids keep_last_per_name keeps
    for job in candidates:
        if policy.keep_last_per_name > 0 and job.name not in groups:
            groups[job.name] = kept([(j, 0.0) for j in store.final_named(job.name)], Policy(0.0, policy.keep_last_per_name),
                                    now)
        if job.job_id in groups.get(job.name, set()):
            continue
        if policy.max_age_days > 0 and now - outputs.written(job) < policy.max_age_days * DAY_S:
            continue
        yield job


def _shared(store: Store, outputs: Outputs, job: Job, unkept_ids: set[str]) -> set[Path]:
    """Paths of `job` another job still needs: a bundle several builds share, a claimed folder of one drop."""
    others = store.with_bundle(job.bundle["path"]) if job.bundle else []
    others += store.by_claim(job.claim_dir)
    return {path for other in others if other.job_id not in unkept_ids and other.job_id != job.job_id
            for path in outputs.files(other)}


def plan(store: Store, outputs: Outputs, policy: Policy, now: float) -> list[tuple[Job, list[Path]]]:
    """The final jobs to prune, each with its files that exist and that no job still kept points at."""
    final = list(unkept(store, outputs, policy, now))
    ids = {job.job_id for job in final}
    protected = {path for job in store.in_state(QUEUED, RUNNING) for path in outputs.files(job)}
    doomed = []
    for job in final:
        paths = [p for p in outputs.files(job)
                 if p not in protected and (p.exists() or p.is_symlink()) and outputs.contained(p)]
        if paths:
            shared = _shared(store, outputs, job, ids)
            paths = [p for p in paths if p not in shared]
        if paths:
            doomed.append((job, paths))
    return doomed


def old_rows(store: Store, outputs: Outputs, policy: Policy, now: float) -> list[Job]:
    """The unkept jobs whose rows go too (`keep_rows_days`): they ended before that cutoff."""
    if policy.keep_rows_days <= 0:
        return []
    cutoff = _stamp(now - policy.keep_rows_days * DAY_S)
    return [job for job in unkept(store, outputs, policy, now) if (job.finished_at or "") < cutoff]


def forget(store: Store, jobs: list[Job]) -> int:
    """Delete the rows of these jobs that are still as planned (a `retry` may have queued one meanwhile)."""
    return store.forget([(job.job_id, job.finished_at) for job in jobs]) if jobs else 0


def remove(store: Store, doomed: list[tuple[Job, list[Path]]], now: float, announce: bool = True) -> list[Path]:
    """Delete the planned files of each job that is still as planned (`retry` may have queued it meanwhile).

    The row is marked pruned first, by the write that checks it is still as planned: a crash between the two leaves a
    row that says pruned beside files still there, never a row that names a bundle path a later job may take.
    `announce`: a journal event per job (the daemon); the operator's shell gets printed lines instead.
    """
    removed = []
    for job, paths in doomed:
        if not store.mark_pruned(job.job_id, job.finished_at, _stamp(now)):
            continue
        for path in paths:
            try:
                if path.is_dir() and not path.is_symlink():
                    shutil.rmtree(path)
                else:
                    path.unlink(missing_ok=True)
            except OSError as exc:  # said even from the shell: the file stays
                log.warning("retention.failed", job_id=job.job_id, job_name=job.name, path=str(path), message=str(exc))
                continue
            removed.append(path)
        if announce:
            log.info("retention.pruned", job_id=job.job_id, job_name=job.name, state=job.state, files=len(paths))
    return removed


def prune(store: Store, outputs: Outputs, policy: Policy, now: float) -> int:
    """One retention round in the daemon; returns the number of files removed."""
    removed = remove(store, plan(store, outputs, policy, now), now)
    rows = forget(store, old_rows(store, outputs, policy, now))
    log.info("retention.done", removed=len(removed), rows_deleted=rows, max_age_days=policy.max_age_days,
             keep_last_per_name=policy.keep_last_per_name, keep_rows_days=policy.keep_rows_days)
    return len(removed)


def main(store: Store, outputs: Outputs, policy: Policy, dry_run: bool, out: TextIO) -> int:
    """`saigeedged prune [--dry-run]`: print each file it removes (or would remove), and the rows it deletes."""
    if not policy.enabled:
        print("retention is off (retention.max_age_days and retention.keep_last_per_name are 0): nothing to prune",
              file=out)
        return 0
    now = time.time()
    doomed = plan(store, outputs, policy, now)
    if dry_run:
        for job, paths in doomed:
            print("\n".join(f"would remove {path}  ({job.job_id}, {job.state})" for path in paths), file=out)
        rows = f", {len(old_rows(store, outputs, policy, now))} rows" if policy.keep_rows_days > 0 else ""
        print(f"{len(doomed)} jobs, {sum(len(p) for _, p in doomed)} files{rows} would be removed (dry run)", file=out)
        return 0
    removed = remove(store, doomed, now, announce=False)
    for path in removed:
        print(f"removed {path}", file=out)
    rows = f", {forget(store, old_rows(store, outputs, policy, now))} rows deleted" if policy.keep_rows_days > 0 else ""
    print(f"{len(doomed)} jobs, {len(removed)} files removed{rows}", file=out)
    return 0
