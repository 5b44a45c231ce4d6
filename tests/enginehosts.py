"""Extra Docker engines for tests: dockerds in their own network namespaces, reached over unix, tcp+TLS or ssh.

Each engine is a `dockerd` started with `nsenter --net` in a namespace this module creates, with its own
data root, exec root, pidfile, socket, containerd namespace and cgroup parent, so it shares nothing with the
host's engine. `ip netns exec` is not used: it remounts /sys and hides the cgroup hierarchy from dockerd.
Everything a run creates is named after its run id and kept under ROOT/<run>, which the run holds locked:
a later run removes whatever an unlocked folder names (a killed pytest leaves nothing behind for long).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import socket
import subprocess
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import docker
import docker.tls
import enginecleanup
import netns
from conftest import STANDIN_ACUITY, STANDIN_MOBILINT
from enginecreds import SSH_USER, SSHD, SshFiles, TlsFiles, make_ssh, make_tls
from harness import wait_for

ROOT = enginecleanup.ROOT
PREFIX = enginecleanup.PREFIX
TLS_PORT = 2376
READY_S = 90
_client_lock = threading.Lock()  # clients are made with a borrowed environment


@dataclass(frozen=True)
class EngineSpec:
    """What one extra engine offers: always a unix socket; tcp+TLS and/or ssh on its namespace address."""

    name: str
    tls: bool = False
    ssh: bool = False
    images: tuple[str, ...] = (STANDIN_ACUITY, STANDIN_MOBILINT)


# The session's engines: one over tcp+TLS, one over ssh, one without the cubie (ACUITY) image.
STANDARD = (EngineSpec("tls", tls=True), EngineSpec("ssh", ssh=True), EngineSpec("nocubie", images=(STANDIN_MOBILINT,)))


class Engine:
    """One dockerd in namespace `netns`, its files under `folder`; fault helpers act on the dockerd process."""

    def __init__(self, spec: EngineSpec, ns: netns.Netns, folder: Path) -> None:
        self.spec = spec
        self.netns = ns
        self.folder = folder
        folder.mkdir()
        folder.chmod(0o755)
        self.socket = folder / "docker.sock"
        self.tls: TlsFiles | None = make_tls(folder / "tls", ns.addr) if spec.tls else None
        self.ssh: SshFiles | None = make_ssh(folder / "ssh", ns.addr, self.socket) if spec.ssh else None
        self.proc: subprocess.Popen[bytes] | None = None
        self.sshd: subprocess.Popen[bytes] | None = None

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def addr(self) -> str:
        return self.netns.addr

    @property
    def unix_url(self) -> str:
        return f"unix://{self.socket}"

    @property
    def tcp_url(self) -> str:
        return f"tcp://{self.addr}:{TLS_PORT}"

    @property
    def ssh_url(self) -> str:
        return f"ssh://{SSH_USER}@{self.addr}"

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def tls_config(self) -> docker.tls.TLSConfig:
        assert self.tls is not None, f"engine {self.name} has no TLS endpoint"
        return docker.tls.TLSConfig(client_cert=(str(self.tls.client_cert), str(self.tls.client_key)),
                                    ca_cert=str(self.tls.ca), verify=True)

    def client(self, via: str = "unix", timeout: int = 30) -> docker.DockerClient:
        """A docker-py client over `via` (unix, tls or ssh) that ignores the environment's CA bundle and proxies.

        requests lets REQUESTS_CA_BUNDLE / CURL_CA_BUNDLE override the engine's CA given by `tls=`, so the
        client is made without them and told not to read the environment again. For ssh, paramiko reads
        ~/.ssh (key, known_hosts) when the client is made: HOME points at the engine's client home then.
        """
        with _client_lock, _environ(HOME=str(self.ssh.home) if self.ssh else None, REQUESTS_CA_BUNDLE=None,
                                    CURL_CA_BUNDLE=None):
            client = docker.DockerClient(base_url=self.url(via), tls=self.tls_config() if via == "tls" else False,
                                         timeout=timeout)
        client.api.trust_env = False
        return client

    def config_entry(self, via: str) -> dict[str, Any]:
        """The engine as an `engines:` item of the daemon's config (SPEC §11), reached over `via`.

        A daemon given an ssh entry needs HOME=<ssh.home> (its key and known_hosts) in its environment.
        """
        entry: dict[str, Any] = {"name": self.name, "url": self.url(via), "targets": ["cubie", "mobilint"]}
        if via == "tls":
            assert self.tls is not None
            entry["tls"] = {"ca": str(self.tls.ca), "cert": str(self.tls.client_cert), "key": str(self.tls.client_key)}
        return entry

    def url(self, via: str) -> str:
        """The engine's address for docker-py over `via`: unix, tls or ssh."""
        urls = {"unix": self.unix_url, "tls": self.tcp_url if self.tls else None, "ssh": self.ssh_url if self.ssh else None}
        url = urls[via]
        assert url is not None, f"engine {self.name} has no {via} endpoint"
        return url

    def argv(self) -> list[str]:
        (self.folder / "daemon.json").write_text("{}")  # not the host's /etc/docker/daemon.json
        tag = self.netns.name
        argv = ["nsenter", f"--net={self.netns.path}", "dockerd", "--config-file", str(self.folder / "daemon.json"),
                "--data-root", str(self.folder / "data"), "--exec-root", str(self.folder / "exec"),
                "--pidfile", str(self.folder / "dockerd.pid"), "-H", self.unix_url,
                "--containerd-namespace", tag, "--containerd-plugins-namespace", f"{tag}-plugins",
                "--exec-opt", "native.cgroupdriver=cgroupfs", "--cgroup-parent", f"/{tag}"]
        if self.ssh:
            argv += ["--group", SSH_USER]
        if self.tls:
            argv += ["-H", self.tcp_url, "--tlsverify", "--tlscacert", str(self.tls.ca),
                     "--tlscert", str(self.tls.server_cert), "--tlskey", str(self.tls.server_key)]
        return argv

    def start(self) -> None:
        """Start dockerd (returns at once: `wait_ready` waits for it)."""
        # After a kill -9 its containerd is dead but may linger as a zombie, whose pid looks alive to the next
        # dockerd, which then waits forever on that containerd's socket instead of starting a new one.
        pidfile = self.folder / "exec" / "containerd" / "containerd.pid"
        if pidfile.exists() and enginecleanup.gone(int(pidfile.read_text().strip() or 0)):
            pidfile.unlink()
        with (self.folder / "dockerd.log").open("ab") as log:
            self.proc = subprocess.Popen(self.argv(), stdout=log, stderr=log, start_new_session=True)

    def log_tail(self, name: str = "dockerd.log") -> str:
        path = self.folder / name
        return path.read_text(errors="replace")[-2000:] if path.exists() else ""

    def wait_ready(self, timeout: float = READY_S) -> None:
        def answers() -> bool:
            if self.proc is None or self.proc.poll() is not None:
                raise RuntimeError(f"dockerd of engine {self.name} exited:\n{self.log_tail()}")
            try:
                with contextlib.closing(docker.DockerClient(base_url=self.unix_url, timeout=5)) as client:
                    return bool(client.ping())
            except Exception:  # not listening yet
                return False

        wait_for(answers, timeout, f"dockerd of engine {self.name}\n{self.log_tail()}")

    def load(self, tarballs: dict[str, Path]) -> None:
        with contextlib.closing(self.client()) as client:
            for tag in self.spec.images:
                client.images.load(tarballs[tag].read_bytes())

    def start_sshd(self, timeout: float = 30) -> None:
        assert self.ssh is not None
        with self.ssh.log.open("ab") as log:
            self.sshd = subprocess.Popen(["nsenter", f"--net={self.netns.path}", SSHD, "-D", "-e", "-f", str(self.ssh.config)],
                                         stdout=log, stderr=log, start_new_session=True)
        wait_for(lambda: _banner(self.addr, 22), timeout, f"sshd of engine {self.name}\n{self.log_tail('ssh/sshd.log')}")

    # Fault helpers: what happens to a compile host's engine in the field.
    def kill(self) -> None:
        """kill -9 the dockerd (its containerd and containers live on, as on a real host)."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def stop(self, timeout: float = 10) -> None:
        """SIGSTOP the dockerd and wait until every thread is stopped: connections are accepted, nothing answers.

        kill() returns before the stop: one thread takes the signal and then stops the others, and on a
        loaded machine the rest can go on serving requests meanwhile.
        """
        os.kill(self.pid, signal.SIGSTOP)
        wait_for(lambda: _all_threads_stopped(self.pid), timeout, f"dockerd of engine {self.name} to stop")

    def cont(self) -> None:
        os.kill(self.pid, signal.SIGCONT)

    def kill_sshd(self) -> None:
        """kill -9 every sshd of this host, the listener and its sessions: open ssh transports die mid-connection and
        new ones are refused (start_sshd() brings it back)."""
        for pid in netns.pids(self.netns.name):
            with contextlib.suppress(OSError):
                if Path(f"/proc/{pid}/comm").read_text().strip() == "sshd":
                    os.kill(pid, signal.SIGKILL)
        if self.sshd is not None:
            self.sshd.wait(10)

    def restart(self, timeout: float = READY_S) -> None:
        """Stop dockerd (SIGTERM, or nothing when it was killed) and start it again, same files and flags."""
        if self.proc is not None and self.proc.poll() is None:
            self.cont()
            self.proc.terminate()
            self.proc.wait(timeout)
        for tries_left in (2, 1, 0):  # dockerd gives up on containerd after its own timeout on a loaded machine
            self.start()
            try:
                self.wait_ready(timeout)
                return
            except RuntimeError:
                if tries_left == 0 or "timeout waiting for containerd" not in self.log_tail():
                    raise

    def reap(self) -> None:
        """Collect our children once cleanup has killed them (no zombies left in the test process)."""
        for proc in (self.proc, self.sshd):
            if proc is not None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(10)


def _all_threads_stopped(pid: int) -> bool:
    states = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError):  # a thread that ended meanwhile
            states.append((task / "stat").read_text().rsplit(")", 1)[1].split()[0])
    return all(state == "T" for state in states)


def _banner(addr: str, port: int) -> bool:
    try:
        with socket.create_connection((addr, port), timeout=2) as conn:
            return conn.recv(4).startswith(b"SSH-")
    except OSError:
        return False


@contextlib.contextmanager
def _environ(**values: str | None) -> Iterator[None]:
    """Set (or, for None, unset) environment variables for the duration of the block."""
    old = {key: os.environ.get(key) for key in values}
    try:
        for key, value in values.items():
            _setenv(key, value)
        yield
    finally:
        for key, value in old.items():
            _setenv(key, value)


def _setenv(key: str, value: str | None) -> None:
    if value is None:
        os.environ.pop(key, None)
    else:
        os.environ[key] = value


class EngineHosts:
    """One run's engines by name; `close()` removes every process, mount, cgroup, namespace and file of the run."""

    def __init__(self, run: str, lock: IO[bytes]) -> None:
        self.run = run
        self.folder = ROOT / run
        self._lock = lock
        self.engines: dict[str, Engine] = {}

    def __getitem__(self, name: str) -> Engine:
        return self.engines[name]

    def create(self, specs: tuple[EngineSpec, ...]) -> None:
        """Namespaces and engine folders (under the allocation lock: the /30s are picked against the host's routes)."""
        with enginecleanup.allocation():
            for i, (spec, subnet) in enumerate(zip(specs, netns.free_subnets(len(specs)), strict=True)):
                ns = netns.create(f"{PREFIX}{self.run}-{i}", f"{enginecleanup.VETH}{self.run}{i}h", subnet)
                self.engines[spec.name] = Engine(spec, ns, self.folder / spec.name)

    def bring_up(self, host: docker.DockerClient) -> None:
        """Start every dockerd, copy the images in from the host's engine, start sshd where asked."""
        for engine in self.engines.values():
            engine.start()
        tarballs = save_images(host, {tag for e in self.engines.values() for tag in e.spec.images}, self.folder / "images")
        for engine in self.engines.values():
            engine.wait_ready()
            engine.load(tarballs)
            if engine.ssh:
                engine.start_sshd()

    def close(self) -> None:
        enginecleanup.remove_run(self.run)
        for engine in self.engines.values():
            engine.reap()
        self._lock.close()


def save_images(host: docker.DockerClient, tags: set[str], folder: Path) -> dict[str, Path]:
    """`docker save` each image once into `folder`, to be loaded into every engine that should have it."""
    folder.mkdir()
    tarballs = {}
    for i, tag in enumerate(sorted(tags)):
        path = folder / f"{i}.tar"
        with path.open("wb") as out:
            for chunk in host.images.get(tag).save(named=True):
                out.write(chunk)
        tarballs[tag] = path
    return tarballs


@contextlib.contextmanager
def started_engines(host: docker.DockerClient, specs: tuple[EngineSpec, ...] = STANDARD) -> Iterator[EngineHosts]:
    """Bring up `specs` as extra engines (after removing what killed runs left), and remove them all on exit."""
    enginecleanup.remove_stale()
    run, lock = enginecleanup.begin_run(lambda: secrets.token_hex(2))
    hosts = EngineHosts(run, lock)
    try:
        hosts.create(specs)
        hosts.bring_up(host)
        yield hosts
    finally:
        hosts.close()
