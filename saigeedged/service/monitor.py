"""The engine monitor: the one owner of every engine's health, whether the config lists one engine or many
(SPEC §11, §15). Each engine is pinged on its own thread; a slot takes work only while its engine answers and has
the target's image.

An engine none of whose pings has succeeded for limits.engine_timeout_s is marked down (`engine.down`): one slow
answer is not an outage. Its jobs whose target another ready engine serves are moved (ENGINE_LOST, an attempt spent);
the others wait for it (DOCKER_UNAVAILABLE, no attempt spent). When it answers again, the steps of exactly the
attempts moved off it are killed first; then it is up (`engine.up`) and its waiting jobs re-attach.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import structlog

from saigeedged.adapters.docker import Engine, Spec
from saigeedged.adapters.store import Store
from saigeedged.errors import SaigeError
from saigeedged.jobs import Attempt
from saigeedged.records import AttemptRecord, UnreadableRecord
from saigeedged.service.missingimages import MissingImages
from saigeedged.service.slot import remove_work

log = structlog.get_logger()
PING_S = 1.0  # between pings of an engine that answers
DOWN_PING_S = 2.0  # between pings of an engine that does not
IMAGE_RECHECK_S = 30.0  # an engine without a target's image is asked again this often (an image loaded meanwhile)
# a call to an engine waits at most engine_timeout_s at a time, and one engine call of the daemon is a few waits
# (create, start, read, inspect): one under way STUCK_FACTOR times that long is not waiting on the engine any more
STUCK_FACTOR = 5
HINT = "is its dockerd running and reachable? `saigeedged check` says why; its container jobs wait (no attempt " \
       "spent) unless another engine serves their target"


@dataclass
class Health:
    """What the monitor knows of one engine."""

    up: bool = False
    reason: str | None = "not probed yet"
    images: dict[str, bool] = field(default_factory=dict)
    since_images: float = 0.0
    seen: bool = False  # probed at least once
    last_ok: float | None = None  # when a ping last succeeded
    down_since: float | None = None  # when it was marked down
    failing: bool = False  # the last call failed: no new work goes there, but it is not down before engine_timeout_s
    slow: bool = False  # a call to it has been under way longer than engine_timeout_s (it answers pings, not calls)


class EngineMonitor:
    """One thread per engine; `ready(engine, target)` tells a slot whether it may take a job now."""

    def __init__(self, engines: Sequence[Engine], store: Store, lose: Callable[[str, str], None],
                 on_change: Callable[[], None], clock: Callable[[], float], timeout_s: float,
                 missing: MissingImages | None = None) -> None:
        self.timeout_s = timeout_s  # limits.engine_timeout_s: no call answered that long = down
        self.missing = missing  # which missing images are worth a warning (None: every one, at every look)
        self.engines = {e.name: e for e in engines}
        self.store, self.lose, self.on_change, self.clock = store, lose, on_change, clock
        self.health = {e.name: Health() for e in engines}
        self.stop_event = threading.Event()
        self.kick = {e.name: threading.Event() for e in engines}  # a job found the engine gone: ping it now
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []

    def ready(self, name: str, target: str) -> bool:
        """May a slot of `target` on engine `name` take a job? Only while it answers; without the target's image only
        when every other engine serving the target is known to lack it too (the job then fails IMAGE_NOT_FOUND,
        naming the image, instead of waiting for ever)."""
        health = self.health[name]
        if not health.up or health.failing:
            return False
        # an engine not probed yet (or down since start) may have it: wait for it rather than fail a job for good
        return health.images.get(target, False) or all(
            self.health[other].images.get(target) is False for other, e in self.engines.items()
            if other != name and target in e.spec.targets)

    def elsewhere(self, name: str, target: str) -> bool:
        """Does another engine that is ready now serve `target`? (Else a job of that engine waits for it.)"""
        return any(self.ready(other, target) for other in self.engines
                   if other != name and target in self.engines[other].spec.targets)

    def stuck(self) -> list[str]:
        """The engines a call to which has been under way far past every bound (STUCK_FACTOR x engine_timeout_s): the
        thread making it is stuck, not waiting; the daemon is then unhealthy (no watchdog ping: systemd restarts it)."""
        return [name for name, e in self.engines.items() if e.busy_s() > STUCK_FACTOR * self.timeout_s]

    def unreachable(self) -> list[str]:
        """The engines down or failing now (no new work goes there): what STATUS= names."""
        return [name for name, h in self.health.items() if h.seen and (not h.up or h.failing)]

    def start(self) -> None:
        for name in self.engines:
            self._record(name)
            thread = threading.Thread(target=self._loop, args=(name,), name=f"saigeedged-engine-{name}", daemon=True)
            thread.start()
            self._threads.append(thread)

    def stop(self) -> None:
        self.stop_event.set()
        for kick in self.kick.values():
            kick.set()

    def join(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))

    def alive(self) -> bool:
        """Does an engine's watch still run (it reads and writes the store: the store closes only after it)?"""
        return any(t.is_alive() for t in self._threads)

    def abandoned(self, attempts: list[Attempt]) -> None:
        """Attempts given up on (moved elsewhere, or ended under daemons that kept dying): their records say so, and
        their steps are killed on the engine each record names when it answers, before its slots take work, and
        nothing else is (SPEC §15)."""
        for attempt in attempts:
            try:
                record = self.store.update_record(attempt.job_id, attempt.take, reap=True)
            except UnreadableRecord as exc:
                log.warning("engine.reap_unrecorded", job_id=attempt.job_id, message=str(exc))
                continue
            if record.engine in self.kick:
                self.kick[record.engine].set()

    def pending(self) -> list[Path]:
        """The work dirs whose steps are still to be killed, on every engine (from the store: they outlive us)."""
        return [Path(r.work) for r in self.store.reaps()]

    def lost(self, name: str, reason: str) -> None:
        """A job found the engine unreachable: no new work goes there, and it is pinged now (down only once no call
        has succeeded for limits.engine_timeout_s)."""
        self.health[name].failing = True
        self.engines[name].suspect()
        self.kick[name].set()

    def _loop(self, name: str) -> None:
        while not self.stop_event.is_set():
            try:
                self.tick(name)
            except Exception as exc:  # a guard: whatever an engine does, its watch goes on
                log.warning("engine.watch_failed", engine=name, message=f"{type(exc).__name__}: {exc}")
            self.kick[name].wait(PING_S if self.health[name].up else DOWN_PING_S)
            self.kick[name].clear()

    def tick(self, name: str) -> None:
        """One look at the engine: bring it up, keep it up, or mark it down and requeue what waits on it."""
        engine, health = self.engines[name], self.health[name]
        if not engine.up():
            health.failing = True
            recent = health.last_ok is not None and self.clock() - health.last_ok < self.timeout_s
            if health.up and recent:
                return  # not down yet: hysteresis
            why = f"does not answer ({engine.why})" if engine.why else "does not answer"
            self._mark_down(name, why)
            self.lose(name, f"{engine.spec.url or 'the local engine'} {why}")
            return
        health.last_ok, health.failing = self.clock(), self._slow(name)
        if health.failing:
            return  # the reap or the images would be one more call that does not end
        reap = self.store.reaps(name)
        if not health.up or reap:
            self._bring_up(name, reap)
        elif not all(health.images.values()) and self.clock() >= health.since_images + IMAGE_RECHECK_S:
            self._images(name)

    def _slow(self, name: str) -> bool:
        """Is a call to the engine under way for longer than engine_timeout_s? (It answers pings but not calls: a
        hung exec stream, a dockerd half stuck.) Then it takes no new work, and STATUS= names it."""
        health, busy = self.health[name], self.engines[name].busy_s()
        slow = busy > self.timeout_s
        if slow and not health.slow:
            log.warning("engine.slow", engine=name, error_code="DOCKER_UNAVAILABLE", hint=HINT,
                        message=f"a call to engine {name} has not returned for {busy:.1f}s: no new work goes there")
            self.engines[name].suspect()
            self.on_change()
        health.slow = slow
        health.seen = health.seen or slow
        return slow

    def _images(self, name: str) -> None:
        engine, health = self.engines[name], self.health[name]
        health.images = {target: engine.has_image(target) for target in engine.spec.targets}
        health.since_images = self.clock()
        images = {t: Spec.for_target(engine.config, t).image for t in health.images}
        missing = [(t, images[t]) for t, ok in health.images.items() if not ok]
        if self.missing is not None:
            self.missing.forget(name, [(t, images[t]) for t, ok in health.images.items() if ok])
            missing = self.missing.to_warn(name, missing)
        if missing:
            log.warning("engine.image_missing", engine=name, targets=",".join(t for t, _ in missing),
                        images=",".join(i for _, i in missing),
                        message=f"engine {name} lacks {', '.join(f'the {t} image {i}' for t, i in missing)}: "
                        "`docker load` it (`saigeedged check` says how); meanwhile its jobs go to an engine that has "
                        "it, or fail IMAGE_NOT_FOUND when none has")

    def _bring_up(self, name: str, reap: list[AttemptRecord]) -> None:
        """Kill the steps left running there for attempts given up on (their records say so), then take work."""
        engine, health = self.engines[name], self.health[name]
        for target in dict.fromkeys(r.target for r in reap):
            mine = [r for r in reap if r.target == target and r.work]  # a record without a work dir has nothing to kill
            try:  # a pidfile's pids are those of its own container: another container (the local engine bind-mounts
                # every work dir into each) would kill strangers and remove the pidfile the right one needs
                engine.container(target).reap([Path(r.work) for r in mine])
            except SaigeError as exc:
                if exc.code in ("DOCKER_UNAVAILABLE", "CONTAINER_FAILED"):
                    raise  # the records stay: tried again when it answers, or at the next look if it refused (a 5xx)
                log.warning("container.reap_failed", engine=name, error_code=exc.code, message=exc.message)
        for record in reap:
            if record.work:
                remove_work(Path(record.work))  # the daemon's side of it (a remote engine's copy went with the reap)
            self.store.reaped(record)
        self._images(name)
        with self._lock:
            first, since, was_up = not health.seen, health.down_since, health.up
            health.up, health.reason, health.seen, health.down_since = True, None, True, None
        self._record(name)
        if since is not None:  # it was down: engine.up; an engine found up at start is only ready
            log.info("engine.up", engine=name, down_s=round(self.clock() - since, 1),
                     message=f"engine {name} answers again" + ("; its leftover steps were killed" if reap else ""))
        elif first:
            ready = [t for t, ok in health.images.items() if ok]
            log.info("engine.ready", engine=name, targets=",".join(ready),
                     message=f"engine {name} answers; " + (f"the images of {', '.join(ready)} are loaded" if ready else
                                                          "no vendor image is loaded (host jobs need none; `saigeedged "
                                                          "check` says what a container target lacks)"))
        if not was_up:
            self.on_change()

    def _mark_down(self, name: str, reason: str) -> None:
        health = self.health[name]
        with self._lock:
            changed = health.down_since is None
            health.up, health.reason, health.seen = False, reason, True
            health.down_since = health.down_since if health.down_since is not None else self.clock()
        if changed:
            self._record(name)
            log.warning("engine.down", engine=name, error_code="DOCKER_UNAVAILABLE", hint=HINT,
                        message=f"engine {name} ({self.engines[name].spec.url or 'the local engine'}) {reason}")
            self.on_change()

    def _record(self, name: str) -> None:
        health = self.health[name]
        try:
            self.store.set_engine(name, health.up, health.reason, list(self.engines[name].spec.targets))
        except Exception as exc:  # the table is for the status command: a write it misses is not worth a crash
            log.warning("engine.record_failed", engine=name, message=f"{type(exc).__name__}: {exc}")
