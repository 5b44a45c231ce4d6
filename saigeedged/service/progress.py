"""What one attempt's pipeline reports back (SPEC §8): each step and progress written under the attempt's fence, the
inputs' facts kept on the job, the bundle published while the store still names the attempt."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from saigeedged.adapters.events import event
from saigeedged.errors import SaigeError
from saigeedged.jobs import Attempt, CancelWins, Job
from saigeedged.service.lifecycle import Jobs
from saigeedged.service.publishing import publish_patiently


class Progress:
    """The pipeline's callbacks for the attempt `attempt` of `job` (whose bundle goes to `rel` in the outbox)."""

    def __init__(self, jobs: Jobs, job: Job, attempt: Attempt, rel: Path, on_change: Callable[[], None],
                 interrupted: Callable[[], str | None], patience_s: float, replayed: int = 0) -> None:
        self.jobs, self.job, self.attempt, self.rel = jobs, job, attempt, rel
        self.on_change, self.interrupted, self.patience_s = on_change, interrupted, patience_s
        # the index of the step a re-attached attempt was in: the steps up to it are gone through again without a
        # `job.step` event each (the journal had them before the restart, and `job.reattached` says where it goes
        # on), so the journal does not read as if the job started over; once a step beyond it starts, every step is
        # new (a variant sweep goes back)
        self.replaying = replayed

    def step(self, name: str, index: int, count: int) -> None:
        job = self.job
        job.step, job.step_index, job.step_count = name, index, count  # progress names its own step
        self.jobs.save(job, fence=self.attempt)
        if index > self.replaying:
            self.replaying = 0
            event("job.step", job, index=index, count=count)
        self.on_change()

    def inputs(self, facts: dict[str, Any]) -> None:
        job = self.job
        job.onnx_sha256 = facts.get("onnx_sha256", job.onnx_sha256)
        job.calib_samples = facts.get("calib_samples", job.calib_samples)
        job.cache = facts.get("cache", job.cache)
        job.accuracy = facts.get("accuracy", job.accuracy)
        job.report = facts.get("quantization_report", job.report)

    def progress(self, progress: dict[str, Any]) -> None:
        self.job.progress = progress
        self.jobs.save(self.job, fence=self.attempt)

    def _refused(self, exc: SaigeError, wait_s: float) -> None:
        event("publish.retrying", self.job, "warning", error_code=exc.code, message=exc.message, retry_in_s=wait_s)

    def publish(self, bundle: Path) -> None:
        job = self.job
        with self.jobs.holding(self.attempt):  # no requeue or move of the job can land while it is published
            job.bundle = publish_patiently(lambda: self._place(bundle), self.patience_s, self.interrupted, self._refused)

    def _place(self, bundle: Path) -> dict[str, Any]:
        """One try: the store decides at the rename whether a cancel came first (the job ends cancelled, nothing of its
        bundle in the outbox) or comes too late (`saigeedged cancel` says so); a refused rename lets a cancel win again."""
        if self.interrupted() == "cancel":  # known already: no copy to the share at all
            raise SaigeError("CANCELLED", "cancelled before its bundle was published", reason="cancel")
        try:
            return self.jobs.outbox.publish_bundle(bundle, self.rel, self.job.job_id,
                                                   lambda: self.jobs.store.begin_publishing(self.attempt))
        except CancelWins:
            raise SaigeError("CANCELLED", "cancelled before its bundle was published", reason="cancel") from None
        except SaigeError:
            self.jobs.store.unpublishing(self.attempt)
            raise
