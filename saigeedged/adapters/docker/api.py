"""The docker-py calls saigeedged makes, as typed Protocols, and the one place that connects to an engine.

docker-py has no type hints: every object it returns is `Any` to mypy. Callers get these Protocols instead,
so what the rest of the code does with an engine is checked. The engine errors are re-exported from here:
no module outside this package imports docker.
"""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Iterator
from typing import Any, Protocol, cast

import docker
import requests
from docker.errors import APIError, ContainerError, DockerException, ImageNotFound, NotFound

from saigeedged.engines import EngineSpec, local_url
from saigeedged.errors import SaigeError

__all__ = ["APIError", "ContainerError", "DockerException", "ImageNotFound", "NotFound", "ENGINE_ERRORS", "UNREACHABLE",
           "connect"]

# docker-py wraps neither a refused/cut socket (ConnectionError, or ChunkedEncodingError when the cut comes mid-answer)
# nor an engine too busy or hung to answer in time (ReadTimeout): all are the engine being unreachable, not the job's
# fault. One list for the daemon and `check`.
UNREACHABLE = (requests.exceptions.ConnectionError, requests.exceptions.ChunkedEncodingError,
               requests.exceptions.Timeout, EOFError, ConnectionError, TimeoutError, socket.gaierror)
ENGINE_ERRORS = (DockerException, *UNREACHABLE)
ENGINE_TIMEOUT_S = 120.0


class ImageRef(Protocol):
    @property
    def id(self) -> str: ...


class ContainerRef(Protocol):
    """A container as docker-py's `Container` model gives it."""

    @property
    def id(self) -> str: ...
    @property
    def name(self) -> str: ...
    @property
    def status(self) -> str: ...
    @property
    def labels(self) -> dict[str, str]: ...
    @property
    def attrs(self) -> dict[str, Any]: ...
    @property
    def image(self) -> ImageRef | None: ...
    def start(self) -> None: ...
    def reload(self) -> None: ...
    def remove(self, *, force: bool = ...) -> None: ...


class ContainerCalls(Protocol):
    def get(self, name: str) -> ContainerRef: ...
    def create(self, image: str, **kwargs: Any) -> ContainerRef: ...
    def run(self, image: str, command: list[str], **kwargs: Any) -> bytes: ...


class ImageCalls(Protocol):
    def get(self, name: str) -> ImageRef: ...


class LowLevel(Protocol):
    """docker-py's APIClient: execs by container id."""

    def exec_create(self, container: str, cmd: list[str], **kwargs: Any) -> dict[str, Any]: ...
    @property
    def timeout(self) -> float: ...
    def exec_start(self, exec_id: str, *, detach: bool = ..., socket: bool = ...) -> Any: ...
    def exec_inspect(self, exec_id: str) -> dict[str, Any]: ...
    def wait(self, container: str, *, timeout: float) -> dict[str, Any]: ...


class DockerAPI(Protocol):
    """The client of one engine (docker.DockerClient)."""

    @property
    def containers(self) -> ContainerCalls: ...
    @property
    def images(self) -> ImageCalls: ...
    @property
    def api(self) -> LowLevel: ...
    def ping(self) -> bool: ...
    def info(self) -> dict[str, Any]: ...
    def close(self) -> None: ...


def connect(spec: EngineSpec, timeout_s: float = ENGINE_TIMEOUT_S) -> DockerAPI:
    """A client of the (local) engine `spec` names, pinged; DOCKER_UNAVAILABLE naming the engine and why otherwise."""
    try:
        client = _client(spec, timeout_s)
        client.ping()
    except ENGINE_ERRORS as exc:
        where = f"engine {spec.name} ({spec.url})" if spec.url else "the Docker engine"
        raise SaigeError("DOCKER_UNAVAILABLE", f"cannot reach {where}: {exc}") from exc  # the cause says why
    return client


def _client(spec: EngineSpec, timeout_s: float) -> DockerAPI:
    return cast(DockerAPI, docker.DockerClient(base_url=spec.url or local_url(), timeout=timeout_s))


@contextlib.contextmanager
def reaching_engine(doing: str) -> Iterator[None]:
    """A connection to the engine refused, cut or unanswered (dockerd stopped, restarting, hung) is DOCKER_UNAVAILABLE."""
    try:
        yield
    except UNREACHABLE as exc:
        raise SaigeError("DOCKER_UNAVAILABLE", f"lost the Docker engine while {doing}: {exc}") from None


def unanswered(client: DockerAPI) -> str | None:
    """Why the engine does not answer a ping now (None: it answers). Never raises."""
    try:
        return None if client.ping() else "the ping was refused"
    except SaigeError as exc:
        return exc.message
    except ENGINE_ERRORS as exc:
        return f"{type(exc).__name__}: {exc}"
