"""The daemon's workers and the monitor of their engines: one worker per slot (engine, target) when several engines
are configured, with one engine one worker for its container targets (SPEC §2, §11, §15); host jobs a worker of
their own either way."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from saigeedged.adapters.docker import Beside, Containers, Engine
from saigeedged.adapters.slurm import leftout
from saigeedged.adapters.slurm.cluster import Slurm
from saigeedged.config import Config
from saigeedged.jobs import HOST_ENGINE, TERMINAL, Attempt, Job
from saigeedged.service import clusterslots
from saigeedged.service.finishing import REPORTS_AT_ONCE, Finisher, Handed
from saigeedged.service.lifecycle import Jobs, Places
from saigeedged.service.missingimages import MissingImages
from saigeedged.service.monitor import EngineMonitor
from saigeedged.service.slot import Slot, work_dir
from saigeedged.service.statusline import SlotView, status_line
from saigeedged.service.worker import Worker

OnEvent = Callable[[str, dict[str, Any]], None]


class Pool:
    """Every worker of the daemon, started, woken, interrupted and stopped together, and the one monitor of their
    engines (one engine is a pool of one: SPEC §15)."""

    def __init__(self, config: Config, jobs: Jobs, places: Places, on_event: OnEvent,
                 on_wait: Callable[[], None], on_change: Callable[[], None],
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.config, self.jobs, self.places = config, jobs, places
        self.on_event, self.on_wait, self.on_change = on_event, on_wait, on_change
        self.specs = [] if config.executor.slurm else list(config.engines)  # at least the local engine
        self.engines = [Engine(spec, config, on_event) for spec in self.specs]
        self.slurm = Slurm(config.executor, left_out=leftout.LeftOut(kept=leftout.path(config.state_dir))) \
            if config.executor.slurm else None
        self.wake = threading.Event()
        self.workers: list[Worker] = []
        missing = MissingImages(config.state_dir, self._asked)
        self.monitor = EngineMonitor(self.engines, jobs.store, self._lose, self._changed, clock,
                                     config.limits.engine_timeout_s, missing)
        if self.slurm is not None:  # container jobs on a Slurm partition's nodes (docs/spec-executor-slurm.md)
            for containers, slot in clusterslots.slots(config, self.slurm, lambda: self.workers):
                self.workers.append(Worker(config, jobs, containers, places, on_change, slot, self.wake))
                clusterslots.bind(self.workers[-1])
        elif len(self.engines) > 1:  # a slot per (engine, target), host jobs their own (SPEC §11)
            for engine in self.engines:
                for target in engine.spec.targets:
                    self._add(engine, Slot(engine.name, (target,), True, self._ready(engine.name),
                                           self._lost(engine.name)))
            self._add(self.engines[0], Slot(HOST_ENGINE, ("host",), True))
        else:  # the one engine: one container job at a time, whatever its target (SPEC §2)
            (engine,) = self.engines
            self._add(engine, Slot(engine.name, engine.spec.targets, False, self._ready(engine.name),
                                   self._lost(engine.name)))
            # host jobs keep their own slot (SPEC §11) with one engine too: they need no container, and a host job
            # queued behind a container compile waited for it (hours with a real toolkit) with its slot idle
            self._add(engine, Slot(HOST_ENGINE, ("host",), True))
        # the finishing stage: the container jobs' reports, off the container's path (issue 25)
        self.handed = Handed()
        self.finishers = [Finisher(config, jobs, Beside(config, on_event, on_wait,  # none but those handed over
                                                        engine=self.engines[0] if self.engines else None),
                                   places, self.handed, i == 0, on_change) for i in range(REPORTS_AT_ONCE)]
        for worker in self.workers:
            worker.finisher = self.handed
        for finisher in self.finishers:
            finisher.rehome = self._rehome
        self.workers.extend(self.finishers)

    def _add(self, engine: Engine, slot: Slot) -> None:
        containers = Containers(self.config, self.on_event, self.on_wait, engine=engine)
        self.workers.append(Worker(self.config, self.jobs, containers, self.places, self.on_change, slot, self.wake))

    def _asked(self) -> set[str]:
        """The targets asked for now: the config's default and those of the queued and running jobs."""
        return {self.config.defaults.target, *self.jobs.store.waiting_by_target()}

    def _ready(self, name: str) -> Callable[[str], bool]:
        return lambda target: self.monitor.ready(name, target)

    def _lost(self, name: str) -> Callable[[str], None]:
        return lambda reason: self.monitor.lost(name, reason)

    def _changed(self) -> None:
        """An engine came up or went down: the workers look at the queue again, STATUS= follows."""
        self.wake.set()
        self.on_change()

    def _lose(self, name: str, reason: str) -> None:
        """The engine is down: move the jobs its workers wait on whose target another ready engine serves
        (ENGINE_LOST); the steps of exactly those attempts are killed when it answers again."""
        lost = [attempt for w in self.workers if w.slot.engine == name
                for attempt in w.lose(reason, lambda target: self.monitor.elsewhere(name, target))]
        if lost:
            self.monitor.abandoned(lost)
            self.wake.set()

    def work_dir(self, job: Job) -> Path:
        return work_dir(self.config.work_root, job)

    def resume(self, jobs: list[Job]) -> list[Job]:
        """Hand running container jobs to the workers of their slots to re-attach; returns those no slot serves."""
        left = []
        for job in jobs:
            serving = [w for w in self.workers if job.target in w.slot.targets
                       and w.slot.engine_of(job.target) == (job.engine or w.slot.engine)]
            worker = min(serving, key=lambda w: len(w.resumable), default=None)  # each its own: they run at once
            if worker is None:
                left.append(job)
            else:
                worker.adopt(job)
        return left

    def _rehome(self, job: Job) -> None:
        """A job the finishing stage cannot go on with now (held): a worker of its slot re-attaches it."""
        for unserved in self.resume([job]):  # it came from such a worker: one serves it, unless a bug says otherwise
            self.jobs.abandon(unserved, RuntimeError(f"no slot serves {unserved.target} jobs to re-attach it"),
                              Attempt.of(unserved))
        self.wake.set()

    def abandon(self, attempts: list[Attempt]) -> None:
        """Kill the steps of these attempts (given up on): on a Slurm partition at once, each job's cluster jobs
        cancelled (the agent's TERM kills the step on its node); else by the engine monitor when their engine answers,
        before its slots take work (their records say so)."""
        if self.slurm is None:
            self.monitor.abandoned(attempts)
            return
        clusterslots.cancel_behind(self.slurm, attempts)

    def ended_by_command(self, jobs: list[Job]) -> None:
        """Jobs a command ended while queued (`saigeedged cancel`): on a Slurm partition, a cluster job Slurm requeued
        off a lost node for the job's next attempt is cancelled; it would run (holding its node's GRES) until --time."""
        ran = [Attempt.of(job) for job in jobs if job.state in TERMINAL and job.attempts]
        if self.slurm is not None and ran:
            clusterslots.cancel_behind(self.slurm, ran)

    def reaping(self) -> set[str]:
        """The jobs whose abandoned attempts' steps are still to be killed (their work dirs stay until then)."""
        return {r.job_id for r in self.jobs.store.reaps()}

    def cancel(self, job_id: str) -> None:
        """`saigeedged cancel` of a running job, whatever its engine's state (Worker.cancel)."""
        ended = [attempt for w in self.workers for attempt in w.cancel(job_id)]
        if ended:
            self.abandon(ended)

    def running(self) -> list[Worker]:
        return [w for w in self.workers if w.current is not None]

    def start(self) -> None:
        self.monitor.start()
        for worker in self.workers:
            worker.start()

    def interrupt(self, reason: str) -> None:
        for worker in self.workers:
            worker.interrupt(reason)

    def stop(self) -> None:
        self.monitor.stop()
        for worker in self.workers:
            worker.stop()

    def join(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        for worker in self.workers:
            worker.join(max(0.0, deadline - time.monotonic()))
        self.monitor.join(max(0.0, deadline - time.monotonic()))

    def is_alive(self) -> bool:
        """Every worker is alive (a dead one would leave its slot's jobs queued forever)."""
        return all(w.is_alive() for w in self.workers)

    def stopped(self) -> bool:
        """No worker and no engine's watch runs any more (after stop and join): the store may be closed. A stop right
        after start met the monitor's first look at its engine reading the store, and closing it under that read
        crashed the process (SIGSEGV in sqlite3)."""
        return not any(w.is_alive() for w in self.workers) and not self.monitor.alive()

    def status(self, queued: int) -> str:
        """The STATUS= line: busy slots by engine (SPEC §11); with one engine the line of §9."""
        return status_line(self.slot_views(), queued, self.monitor.unreachable())

    def slot_views(self) -> list[SlotView]:
        views = []
        for worker in self.workers:
            job = worker.shown()
            if not worker.slot.targets:  # the finishing stage: shown while it holds a job, on that job's engine
                if job is not None:  # a host job has no engine (its slot's is HOST_ENGINE; executor slurm has none)
                    engine = job.engine or (self.engines[0].name if self.engines and job.target != "host" else HOST_ENGINE)
                    views.append(SlotView(engine, job.target, job))
                continue
            targets = (job.target,) if job is not None and not worker.slot.pooled else worker.slot.targets[:1]
            views.append(SlotView(worker.slot.engine_of(targets[0]), targets[0], job))
        return views

    def close(self) -> None:
        for engine in self.engines:
            engine.close()
