"""One (local) Docker engine and the containers a process uses on it."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from saigeedged.adapters.docker.api import ENGINE_ERRORS, DockerAPI, NotFound, connect, unanswered
from saigeedged.adapters.docker.detached import Book, FileBook
from saigeedged.adapters.docker.execs import Container
from saigeedged.adapters.docker.spec import Spec
from saigeedged.adapters.hostlock import HostLock
from saigeedged.config import Config
from saigeedged.engines import DEFAULT, EngineSpec
from saigeedged.errors import SaigeError

PING_TIMEOUT_S = 5.0  # a health ping: an engine that takes longer is not fit to take work


class Engine:
    """An engine of the config: its client (made on first use), its health, its containers by target."""

    def __init__(self, spec: EngineSpec, config: Config,
                 on_event: Callable[[str, dict[str, Any]], None] | None = None) -> None:
        self.spec, self.name, self.config = spec, spec.name, config
        self.on_event = on_event or (lambda event, fields: None)
        self._api: DockerAPI | None = None
        self._probe: DockerAPI | None = None
        self._lock = threading.Lock()
        self._probe_lock = threading.Lock()  # not the jobs' lock: a connect hung for engine_timeout_s must not delay pings
        self._by_target: dict[str, Container] = {}
        self._stale = False  # a ping failed since the jobs' client was made: it is made anew before its next use
        self.why: str | None = None  # why the last ping was not answered (None: it was)

    def api(self) -> DockerAPI:
        """The client for jobs (limits.engine_timeout_s); DOCKER_UNAVAILABLE when the engine cannot be reached.

        A client whose engine stopped answering is made anew once the engine answers again (a dockerd restart), and
        the containers get the new one.
        """
        with self._lock:
            if self._api is not None and self._stale:
                self._api.close()
                self._api = None
            if self._api is None:
                self._api = connect(self.spec, self.config.limits.engine_timeout_s)
                self._stale = False
                for container in self._by_target.values():
                    container.docker = self._api
            return self._api

    def suspect(self) -> None:
        """A job's call found the engine unreachable: the jobs' client is made anew before its next use (the ping's
        own client may answer while this one's transport is dead)."""
        self._stale = True

    def up(self) -> bool:
        """Does the engine answer a ping within PING_TIMEOUT_S now? Never raises. A ping that fails drops the ping's
        client (the next one connects afresh) and marks the jobs' client for rebuilding."""
        try:
            with self._probe_lock:
                if self._probe is None:
                    self._probe = connect(self.spec, min(PING_TIMEOUT_S, self.config.limits.engine_timeout_s))
                probe = self._probe
        except SaigeError as exc:
            self._stale, self.why = True, exc.message
            return False
        self.why = unanswered(probe)
        if self.why is None:
            return True
        with self._probe_lock:
            if self._probe is probe:
                self._probe = None
        _close(probe)
        self._stale = True
        return False

    def busy_s(self) -> float:
        """How long the oldest call to this engine under way (a step's look, a kill, a reap) has lasted; 0 when none."""
        return max((c.busy_s() for c in list(self._by_target.values())), default=0.0)

    def has_image(self, target: str) -> bool:
        """Is the target's image loaded in this engine? (False when the engine does not answer.)"""
        try:
            self.api().images.get(Spec.for_target(self.config, target).image)
            return True
        except NotFound:
            return False
        except (SaigeError, *ENGINE_ERRORS):
            return False

    def container(self, target: str) -> Container:
        if target not in self._by_target:
            self._by_target[target] = Container(self.api(), Spec.for_target(self.config, target), self.on_event)
        return self._by_target[target]

    def close(self) -> None:
        for client in (self._api, self._probe):
            if client is not None:
                _close(client)


def _close(client: DockerAPI) -> None:
    try:
        client.close()
    except (SaigeError, *ENGINE_ERRORS, OSError):
        pass  # a dead transport may fail to close: it is dropped all the same


class Containers:
    """The containers one worker uses on one engine, made on first use; the container's host lock
    is held while a job uses it (one job at a time in it, across processes: `saigeedged compile` beside the daemon)."""

    def __init__(self, config: Config, on_event: Callable[[str, dict[str, Any]], None] | None = None,
                 on_wait: Callable[[], None] | None = None, engine: Engine | None = None) -> None:
        self.config = config
        self.on_event = on_event or (lambda event, fields: None)
        self.on_wait = on_wait
        self.engine = engine or Engine(DEFAULT, config, self.on_event)
        self.locks: dict[str, HostLock] = {}  # by container name
        self.lock: HostLock | None = None  # the one held for the active container
        self.active: Container | None = None
        self.interrupted: Callable[[], str | None] = lambda: None  # set by the worker: ends a wait for the lock
        self.book: Book = FileBook()  # set by the worker: where its steps' exec ids and log offsets are kept

    def api(self) -> DockerAPI:
        return self.engine.api()

    def container(self, target: str) -> Container:
        return self.engine.container(target)

    def get(self, target: str) -> Container:
        """The target's container, running, with the host lock held (released by release())."""
        if self.active is not None and self.active is self.engine.container(target):
            return self.active  # asked again within the job (its toolchain, then its steps): made ready once per job
        name = Spec.for_target(self.config, target).name
        self.lock = self.locks.setdefault(name, HostLock(self.config.state_dir, name))
        self.lock.acquire(self.on_wait, self.interrupted)
        self.active = self.container(target)
        self.active.book, self.active.interrupted = self.book, self.interrupted
        self.active.ensure()
        self.active.follow_image()
        return self.active

    def release(self, ended: Path | None = None) -> None:
        """The job is done with its container; `ended`: its attempt ended (not left running by a stop)."""
        if self.active is not None:
            self.active.end_job(ended)
        self.active = None
        if self.lock is not None:
            self.lock.release()


class Beside(Containers):
    """The finishing stage's containers: none of its own, no engine call but through them. A job handed over with the
    container its steps ran in (`hold`, from Container.beside) runs its last container call there (cubie's simulator),
    beside the next job of the worker that handed it over: without the host lock, which that worker held when the
    job's steps ran and holds for its next job now."""

    def hold(self, container: Container | None) -> None:
        self.active = container

    def get(self, target: str) -> Container:
        if self.active is None or self.active.spec != Spec.for_target(self.config, target):
            raise SaigeError("INTERNAL", f"the finishing stage has no {target} container: none was handed over "
                             "with the job")
        self.active.book, self.active.interrupted = self.book, self.interrupted
        return self.active
