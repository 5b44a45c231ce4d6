"""Job records, their states and the transition table (pure: no I/O)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from saigeedged.errors import ErrorDoc
from saigeedged.manifest import Entry

QUEUED, RUNNING, SUCCEEDED, FAILED, CANCELLED = "queued", "running", "succeeded", "failed", "cancelled"
TERMINAL = frozenset({SUCCEEDED, FAILED, CANCELLED})
TRANSITIONS: dict[str, frozenset[str]] = {
    QUEUED: frozenset({RUNNING, CANCELLED, FAILED}),
    RUNNING: frozenset({SUCCEEDED, FAILED, CANCELLED, QUEUED}),  # QUEUED: interrupted or retryable failure
    FAILED: frozenset({QUEUED}),  # saigeedged retry
    CANCELLED: frozenset({QUEUED}),
    SUCCEEDED: frozenset(),
}


class TransitionError(ValueError):
    """A state change the table does not allow (a bug or a race lost to another process)."""


class Superseded(TransitionError):
    """A write of an attempt the store no longer names (requeued, moved, ended): nothing of it may be recorded or
    published (SPEC §15)."""


class CancelWins(TransitionError):
    """A requeue of an attempt whose job `saigeedged cancel` flagged: the job ends cancelled instead (SPEC §15)."""


def check_transition(old: str, new: str) -> None:
    if new not in TRANSITIONS[old]:
        raise TransitionError(f"job cannot go from {old} to {new}")


@dataclass
class Job:
    """One job as stored in the queue and shown in its status file."""

    job_id: str
    name: str
    target: str
    task: str
    entry: dict[str, Any]  # Entry fields, paths as strings (see entry_to_doc)
    subdir: str  # the drop's folder relative to the inbox ("" at the top)
    claim_dir: str  # where the claimed inputs are
    manifest: str  # the manifest's name, for the status file
    priority: int = 0
    state: str = QUEUED
    attempt: int = 1
    step: str | None = None
    step_index: int = 0
    step_count: int = 0
    request_id: str | None = None
    created_at: str = ""
    started_at: str | None = None
    finished_at: str | None = None
    updated_at: str = ""
    error: ErrorDoc | None = None
    bundle: dict[str, Any] | None = None
    onnx_sha256: str | None = None
    calib_samples: int | None = None
    report: dict[str, Any] | None = None
    accuracy: dict[str, Any] | None = None  # the accuracy report and gate verdict (SPEC §17), once measured
    progress: dict[str, Any] | None = None
    cache: dict[str, Any] | None = None  # {hit, key, source_job_id} once the compile key is known (SPEC §12)
    engine: str | None = None  # the engine of the current/last attempt (SPEC §11); None for host jobs
    attempts: list[dict[str, Any]] = field(default_factory=list)  # {engine, started_at, finished_at, error}
    # when retention removed its files (SPEC §13): its bundle path may hold another job's bundle since
    pruned_at: str | None = None
    # the running attempt was handed to the finishing stage (its report, bundle, publication): its slot's worker runs
    # another job. Recorded at the hand-over, cleared when a job is taken or re-attached in its slot; `status` and the
    # dashboard go by it, not by the step (a handed job waiting for a finisher is still in its last compile step, and
    # a worker whose backlog is full, or a Slurm job, bundles and publishes its job itself)
    finishing: bool = False
    extra: dict[str, Any] = field(default_factory=dict)

    def to_doc(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_doc(cls, doc: dict[str, Any]) -> Job:
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in doc.items() if k in names})


@dataclass(frozen=True)
class Attempt:
    """One run of a job, the fence of its writes (SPEC §15): the store must still name it for any of them to land.

    `take` counts the job's attempt records when it was taken: an attempt requeued unspent (the engine was
    unreachable) and taken again on the same engine keeps its `attempt` number, and the old run is still fenced off.
    """

    job_id: str
    attempt: int
    engine: str  # the engine of the attempt record (HOST_ENGINE for host jobs), not job.engine (None on the host)
    take: int

    @classmethod
    def of(cls, job: Job) -> Attempt:
        """The attempt `job` is running now (as Store.take returned it)."""
        if not job.attempts:
            raise ValueError(f"job {job.job_id} has no attempt")
        return cls(job.job_id, job.attempt, str(job.attempts[-1]["engine"]), len(job.attempts))


def entry_to_doc(entry: Entry) -> dict[str, Any]:
    """Entry → JSON-able dict (paths as strings)."""
    doc = dataclasses.asdict(entry)
    for key, value in doc.items():
        if isinstance(value, Path):
            doc[key] = str(value)
        elif isinstance(value, tuple):
            doc[key] = list(value)
    return doc


def entry_from_doc(doc: dict[str, Any]) -> Entry:
    values = dict(doc)
    for key in ("calib", "onnx", "manifest"):
        values[key] = Path(values[key])
    for key in ("input_size", "surgery_outputs"):
        if values.get(key) is not None:
            values[key] = tuple(values[key])
    return Entry(**values)


def bundle_rel(job: Job) -> Path:
    """Where `job` publishes its bundle, relative to the outbox: its drop's sub-folder, its manifest's `output:`."""
    return Path(job.subdir) / entry_from_doc(job.entry).output_name


HOST_ENGINE = "host"  # host jobs' attempts are recorded on this engine name; their `engine` stays None


def begin_attempt(job: Job, engine: str, now_iso: str) -> None:
    """A slot of `engine` starts running `job`: a new open attempt, and `job.engine` names it (None on the host).

    Each entry carries the job's `attempt` number (retries, stops and spent attempts count it up; a requeue that spends
    none, DOCKER_UNAVAILABLE, takes the same number again), so `status` numbers them as the status file's `attempt` does.
    An attempt still open is one the daemon died under (nothing ended it): it is closed now, as INTERNAL.
    """
    end_attempt(job, now_iso, "INTERNAL")
    job.engine = None if engine == HOST_ENGINE else engine
    job.attempts.append({"engine": engine, "attempt": job.attempt, "started_at": now_iso, "finished_at": None,
                         "error": None})


STOPPED = "stopped"  # how an attempt a stop ended is counted (no error code: no failure, no cancel)


def attempt_outcome(attempt: dict[str, Any]) -> str:
    """How an ended attempt is counted (the engine_attempts metric): its error code, `stopped`, or "" (it succeeded)."""
    return str(attempt.get("error") or (STOPPED if attempt.get("stopped") else ""))


def spent(job: Job) -> int:
    """How many of limits.max_attempts the job has used: its attempt number less the attempts a stop ended.

    A stop (SIGTERM, an upgrade) is the operator's, not the job's: its requeue opens a new attempt number (SPEC §8, an
    attempt is named by it, §15), and it uses none of the job's retries. Before, a stop at the last attempt kept its
    number so as not to use them: five stops numbered the runs 1, 2, 3, 3, 3, 3 (such a job, recorded before, counts
    each number a stop ended once: its number 3 is one stop, not two).
    """
    return job.attempt - len({attempt["attempt"] for attempt in job.attempts if attempt.get("stopped")})


def end_attempt(job: Job, now_iso: str, code: str | None, stopped: bool = False) -> None:
    """The open attempt ends (any way: success None, else the error code); no open attempt: nothing to close.
    `stopped`: the daemon stopped under it (no error of the job's, and no cancel: it goes back to the queue)."""
    if job.attempts and job.attempts[-1]["finished_at"] is None:
        job.attempts[-1].update(finished_at=now_iso, error=code, **({"stopped": True} if stopped else {}))


def remaining_s(started_iso: str, now: datetime, limit_s: float) -> float:
    """What is left of `limit_s` for an attempt started at `started_iso` (its whole life counts, re-attaches after a
    restart or an outage included); the whole limit when the start cannot be read."""
    try:
        started = datetime.fromisoformat(started_iso.replace("Z", "+00:00"))
    except (AttributeError, ValueError):
        return limit_s
    return limit_s - max(0.0, (now - started).total_seconds())


def status_text(running: Job | None, queued: int, engine_down: bool = False) -> str:
    """The systemd STATUS= line."""
    waiting = ", Docker engine unreachable: container jobs wait" if engine_down else ""
    if running is None:
        return f"idle, {queued} queued{waiting}"
    doing = f"{running.step} {running.step_index}/{running.step_count}" if running.step else "starting"  # no step yet
    return f"compiling {running.name} ({doing}), {queued} queued{waiting}"
