"""The workers of executor slurm: `max_jobs` workers whose container jobs run on the partition's nodes, taking a job
only while a node with the target's GRES and image feature is free (a node that joins adds room at once), and one
for host jobs on this host (docs/spec-executor-slurm.md)."""

from __future__ import annotations

import threading
from collections.abc import Callable

import structlog

from saigeedged.adapters.slurm.cluster import Slurm, images
from saigeedged.adapters.slurm.node import SlurmContainers
from saigeedged.config import Config
from saigeedged.engines import CONTAINER_TARGETS
from saigeedged.errors import SaigeError
from saigeedged.executor import ENGINE, capacity
from saigeedged.jobs import HOST_ENGINE, Attempt
from saigeedged.service.slot import Slot
from saigeedged.service.worker import Worker

log = structlog.get_logger()


class Room:
    """Is there a free node for one more job of a target? From sinfo (shared for poll_interval_s) and our workers."""

    def __init__(self, config: Config, slurm: Slurm, workers: Callable[[], list[Worker]]) -> None:
        self.config, self.slurm, self.workers = config, slurm, workers

    def __call__(self, target: str) -> bool:
        try:
            nodes = self.slurm.usable(target)  # a node left out (unfit.py: it could not serve) is no room
        except SaigeError:
            return False  # the controller does not answer: nothing new is submitted meanwhile
        busy = sum(1 for w in self.workers() if w.slot.engine == ENGINE and w.current is not None
                   and w.current.target == target)
        return busy < capacity(nodes, target, images(self.config)[target])

    def answers(self, target: str) -> bool:
        """Does Slurm answer (a running job re-attaches then, its node drained or every node busy: it holds one)?"""
        try:
            self.slurm.nodes()
        except SaigeError:
            return False
        return True


def slots(config: Config, slurm: Slurm, workers: Callable[[], list[Worker]]) -> list[tuple[SlurmContainers, Slot]]:
    """The (containers, slot) of each cluster worker, then the host jobs' slot (its containers are never used)."""
    room = Room(config, slurm, workers)
    made = [(SlurmContainers(config, slurm), Slot(ENGINE, CONTAINER_TARGETS, True, room, reattach=room.answers))
            for _ in range(config.executor.max_jobs)]
    return [*made, (SlurmContainers(config, slurm), Slot(HOST_ENGINE, ("host",), True))]


def bind(worker: Worker) -> None:
    """A cluster worker's node containers follow its running job and work dir."""
    containers = worker.containers
    if isinstance(containers, SlurmContainers):
        containers.current = lambda: (worker.current, worker.work)


def cancel_behind(slurm: Slurm, attempts: list[Attempt]) -> threading.Thread:
    """Cancel the live cluster jobs of these attempts (given up on: the agent's TERM kills each step) on a thread of
    their own: a squeue and a scancel may each take CALL_TIMEOUT_S on a controller that does not answer, and the
    callers are the main loop (a cancel) and the start-up before READY=1, whose watchdog must not wait on Slurm. Only
    cluster jobs serving those attempts or earlier ones go: the next attempt's may be submitted before squeue answers."""
    def cancel() -> None:
        for attempt in attempts:
            try:
                slurm.cancel_live(attempt.job_id, upto=attempt.attempt)
            except SaigeError as exc:  # the controller does not answer: Slurm's --time still ends the cluster job
                log.warning("slurm.cancel_failed", job_id=attempt.job_id, error_code=exc.code, message=exc.message)

    thread = threading.Thread(target=cancel, name="saigeedged-scancel", daemon=True)
    thread.start()
    return thread
