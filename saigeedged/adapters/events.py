"""Job events in the journal (SPEC §9): importable by the daemon and the commands without the worker."""

from __future__ import annotations

from typing import Any

import structlog

from saigeedged.jobs import FAILED, Job

log = structlog.get_logger()


def event(name: str, job: Job, level: str = "info", **fields: Any) -> None:
    """One journal entry for a job event, with the SPEC §9 fields and the job's attempt (a step's events of two
    attempts told apart)."""
    fields.setdefault("error_code", job.error["code"] if job.error else None)
    fields.setdefault("attempt", job.attempt)
    if job.error and job.state == FAILED:  # what to do about it, where `journalctl -u saigeedged` shows the failure
        fields.setdefault("hint", job.error.get("hint"))
    getattr(log, level)(name, job_id=job.job_id, job_name=job.name, state=job.state, step=job.step, **fields)
