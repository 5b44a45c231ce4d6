"""The only module that talks to Docker: the long-lived compiler containers and the steps exec'd in them."""

from __future__ import annotations

import contextlib
import fcntl
import os
import shlex
import socket
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import docker
import requests
from docker.errors import APIError, DockerException, ImageNotFound, NotFound
from docker.types import Mount

from saigeedged.config import Config
from saigeedged.errors import SaigeError

MANAGED_LABEL = "io.saigeedge.managed"
OWNER_LABEL = "io.saigeedge.owner"  # host:state_dir of the daemon that made it: another daemon never touches it
KILL_AFTER = "30s"
LOST_GRACE_S = 2  # how long a step killed by a signal waits to see whether its whole container is going down
PIDFILE = ".step.pid"
STOPFILE = ".step.stop"  # beside the pidfile: a stop or cancel for this job's steps, holding its reason
# by path: a busybox sh would run its own applet for a bare `timeout` (coreutils lives here on Ubuntu)
TIMEOUT_BIN = "/usr/bin/timeout"
# writes the step's pid (GNU timeout, the head of its process group), then runs it unless a stop came first:
# interrupt() writes the stop file before it reads the pidfile, so either this sees the stop or the kill sees the pid
_WRAP = 'echo $$ > "$0"; [ -e "${0%.pid}.stop" ] && exit 143; exec "$@"'
_KILL = 'p=$(cat "$0" 2>/dev/null) && [ -n "$p" ] && { kill -TERM -- "-$p" 2>/dev/null || kill -TERM "$p"; }; rm -f "$0"'
_REAP = 'for f in "$0"/*/' + PIDFILE + '; do [ -f "$f" ] || continue; p=$(cat "$f"); ' \
        'kill -KILL -- "-$p" 2>/dev/null || kill -KILL "$p" 2>/dev/null; rm -f "$f"; done; true'


# docker-py wraps neither a refused/cut socket (ConnectionError) nor an engine too busy or hung to answer in time
# (ReadTimeout): both are the engine being unreachable, not the job's fault
UNREACHABLE = (requests.exceptions.ConnectionError, requests.exceptions.Timeout)
ENGINE_ERRORS = (DockerException, *UNREACHABLE)
ENGINE_TIMEOUT_S = 120.0


@contextlib.contextmanager
def reaching_engine(doing: str) -> Iterator[None]:
    """A connection to the engine refused, cut or unanswered (dockerd stopped, restarting, hung) is DOCKER_UNAVAILABLE."""
    try:
        yield
    except UNREACHABLE as exc:
        raise SaigeError("DOCKER_UNAVAILABLE", f"lost the Docker engine while {doing}: {exc}") from None


START_HINT = "the engine cannot start it: `docker start NAME` shows why (networks, runtime, mounts); " \
             "`systemctl restart docker` if the engine's own state is broken"


def client(timeout_s: float = ENGINE_TIMEOUT_S) -> docker.DockerClient:
    """A Docker client, or DOCKER_UNAVAILABLE naming the reason (socket missing, permission denied, no answer)."""
    try:
        c = docker.from_env(timeout=timeout_s)
        c.ping()
        return c
    except ENGINE_ERRORS as exc:
        raise SaigeError("DOCKER_UNAVAILABLE", f"cannot reach the Docker engine: {exc}") from None


@dataclass(frozen=True)
class Spec:
    """What a target's container must look like."""

    name: str
    image: str
    work_root: Path
    runtime: str = "auto"
    user: str = "auto"
    owner: str = ""

    @classmethod
    def for_target(cls, config: Config, target: str) -> Spec:
        section = cubie_section(config) if target == "cubie" else config.section(target)
        return cls(section["container"], section["image"], config.work_root,
                   section.get("runtime", "auto"), section.get("user", "auto"),
                   f"{socket.gethostname()}:{config.state_dir}")


def cubie_section(config: Config) -> dict[str, Any]:
    """The cubie config with the guide's SAIGE_CUBIE_<KEY> environment overrides applied."""
    section = dict(config.section("cubie"))
    for key in section:
        value = os.environ.get(f"SAIGE_CUBIE_{key.upper()}")
        if value:
            section[key] = value
    return section


def pick_runtime(setting: str, info: dict[str, Any]) -> str | None:
    """The container runtime: `auto` avoids an nvidia default (runc when the engine has it), else the engine's default."""
    if setting != "auto":
        return setting
    return "runc" if info.get("DefaultRuntime") == "nvidia" and "runc" in info.get("Runtimes", {}) else None


