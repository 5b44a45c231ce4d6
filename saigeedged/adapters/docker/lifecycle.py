"""A long-lived compiler container's life: found by name, created, started, recreated when it dies (SPEC §9)."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from docker.types import Mount

from saigeedged.adapters.docker.api import (
    APIError,
    ContainerRef,
    DockerAPI,
    DockerException,
    ImageNotFound,
    NotFound,
    reaching_engine,
)
from saigeedged.adapters.docker.spec import MANAGED_LABEL, OWNER_LABEL, Spec, pick_runtime
from saigeedged.errors import SaigeError

REFUSED_HINT = "the Docker engine's own error: `journalctl -u docker` says more; `saigeedged retry JOB_ID` once it is fixed"
START_HINT = "the engine cannot start it: `docker start NAME` shows why (networks, runtime, mounts); " \
             "`systemctl restart docker` if the engine's own state is broken"
OnEvent = Callable[[str, dict[str, Any]], None]


def image_of(ctr: ContainerRef) -> str | None:
    """The id of the image a container runs: what docker-py's ctr.image.id is, without its two image inspections (this
    runs before every step)."""
    return ctr.attrs.get("ImageID", ctr.attrs.get("Image")) or None


class Lifecycle:
    """One long-lived compiler container: found by name, created, started, recreated when it dies."""

    def __init__(self, api: DockerAPI, spec: Spec, on_event: OnEvent) -> None:
        self.docker = api
        self.spec = spec
        self.on_event = on_event
        self.image_id: str | None = None
        self._probed: dict[str, list[str]] = {}
        self._calls: list[float] = []  # when each engine call under way started: a worker on a hung engine shows here
        self._root_seen: tuple[int, int] | None = None  # (device, inode) of the work root the container was seen to have

    @property
    def calls(self) -> int:
        """Engine calls under way (by any thread: a job's worker, the monitor's reap, a cancel's kill)."""
        return len(self._calls)

    def busy_s(self) -> float:
        """How long the oldest engine call under way has lasted; 0 when there is none."""
        calls = list(self._calls)
        return time.monotonic() - min(calls) if calls else 0.0

    @contextlib.contextmanager
    def _reach(self, doing: str) -> Iterator[None]:
        """An engine call: timed while under way; the engine unreachable is DOCKER_UNAVAILABLE (reaching_engine), and
        an error it answered that the call did not handle is a SaigeError too (refused), never a bare APIError."""
        started = time.monotonic()
        self._calls.append(started)
        try:
            with reaching_engine(doing):
                yield
        except APIError as exc:
            raise refused(self.spec.name, doing, exc) from None
        finally:
            self._calls.remove(started)

    def _runtime(self) -> str | None:
        return pick_runtime(self.spec.runtime, self.docker.info() if self.spec.runtime == "auto" else {})

    def _has_mount(self, attrs: dict[str, Any]) -> bool:
        """Is the container as the spec wants it: the work root bind-mounted at its own path?"""
        root = str(self.spec.work_root)
        return any(m.get("Source") == root and m.get("Destination") == root for m in attrs.get("Mounts", []))

    def _mounts(self) -> list[Any]:
        self.spec.work_root.mkdir(parents=True, exist_ok=True)
        return [Mount(target=str(self.spec.work_root), source=str(self.spec.work_root), type="bind")]

    def _create(self) -> ContainerRef:
        try:
            ctr = self.docker.containers.create(
                self.spec.image, command=["tail", "-f", "/dev/null"], name=self.spec.name,
                labels={MANAGED_LABEL: "1", OWNER_LABEL: self.spec.owner}, ipc_mode="host", runtime=self._runtime(),
                detach=True, mounts=self._mounts(),
                init=True)  # an init as PID 1 reaps what killed steps orphan: `tail` would let zombies pile up for months
        except ImageNotFound:
            raise SaigeError("IMAGE_NOT_FOUND", f"image {self.spec.image} is not loaded in the Docker engine") from None
        except APIError as exc:
            if exc.status_code == 409:  # created by someone else meanwhile
                return self.docker.containers.get(self.spec.name)
            raise SaigeError("CONTAINER_FAILED", f"cannot create container {self.spec.name}: {exc.explanation}") from None
        self.on_event("container.created", {"container": self.spec.name, "image": self.spec.image})
        self._root_seen = root_id(self.spec.work_root)  # its mount is of the folder just made there
        return ctr

    def ensure(self) -> ContainerRef:
        """The running container; created when missing, started when stopped, recreated when ours is wrong."""
        with self._reach(f"preparing container {self.spec.name}"):
            return self._ensure()

    def _ensure(self) -> ContainerRef:
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
        self.image_id = image_of(ctr)
        return ctr

    def _check_owner(self, ctr: ContainerRef) -> None:
        """Two daemons configured with one container name would remove each other's: refuse, naming the other."""
        owner = ctr.labels.get(OWNER_LABEL)
        if ctr.labels.get(MANAGED_LABEL) == "1" and owner and owner != self.spec.owner:
            raise SaigeError("CONTAINER_FAILED", f"container {self.spec.name} belongs to another saigeedged "
                             f"({owner}); this one is {self.spec.owner}",
                             hint="give each daemon its own container name (cubie.container / mobilint.container "
                             "in its config); saigeedged never removes another daemon's container")

    def _start(self, ctr: ContainerRef, managed: bool) -> ContainerRef:
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
        """Remove our container (it died mid-job) so the next ensure() makes a fresh one. Never raises: an engine that
        does not answer now (or refuses) leaves it to the next ensure(), which starts it or says why it cannot."""
        self._probed.clear()
        try:
            with self._reach(f"removing {self.spec.name}, which died mid-job"):
                try:
                    ctr = self.docker.containers.get(self.spec.name)
                except NotFound:
                    return
                if ctr.labels.get(MANAGED_LABEL) == "1" and ctr.labels.get(OWNER_LABEL) in (None, "", self.spec.owner):
                    ctr.remove(force=True)  # another daemon's is left alone: the next ensure() says whose it is
        except SaigeError as exc:
            self.on_event("container.recreate_failed", {"container": self.spec.name, "error_code": exc.code,
                                                        "message": exc.message})

    def follow_image(self) -> None:
        """Recreate our container when its image tag names another image now (a new toolchain was loaded): a job
        runs on, and its cache key names, the image the config names. Called with the host lock held."""
        with self._reach(f"checking the image of {self.spec.name}"):
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


def root_id(root: Path) -> tuple[int, int]:
    """Which folder the work root is now (device, inode): one removed and made again is another."""
    st = root.stat()
    return st.st_dev, st.st_ino


# the OCI runtime's words for an exec into a container whose init is going away (`docker restart` or a kill as the exec
# starts; a random fault campaign: CONTAINER_FAILED, a job ended for good by a container that came back at once)
INIT_GONE = ("write init-p: broken pipe", "cannot exec in a stopped", "container not running")


def refused(container: str, doing: str, exc: APIError) -> SaigeError:
    """An error the engine answered to a call about our container: the container (or the step's exec) gone, or a
    conflict because it is not running (it stopped, died or was removed between two calls), is CONTAINER_LOST (the
    job runs again in a fresh one); any other is CONTAINER_FAILED, in the engine's words."""
    words = str(exc.explanation or exc)
    lost = ("not running", "is paused", "is restarting")
    if exc.status_code == 404 or (exc.status_code == 409 and any(s in words for s in lost)) or \
            (exc.status_code == 500 and "OCI runtime exec failed" in words and any(s in words for s in INIT_GONE)):
        return SaigeError("CONTAINER_LOST", f"container {container} stopped while {doing}: {words}")
    return SaigeError("CONTAINER_FAILED", f"the Docker engine refused {doing} ({exc.status_code}): {words}",
                      hint=REFUSED_HINT)
