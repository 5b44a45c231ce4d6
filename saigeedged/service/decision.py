"""What becomes of an attempt that did not succeed (pure): retried, held for its engine, left running, or ended.

The worker takes a job, runs it, and settles it by this table; the engine monitor's move of a job to another engine
is an ENGINE_LOST settled here too (SPEC §8, §11, §15).
"""

from __future__ import annotations

from dataclasses import dataclass

from saigeedged.jobs import CANCELLED, FAILED

DETACH = "detach"  # a stop: the attempt's container step runs on, the row stays running, the next daemon re-attaches
HOLD = "hold"  # its engine does not answer and its step may run on: it stays running, re-attached when it answers
REQUEUE = "requeue"  # back to the queue (`spend`: as a new attempt)
END = "end"  # failed or cancelled for good


@dataclass(frozen=True)
class Decision:
    action: str
    reason: str = ""  # the requeue's reason (journal and status), or the final state for END
    spend: bool = True  # a requeue opens a new attempt number (False: the engine's fault, not the job's)
    recreate: bool = False  # the container died under the job: made afresh before the next attempt


def decide(code: str, reason: str | None, retryable: bool, exhausted: bool, attempt: int, max_attempts: int,
           started: bool, full: bool = False) -> Decision:
    """The settlement of an attempt that raised error `code` (`reason`: a cancel's, "stop" or "cancel"); `attempt`: the
    attempts it has spent of `max_attempts` (jobs.spent: stops are not counted); `started`:
    its record says a container step may be running; `full`: state_dir had no room for it (waited out: the attempt
    goes back to the queue unspent, or stays running where a step runs on)."""
    if full:
        return Decision(HOLD) if started else Decision(REQUEUE, "state_full", spend=False)
    if code == "CANCELLED" and reason == "stop":  # the operator's, not the job's fault
        if started:
            return Decision(DETACH)
        return Decision(REQUEUE, "stop")  # a new number (SPEC §8), never one of the job's retries (jobs.spent)
    if code == "DOCKER_UNAVAILABLE":
        return Decision(HOLD) if started else Decision(REQUEUE, "docker_unavailable", spend=False)
    if code == "CANCELLED":
        return Decision(END, CANCELLED)
    if retryable and attempt < max_attempts and not exhausted:
        return Decision(REQUEUE, code.lower(), recreate=code == "CONTAINER_LOST")
    return Decision(END, FAILED)
