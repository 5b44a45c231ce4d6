"""The docker-py calls saigeedged makes, as typed Protocols, and the one place that connects to an engine.

docker-py has no type hints: every object it returns is `Any` to mypy. Callers get these Protocols instead,
so what the rest of the code does with an engine is checked. The engine errors are re-exported from here:
no module outside this package imports docker.
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
from collections.abc import Iterator
from typing import IO, Any, Protocol, cast

import docker
import docker.tls
import paramiko
import requests
import urllib3
from docker.errors import APIError, DockerException, ImageNotFound, NotFound

from saigeedged.engines import EngineSpec
from saigeedged.errors import SaigeError

__all__ = ["APIError", "DockerException", "ImageNotFound", "NotFound", "ENGINE_ERRORS", "UNREACHABLE", "connect"]

# docker-py wraps neither a refused/cut socket (ConnectionError) nor an engine too busy or hung to answer in time
# (ReadTimeout): both are the engine being unreachable, not the job's fault. Nor does it wrap its ssh transport's
# errors: paramiko's, an EOF from a dead channel, a reset socket. One list for the daemon and `check`.
UNREACHABLE = (requests.exceptions.ConnectionError, requests.exceptions.Timeout, paramiko.SSHException,
               paramiko.ssh_exception.NoValidConnectionsError, EOFError, ConnectionError, TimeoutError, socket.gaierror)
ENGINE_ERRORS = (DockerException, *UNREACHABLE)
ENGINE_TIMEOUT_S = 120.0
KEEPALIVE_S = 15  # an idle connection is probed this often, so a vanished host is found by the next call, not hung on


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
    """docker-py's APIClient: execs and archives by container id."""

    def exec_create(self, container: str, cmd: list[str], **kwargs: Any) -> dict[str, Any]: ...
    @property
    def timeout(self) -> float: ...
    def exec_start(self, exec_id: str, *, detach: bool = ..., socket: bool = ...) -> Any: ...
    def exec_inspect(self, exec_id: str) -> dict[str, Any]: ...
    def wait(self, container: str, *, timeout: float) -> dict[str, Any]: ...
    def put_archive(self, container: str, path: str, data: bytes | IO[bytes]) -> bool: ...
    def get_archive(self, container: str, path: str) -> tuple[Iterator[bytes], dict[str, Any]]: ...


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


_environ_lock = threading.Lock()  # a client is made with a borrowed environment (HOME for paramiko)
# tcp engines: the kernel probes an idle connection (after 15 s, every 5 s, 4 misses), so a vanished host ends a
# read with an error instead of hanging it; urllib3 takes the options for every connection it makes
_KEEPALIVE = [(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1), (socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, KEEPALIVE_S),
              (socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, 5), (socket.IPPROTO_TCP, socket.TCP_KEEPCNT, 4)]
if _KEEPALIVE[0] not in urllib3.connection.HTTPConnection.default_socket_options:
    urllib3.connection.HTTPConnection.default_socket_options = [*urllib3.connection.HTTPConnection.default_socket_options,
                                                                *_KEEPALIVE]


def connect(spec: EngineSpec, timeout_s: float = ENGINE_TIMEOUT_S) -> DockerAPI:
    """A client of the engine `spec` names, pinged; DOCKER_UNAVAILABLE naming the engine and why otherwise.

    tcp engines use the config's CA and client certificate only (requests would let REQUESTS_CA_BUNDLE override
    it); ssh engines use paramiko, which reads the service user's ~/.ssh (key, known_hosts) when connecting.
    """
    try:
        client = _client(spec, timeout_s)
        client.ping()
    except ENGINE_ERRORS as exc:
        where = f"engine {spec.name} ({spec.url})" if spec.url else "the Docker engine"
        raise SaigeError("DOCKER_UNAVAILABLE", f"cannot reach {where}: {exc}") from exc  # the cause says why
    return client


def _client(spec: EngineSpec, timeout_s: float) -> DockerAPI:
    if spec.url is None:
        return cast(DockerAPI, docker.from_env(timeout=timeout_s))

    tls: Any = False
    if spec.tls is not None:
        tls = docker.tls.TLSConfig(client_cert=(str(spec.tls.cert), str(spec.tls.key)), ca_cert=str(spec.tls.ca),
                                   verify=True)
    with _environ_lock, _without("REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE"):
        client = docker.DockerClient(base_url=spec.url, tls=tls, timeout=timeout_s, use_ssh_client=False)
    client.api.trust_env = False  # no proxies nor CA bundles from the environment
    ssh = client.api.adapters.get("http+docker://ssh")
    transport = ssh.ssh_client.get_transport() if ssh is not None and ssh.ssh_client is not None else None
    if transport is not None:
        transport.set_keepalive(KEEPALIVE_S)  # paramiko sends none by default: a dead peer would hang a read
    return cast(DockerAPI, client)


@contextlib.contextmanager
def _without(*names: str) -> Iterator[None]:
    saved = {name: os.environ.pop(name) for name in names if name in os.environ}
    try:
        yield
    finally:
        os.environ.update(saved)


@contextlib.contextmanager
def reaching_engine(doing: str) -> Iterator[None]:
    """A connection to the engine refused, cut or unanswered (dockerd stopped, restarting, hung) is DOCKER_UNAVAILABLE."""
    try:
        yield
    except UNREACHABLE as exc:
        raise SaigeError("DOCKER_UNAVAILABLE", f"lost the Docker engine while {doing}: {exc}") from None


def answers(client: DockerAPI) -> bool:
    """Does the engine answer a ping now? Never raises."""
    try:
        return bool(client.ping())
    except (SaigeError, *ENGINE_ERRORS):
        return False
