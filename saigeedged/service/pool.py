"""The daemon's workers: one per slot (engine, target) plus one for host jobs when several engines are
configured; with one engine, one worker for every target as before the pool (SPEC §9, §11)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import structlog

from saigeedged.adapters.docker import Containers, Engine
from saigeedged.config import Config
from saigeedged.engines import EngineSpec
from saigeedged.errors import SaigeError
from saigeedged.jobs import HOST_ENGINE, Job
from saigeedged.service.enginewatch import EngineWatch
from saigeedged.service.lifecycle import Jobs, Places
from saigeedged.service.outage import Outage
from saigeedged.service.slot import Slot
from saigeedged.service.statusline import SlotView, status_line
from saigeedged.service.worker import Worker

OnEvent = Callable[[str, dict[str, Any]], None]
log = structlog.get_logger()


class Pool:
    """Every worker of the daemon, started, woken, interrupted and stopped together."""

    def __init__(self, config: Config, jobs: Jobs, places: Places, on_event: OnEvent,
                 on_wait: Callable[[], None], on_change: Callable[[], None],
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.config, self.jobs, self.places = config, jobs, places
        self.on_event, self.on_wait, self.on_change = on_event, on_wait, on_change
        self.specs = list(config.engines)  # at least the local engine
        self.pooled = len(self.specs) > 1
        self.engines = [Engine(spec, config, on_event) for spec in self.specs]
        self.wake = threading.Event()
        self.workers: list[Worker] = []
        self.watch: EngineWatch | None = None
        if self.pooled:
            self.watch = EngineWatch(self.engines, jobs.store, self._lose, on_change, clock, config.limits.engine_timeout_s)
            for engine in self.engines:
                for target in engine.spec.targets:
                    self._add(engine, Slot(engine.name, (target,), True, self._ready(engine.name), self._lost(engine.name)))
            self._add(self.engines[0], Slot(HOST_ENGINE, ("host",), True))
        else:
            (engine,) = self.engines
            self._add(engine, Slot(engine.name, (*engine.spec.targets, "host"), False,
                                   on_lost=lambda reason: self._record(engine.spec, False, reason),
                                   on_back=lambda: self._record(engine.spec, True, None)))
        self._idle = Outage()  # what `outage` says in a pool: the one-engine rule's outage never begins there

    def _add(self, engine: Engine, slot: Slot) -> None:
        containers = Containers(self.config, self.on_event, self.on_wait, engine=engine)
        self.workers.append(Worker(self.config, self.jobs, containers, self.places, self.on_change, slot, self.wake))

    def _ready(self, name: str) -> Callable[[str], bool]:
        watch = self.watch
        assert watch is not None
        return lambda target: watch.ready(name, target)

    def _lost(self, name: str) -> Callable[[str], None]:
        watch = self.watch
        assert watch is not None
        return lambda reason: watch.lost(name, reason)

    def _lose(self, name: str, reason: str) -> None:
        """The engine is down: requeue the jobs its workers wait on (ENGINE_LOST), so they run elsewhere; the steps
        of exactly those attempts are killed when it answers again."""
        watch = self.watch
        assert watch is not None
        lost = [work for w in self.workers if w.slot.engine == name
                for work in w.lose(reason, lambda target: watch.elsewhere(name, target))]
        if lost:
            watch.abandoned(name, lost)
            self.wake.set()

    def work_dir(self, job: Job) -> Path:
        """Where the job's current attempt works (the slots of one daemon all use the same rule)."""
        return self.workers[0].slot.work_dir(self.config.work_root, job)

    def resume(self, jobs: list[Job]) -> list[Job]:
        """Hand running container jobs to the workers of their slots to re-attach; returns those no slot serves."""
        left = []
        for job in jobs:
            worker = next((w for w in self.workers if job.target in w.slot.targets
                           and w.slot.engine_of(job.target) == (job.engine or w.slot.engine)), None)
            if worker is None:
                left.append(job)
            else:
                worker.resumable.append(job)
        return left

    def reap(self, job: Job) -> None:
        """Kill the step of the job's current attempt, wherever it runs (never raises)."""
        engine = next((e for e in self.engines if e.name == job.engine), self.engines[0])
        try:
            engine.container(job.target).reap([self.work_dir(job)])
        except SaigeError as exc:
            log.warning("container.reap_failed", job_id=job.job_id, error_code=exc.code, message=exc.message)

    def _record(self, spec: EngineSpec, up: bool, reason: str | None) -> None:
        self.jobs.store.set_engine(spec.name, up, reason, list(spec.targets))

    # -- the interface the daemon had with its one worker ----------------------------------------------
    @property
    def containers(self) -> Containers:
        """The first worker's containers (with one engine: the engine's), for start-up recovery."""
        return self.workers[0].containers

    @property
    def outage(self) -> Outage:
        return self._idle if self.pooled else self.workers[0].outage

    @property
    def current(self) -> Job | None:
        return next((w.current for w in self.workers if w.current is not None), None)

    def running(self) -> list[Worker]:
        return [w for w in self.workers if w.current is not None]

    def start(self) -> None:
        if self.watch is not None:
            self.watch.start()
        else:
            self._record(self.specs[0], True, None)
        for worker in self.workers:
            worker.start()

    def interrupt(self, reason: str) -> None:
        for worker in self.workers:
            worker.interrupt(reason)

    def stop(self) -> None:
        if self.watch is not None:
            self.watch.stop()
        for worker in self.workers:
            worker.stop()

    def join(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        for worker in self.workers:
            worker.join(max(0.0, deadline - time.monotonic()))

    def is_alive(self) -> bool:
        """Every worker is alive (a dead one would leave its slot's jobs queued forever)."""
        return all(w.is_alive() for w in self.workers)

    def stopped(self) -> bool:
        """No worker runs any more (after stop and join)."""
        return not any(w.is_alive() for w in self.workers)

    def status(self, queued: int) -> str:
        """The STATUS= line: busy slots by engine (SPEC §11); with one engine the line of §9."""
        down = self.watch.down() if self.watch is not None else [self.specs[0].name] if self.outage.active else []
        return status_line(self.slot_views(), queued, down)

    def slot_views(self) -> list[SlotView]:
        views = []
        for worker in self.workers:
            job = worker.current
            targets = (job.target,) if job is not None and not worker.slot.pooled else worker.slot.targets[:1]
            views.append(SlotView(worker.slot.engine_of(targets[0]), targets[0], job))
        return views

    def close(self) -> None:
        for engine in self.engines:
            engine.close()
