"""The engines of a pool, watched: each is pinged on its own thread; a slot takes work only while its engine
answers and has the target's image (SPEC §11, §15).

An engine none of whose pings has succeeded for limits.engine_timeout_s is marked down (`engine.down`); its jobs
whose target another ready engine serves are requeued with ENGINE_LOST, so they run elsewhere, and the others wait
for it. When it answers again, the steps of exactly the attempts requeued off it are killed first; then it is up
(`engine.up`) and its waiting jobs re-attach.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import structlog

from saigeedged.adapters.docker import Engine
from saigeedged.adapters.store import Store
from saigeedged.errors import SaigeError

log = structlog.get_logger()
PING_S = 1.0  # between pings of an engine that answers
DOWN_PING_S = 2.0  # between pings of an engine that does not
IMAGE_RECHECK_S = 30.0  # an engine without a target's image is asked again this often (an image loaded meanwhile)


@dataclass
class Health:
    """What the pool knows of one engine."""

    up: bool = False
    reason: str | None = "not probed yet"
    images: dict[str, bool] = field(default_factory=dict)
    reap: list[Path] = field(default_factory=list)  # work dirs of attempts requeued off it: their steps are killed
    # before its slots take work
    since_images: float = 0.0
    seen: bool = False  # probed at least once
    last_ok: float | None = None  # when a ping last succeeded
    failing: bool = False  # the last ping failed: no new work goes there, but it is not down before engine_timeout_s


class EngineWatch:
    """One thread per engine; `ready(engine, target)` tells a slot whether it may take a job now."""

    def __init__(self, engines: Sequence[Engine], store: Store, lose: Callable[[str, str], None],
                 on_change: Callable[[], None], clock: Callable[[], float], timeout_s: float) -> None:
        self.timeout_s = timeout_s  # limits.engine_timeout_s: no call answered that long = down
        self.engines = {e.name: e for e in engines}
        self.store, self.lose, self.on_change, self.clock = store, lose, on_change, clock
        self.health = {e.name: Health() for e in engines}
        self.stop_event = threading.Event()
        self.kick = {e.name: threading.Event() for e in engines}  # a job found the engine gone: ping it now
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []

    def ready(self, name: str, target: str) -> bool:
        health = self.health[name]
        return health.up and not health.failing and health.images.get(target, False)

    def elsewhere(self, name: str, target: str) -> bool:
        """Does another engine that is ready now serve `target`? (Else a job of that engine waits for it.)"""
        return any(self.ready(other, target) for other in self.engines if other != name)

    def down(self) -> list[str]:
        return [name for name, h in self.health.items() if h.seen and not h.up]

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

    def abandoned(self, name: str, work_dirs: list[Path]) -> None:
        """Attempts requeued off the engine: their steps are killed when it answers again, nothing else (SPEC §15)."""
        with self._lock:
            self.health[name].reap.extend(work_dirs)

    def lost(self, name: str, reason: str) -> None:
        """A job found the engine unreachable: no new work goes there, and it is pinged now (down only once no call
        has succeeded for limits.engine_timeout_s: one slow answer is not an outage)."""
        self.health[name].failing = True
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
            if health.up and health.last_ok is not None and self.clock() - health.last_ok < self.timeout_s:
                return  # not down yet: hysteresis
            self._mark_down(name, "does not answer")
            self.lose(name, f"{engine.spec.url or 'the local engine'} does not answer")
            return
        health.last_ok, health.failing = self.clock(), False
        if not health.up:
            self._bring_up(name)
        elif not all(health.images.values()) and self.clock() >= health.since_images + IMAGE_RECHECK_S:
            self._images(name)

    def _images(self, name: str) -> None:
        engine, health = self.engines[name], self.health[name]
        health.images = {target: engine.has_image(target) for target in engine.spec.targets}
        health.since_images = self.clock()
        missing = [t for t, ok in health.images.items() if not ok]
        if missing:
            log.warning("engine.image_missing", engine=name, targets=",".join(missing),
                        message=f"engine {name} lacks the image of {', '.join(missing)}: its slot takes no job "
                        "(`saigeedged check` says which image)")

    def _bring_up(self, name: str) -> None:
        """Kill the steps left running there (they belong to attempts already requeued), then take work."""
        engine, health = self.engines[name], self.health[name]
        if health.reap:
            for target in engine.spec.targets:
                try:
                    engine.container(target).reap(health.reap)
                except SaigeError as exc:
                    if exc.code == "DOCKER_UNAVAILABLE":
                        raise
                    log.warning("container.reap_failed", engine=name, error_code=exc.code, message=exc.message)
        self._images(name)
        with self._lock:
            was_seen = health.seen
            health.up, health.reason, health.reap, health.seen = True, None, [], True
        self._record(name)
        if was_seen:  # it was down: engine.up; an engine found up at start is only ready
            log.info("engine.up", engine=name, message=f"engine {name} answers again; its leftover steps are killed")
        else:
            log.info("engine.ready", engine=name, targets=",".join(t for t, ok in health.images.items() if ok))
        self.on_change()

    def _mark_down(self, name: str, reason: str) -> None:
        health = self.health[name]
        with self._lock:
            changed = health.up or not health.seen
            health.up, health.reason, health.seen = False, reason, True
        if changed:
            self._record(name)
            log.warning("engine.down", engine=name, error_code="ENGINE_LOST", message=f"engine {name} {reason}")
            self.on_change()

    def _record(self, name: str) -> None:
        health = self.health[name]
        try:
            self.store.set_engine(name, health.up, health.reason, list(self.engines[name].spec.targets))
        except Exception as exc:  # the table is for the status command: a write it misses is not worth a crash
            log.warning("engine.record_failed", engine=name, message=f"{type(exc).__name__}: {exc}")