def exec_user(setting: str) -> str:
    if setting == "auto":
        return f"{os.getuid()}:{os.getgid()}"
    return setting


class Container:
    """One long-lived compiler container: found by name, created, started, recreated when it dies."""

    def __init__(self, api: docker.DockerClient, spec: Spec, on_event: Callable[[str, dict[str, Any]], None]) -> None:
        self.docker = api
        self.spec = spec
        self.on_event = on_event
        self.image_id: str | None = None
        self._probed: dict[str, list[str]] = {}

    # -- lifecycle -----------------------------------------------------------------------------
    def _runtime(self) -> str | None:
        return pick_runtime(self.spec.runtime, self.docker.info() if self.spec.runtime == "auto" else {})

    def _has_mount(self, attrs: dict[str, Any]) -> bool:
        root = str(self.spec.work_root)
        return any(m.get("Source") == root and m.get("Destination") == root for m in attrs.get("Mounts", []))

    def _create(self) -> Any:
        self.spec.work_root.mkdir(parents=True, exist_ok=True)
        try:
            ctr = self.docker.containers.create(
                self.spec.image, command=["tail", "-f", "/dev/null"], name=self.spec.name,
                labels={MANAGED_LABEL: "1", OWNER_LABEL: self.spec.owner}, ipc_mode="host", runtime=self._runtime(), detach=True,
                init=True,  # an init as PID 1 reaps what killed steps orphan: `tail` would let zombies pile up for months
                mounts=[Mount(target=str(self.spec.work_root), source=str(self.spec.work_root), type="bind")])
        except ImageNotFound:
            raise SaigeError("IMAGE_NOT_FOUND", f"image {self.spec.image} is not loaded in the Docker engine") from None
        except APIError as exc:
            if exc.status_code == 409:  # created by someone else meanwhile
                return self.docker.containers.get(self.spec.name)
            raise SaigeError("CONTAINER_FAILED", f"cannot create container {self.spec.name}: {exc.explanation}") from None
        self.on_event("container.created", {"container": self.spec.name, "image": self.spec.image})
        return ctr

    def ensure(self) -> Any:
        """The running container; created when missing, started when stopped, recreated when ours is wrong."""
        with reaching_engine(f"preparing container {self.spec.name}"):
            return self._ensure()

    def _ensure(self) -> Any:
        try:
            ctr = self.docker.containers.get(self.spec.name)
        except NotFound:
            ctr = self._create()
        except DockerException as exc:
            raise SaigeError("DOCKER_UNAVAILABLE", f"cannot reach the Docker engine: {exc}") from None
        managed = ctr.labels.get(MANAGED_LABEL) == "1"
        self._check_owner(ctr)
        if not self._has_mount(ctr.attrs):
            if not managed:
                raise SaigeError("CONTAINER_FAILED", f"container {self.spec.name} exists without the work-root mount "
                                 f"{self.spec.work_root} and was not created by saigeedged")
            ctr.remove(force=True)
            ctr = self._create()
        if ctr.status != "running":
            ctr = self._start(ctr, managed)
            self._probed.clear()
            if ctr.status != "created":  # a container that never ran is not restarted: container.created told it
                self.on_event("container.restarted", {"container": self.spec.name})
            ctr.reload()
        self.image_id = ctr.image.id if ctr.image else None
        return ctr

    def _check_owner(self, ctr: Any) -> None:
        """Two daemons configured with one container name would remove each other's: refuse, naming the other."""
        owner = ctr.labels.get(OWNER_LABEL)
        if ctr.labels.get(MANAGED_LABEL) == "1" and owner and owner != self.spec.owner:
            raise SaigeError("CONTAINER_FAILED", f"container {self.spec.name} belongs to another saigeedged "
                             f"({owner}); this one is {self.spec.owner}",
                             hint="give each daemon its own container name (cubie.container / mobilint.container "
                             "in its config); saigeedged never removes another daemon's container")

    def _start(self, ctr: Any, managed: bool) -> Any:
        """Start a stopped container; ours is made afresh once if the engine cannot start it (a network endpoint or
        bridge that no longer exists after an engine restart)."""
        try:
            ctr.start()
            return ctr
        except APIError as exc:
            if not managed:
                raise SaigeError("CONTAINER_FAILED", f"cannot start container {self.spec.name}: {exc.explanation}",
                                 hint=START_HINT) from None
        ctr.remove(force=True)
        ctr = self._create()
        try:
            ctr.start()
        except APIError as exc:
            raise SaigeError("CONTAINER_FAILED", f"cannot start container {self.spec.name}, even made afresh: "
                             f"{exc.explanation}", hint=START_HINT) from None
        return ctr

    def recreate(self) -> None:
        """Remove our container (it died mid-job) so the next ensure() makes a fresh one."""
        try:
            ctr = self.docker.containers.get(self.spec.name)
            if ctr.labels.get(MANAGED_LABEL) == "1" and ctr.labels.get(OWNER_LABEL) in (None, "", self.spec.owner):
                ctr.remove(force=True)  # another daemon's is left alone: the next ensure() says whose it is
        except NotFound:
            pass
        self._probed.clear()

    def follow_image(self) -> None:
        """Recreate our container when its image tag names another image now (a new toolchain was loaded): a job
        runs on, and its cache key names, the image the config names. Called with the host lock held."""
        with reaching_engine(f"checking the image of {self.spec.name}"):
            try:
                current = self.docker.images.get(self.spec.image).id
                ctr = self.docker.containers.get(self.spec.name)
            except NotFound:  # ImageNotFound too: the container's own image still runs the job
                return
            if current == self.image_id or ctr.labels.get(MANAGED_LABEL) != "1":
                return
            ctr.remove(force=True)
            self._probed.clear()
            self.ensure()

    def alive(self) -> bool:
        try:
            return bool(self.docker.containers.get(self.spec.name).status == "running")
        except ENGINE_ERRORS:
            return False

    # -- execs ---------------------------------------------------------------------------------
    def _exec(self, ctr: Any, argv: Sequence[str], workdir: str, env: dict[str, str] | None,
              sink: Callable[[bytes], None]) -> int | None:
        api = self.docker.api
        exec_id = api.exec_create(ctr.id, list(argv), user=exec_user(self.spec.user), workdir=workdir,
                                  environment=env)["Id"]
        for out, err in api.exec_start(exec_id, stream=True, demux=True):
            if out:
                sink(out)
            if err:
                sink(err)
        while True:  # the stream ends on a broken connection too: only exec_inspect decides
            info = api.exec_inspect(exec_id)
            if not info["Running"]:
                code = info.get("ExitCode")
                return None if code is None else int(code)
            time.sleep(0.02)

    def probe(self, script: str) -> tuple[int, str]:
        """Run a fixed shell snippet (no manifest values) and return (exit code, output)."""
        chunks: list[bytes] = []
        with reaching_engine("probing the container"):
            code = self._exec(self.ensure(), ["sh", "-c", script], "/", None, chunks.append)
        return (-1 if code is None else code), b"".join(chunks).decode(errors="replace")

    def entry_point(self, key: str, script: str) -> str:
        """The cached output of an entry-point probe, re-probed after every container start."""
        if key not in self._probed:
            code, out = self.probe(script)
            self._probed[key] = out.strip().splitlines() if code == 0 else []
        lines = self._probed[key]
        return lines[0] if lines else ""

    def run_step(self, argv: Sequence[str], workdir: Path, timeout_s: int, sink: Callable[[bytes], None],
                 env: dict[str, str] | None = None) -> int:
        """One compiler step under `timeout --kill-after`, output streamed to `sink`; returns its exit code."""
        ctr = self.ensure()
        pidfile = str(workdir / PIDFILE)
        wrapped = ["sh", "-c", _WRAP, pidfile, TIMEOUT_BIN, f"--kill-after={KILL_AFTER}", f"{max(1, int(timeout_s))}s",
                   *argv]
        _raise_if_stopped(workdir, argv)  # a stop that came between steps is not erased by this one
        with reaching_engine(f"running {shlex.join(argv[:3])}"):
            code = self._exec(ctr, wrapped, str(workdir), env, sink)
        _raise_if_stopped(workdir, argv)
        if code is None or self._lost(ctr, code):
            raise SaigeError("CONTAINER_LOST", f"container {self.spec.name} died during {shlex.join(argv[:3])}")
        Path(pidfile).unlink(missing_ok=True)
        return code

    def _lost(self, ctr: Any, code: int) -> bool:
        """Did the container die under the step? A kill shows as 137 before the engine marks it exited.

        An exit below 128 is the step's own: a dying container kills it by signal, so no engine call is needed.
        """
        if code < 128:
            return False
        try:
            self.docker.api.wait(ctr.id, timeout=LOST_GRACE_S)  # returns as soon as the container stops
        except Exception:  # still running after the grace period: the step alone was killed (e.g. timeout)
            return not self.alive()
        return True

    def interrupt(self, workdir: Path, reason: str) -> None:
        """Kill the running step of the job in `workdir` (cancel or daemon stop); its run_step raises CANCELLED,
        and so does every later step of that job (the stop file stays until the work folder is removed)."""
        try:
            (workdir / STOPFILE).write_text(reason)
        except OSError:  # no work folder yet: the worker's own flag stops the job before its first step
            pass
        try:
            ctr = self.docker.containers.get(self.spec.name)
            self._exec(ctr, ["sh", "-c", _KILL, str(workdir / PIDFILE)], "/", None, lambda _: None)
        except ENGINE_ERRORS:
            pass

    def reap(self) -> None:
        """Kill leftover steps recorded by their pidfiles: of a daemon SIGKILL'd mid-step, or of steps whose
        engine connection was cut (they may have run on while the engine was unreachable)."""
        with reaching_engine(f"killing leftover steps in {self.spec.name}"):
            try:
                ctr = self.docker.containers.get(self.spec.name)
            except NotFound:
                return
            if ctr.status == "running":
                self._exec(ctr, ["sh", "-c", _REAP, str(self.spec.work_root)], "/", None, lambda _: None)


def _raise_if_stopped(workdir: Path, argv: Sequence[str]) -> None:
    try:
        reason = (workdir / STOPFILE).read_text().strip() or "stop"
    except FileNotFoundError:
        return
    raise SaigeError("CANCELLED", f"step {shlex.join(argv[:3])} was stopped ({reason})", reason=reason)


class HostLock:
    """One job at a time in a container, across processes: an flock under state_dir."""

    POLL_S = 0.2  # flock has no timeout: a waiter polls so that a stop or cancel can end the wait

    def __init__(self, state_dir: Path) -> None:
        state_dir.mkdir(parents=True, exist_ok=True)
        self._fh = (state_dir / "container.lock").open("a")
        self.held = False

    def acquire(self, on_wait: Callable[[], None] | None = None,
                interrupted: Callable[[], str | None] = lambda: None) -> None:
        """Take the lock; while another process holds it, call on_wait once and raise CANCELLED when interrupted."""
        waited = False
        while not self.held:
            try:
                fcntl.flock(self._fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
                self.held = True
            except BlockingIOError:
                if not waited and on_wait:
                    on_wait()
                waited = True
                reason = interrupted()
                if reason is not None:
                    raise SaigeError("CANCELLED", f"stopped while waiting for the container lock ({reason})",
                                     reason=reason) from None
                time.sleep(self.POLL_S)

    def release(self) -> None:
        if self.held:
            fcntl.flock(self._fh, fcntl.LOCK_UN)
            self.held = False


class Containers:
    """The containers of one process, made on first use; the host lock is held while a job uses one."""

    def __init__(self, config: Config, on_event: Callable[[str, dict[str, Any]], None] | None = None,
                 on_wait: Callable[[], None] | None = None) -> None:
        self.config = config
        self.on_event = on_event or (lambda event, fields: None)
        self.on_wait = on_wait
        self._api: docker.DockerClient | None = None
        self._by_target: dict[str, Container] = {}
        self.lock = HostLock(config.state_dir)
        self.active: Container | None = None
        self.interrupted: Callable[[], str | None] = lambda: None  # set by the worker: ends a wait for the lock

    def api(self) -> docker.DockerClient:
        if self._api is None:
            self._api = client(float(self.config.section("limits")["engine_timeout_s"]))
        return self._api

    def engine_up(self) -> bool:
        """Does the engine answer a ping now?"""
        try:
            return bool(self.api().ping())
        except (SaigeError, *ENGINE_ERRORS):
            return False

    def container(self, target: str) -> Container:
        if target not in self._by_target:
            self._by_target[target] = Container(self.api(), Spec.for_target(self.config, target), self.on_event)
        return self._by_target[target]

    def get(self, target: str) -> Container:
        """The target's container, running, with the host lock held (released by release())."""
        self.lock.acquire(self.on_wait, self.interrupted)
        self.active = self.container(target)
        self.active.ensure()
        self.active.follow_image()
        return self.active

    def release(self) -> None:
        self.active = None
        self.lock.release()
