"""The extra test engines serve docker-py end to end over unix, tcp+TLS and ssh, fail like real hosts, and leave nothing."""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
import tarfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import docker
import docker.tls
import enginecleanup
import netns
import pytest
import requests
from conftest import STANDIN_ACUITY, STANDIN_MOBILINT
from enginehosts import EngineSpec, started_engines
from harness import wait_for

pytestmark = [pytest.mark.engines, pytest.mark.docker]

PEGASUS = "/root/acuity-toolkit-whl-6.30.22/bin/pegasus.py"
ENGINE_OF = {"unix": "tls", "tls": "tls", "ssh": "ssh"}  # which standard engine each transport is tried on


def workdir_tar(files: dict[str, bytes]) -> bytes:
    """A tar of folder `work/` holding `files`, as put_archive takes it."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        folder = tarfile.TarInfo("work")
        folder.type, folder.mode = tarfile.DIRTYPE, 0o755
        tar.addfile(folder)
        for name, data in files.items():
            info = tarfile.TarInfo(f"work/{name}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def untar(chunks: Iterator[bytes]) -> dict[str, bytes]:
    """Regular files of a get_archive stream, by name."""
    with tarfile.open(fileobj=io.BytesIO(b"".join(chunks))) as tar:
        return {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}  # type: ignore[union-attr]


def run_step(api: Any, container_id: str, argv: list[str], workdir: str) -> tuple[int, bytes]:
    """One exec, its output, and its exit code from exec_inspect (the stream's end says nothing)."""
    exec_id = api.exec_create(container_id, argv, workdir=workdir)["Id"]
    output = b"".join(part for pair in api.exec_start(exec_id, stream=True, demux=True) for part in pair if part)

    def ended() -> dict[str, Any] | None:
        inspect: dict[str, Any] = api.exec_inspect(exec_id)
        return None if inspect["Running"] else inspect

    return wait_for(ended, 30, "the exec to end")["ExitCode"], output


@pytest.fixture
def container_name(engine_hosts: Any) -> Iterator[str]:
    """A unique container name, removed from every test engine afterwards."""
    name = f"saige-eh-test-{uuid.uuid4().hex[:8]}"
    yield name
    for engine in engine_hosts.engines.values():
        try:
            engine.client(timeout=10).containers.get(name).remove(force=True)
        except Exception:  # not there, or the engine is down after a fault test
            pass


def connect(engine: Any, via: str, monkeypatch: pytest.MonkeyPatch) -> Any:
    """docker-py as a daemon would use the engine's `engines:` config entry."""
    entry = engine.config_entry(via)
    # requests lets these override the engine's CA given by tls= (this machine sets them; a service might too).
    monkeypatch.delenv("REQUESTS_CA_BUNDLE", raising=False)
    monkeypatch.delenv("CURL_CA_BUNDLE", raising=False)
    if via == "ssh":
        monkeypatch.setenv("HOME", str(engine.ssh.home))  # paramiko's key and known_hosts
    tls = entry.get("tls")
    return docker.DockerClient(base_url=entry["url"], timeout=30, tls=docker.tls.TLSConfig(
        client_cert=(tls["cert"], tls["key"]), ca_cert=tls["ca"], verify=True) if tls else False)


@pytest.mark.parametrize("via", ["unix", "tls", "ssh"])
def test_engine_runs_a_step_on_copied_inputs(engine_hosts: Any, docker_client: Any, container_name: str, via: str,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """Each transport: a mount-less container takes inputs by put_archive, runs pegasus import, gives outputs by get_archive."""
    engine = engine_hosts[ENGINE_OF[via]]
    client = connect(engine, via, monkeypatch)
    assert client.ping()
    ctr = client.containers.create(STANDIN_ACUITY, name=container_name)
    ctr.start()
    assert client.api.inspect_container(ctr.id)["Mounts"] == []
    model = os.urandom(4096)
    assert client.api.put_archive(ctr.id, "/", workdir_tar({"det.onnx": model}))
    code, output = run_step(client.api, ctr.id, ["python3", PEGASUS, "import", "onnx", "--model", "det.onnx",
                                                "--output-model", "det.json", "--output-data", "det.data"], "/work")
    assert code == 0, output.decode(errors="replace")
    stream, stat = client.api.get_archive(ctr.id, "/work")
    outputs = untar(stream)
    assert outputs["work/det.data"] == model
    assert b'"name": "det"' in outputs["work/det.json"]
    assert engine.client().containers.get(ctr.id).name == container_name  # on that engine...
    with pytest.raises(docker.errors.NotFound):
        docker_client.containers.get(ctr.id)  # ...and not on the host's


@pytest.mark.parametrize("via", ["unix", "tls", "ssh"])
def test_stopped_engine_gives_read_timeout(engine_hosts: Any, via: str) -> None:
    """A SIGSTOPped dockerd accepts connections but never answers: docker-py raises ReadTimeout, and works after SIGCONT."""
    engine = engine_hosts[ENGINE_OF[via]]
    timeout = 2
    client = engine.client(via, timeout=timeout)
    assert client.ping()
    engine.stop()
    started = time.monotonic()
    try:
        with pytest.raises(requests.exceptions.ReadTimeout):
            client.ping()
        waited = time.monotonic() - started
    finally:
        engine.cont()
    assert waited < 5 * timeout  # the client's timeout fired (a hang guard, not a speed figure)
    assert client.ping()


def test_engine_without_the_image_raises_image_not_found(engine_hosts: Any, container_name: str) -> None:
    """The engine set up without the cubie image refuses that container (ImageNotFound, no pull) but has the other image."""
    client = engine_hosts["nocubie"].client()
    with pytest.raises(docker.errors.ImageNotFound):
        client.containers.create(STANDIN_ACUITY, name=container_name)
    assert client.images.get(STANDIN_MOBILINT)


def test_killed_engine_refuses_then_restarts(engine_hosts: Any, container_name: str) -> None:
    """kill -9 of a dockerd makes its socket refuse clients; restart brings the engine back with its images and containers."""
    engine = engine_hosts["nocubie"]
    ctr = engine.client().containers.create(STANDIN_MOBILINT, name=container_name)
    engine.kill()
    with pytest.raises(docker.errors.DockerException):
        engine.client(timeout=5)
    engine.restart()
    client = engine.client()
    assert client.images.get(STANDIN_MOBILINT)
    assert client.containers.get(container_name).id == ctr.id


def run_traces(run: str) -> dict[str, Any]:
    """What of `run` is left on the host: folder, namespaces, veths, cgroups, mounts, processes."""
    folder = enginecleanup.ROOT / run
    prefix = f"{enginecleanup.PREFIX}{run}-"
    mounts = [line for line in Path("/proc/self/mountinfo").read_text().splitlines() if str(folder) in line]
    return {"folder": folder.exists(), "netns": netns.names(prefix), "veths": netns.links(f"{enginecleanup.VETH}{run}"),
            "cgroups": enginecleanup._cgroup_parents(prefix), "mounts": mounts,
            "pids": sorted(enginecleanup._run_pids(folder, prefix))}


NOTHING = {"folder": False, "netns": [], "veths": [], "cgroups": [], "mounts": [], "pids": []}


def test_engines_leave_nothing_after_a_failing_test(docker_client: Any) -> None:
    """An engine with a running container, torn down by a failing test, leaves no folder, netns, veth, cgroup, mount, process."""
    with pytest.raises(RuntimeError, match="the test failed"), started_engines(docker_client, (EngineSpec("solo"),)) as hosts:
        hosts["solo"].client().containers.run(STANDIN_MOBILINT, detach=True)
        run = hosts.run
        assert run_traces(run)["cgroups"]
        raise RuntimeError("the test failed")
    assert run_traces(run) == NOTHING


CHILD = """
import sys, time
sys.path.insert(0, {tests!r})
import docker
from enginehosts import EngineSpec, started_engines
with started_engines(docker.from_env(), (EngineSpec("orphan", ssh=True),)) as hosts:
    hosts["orphan"].client().containers.run({image!r}, detach=True)
    print(hosts.run, flush=True)
    time.sleep(600)
"""


def test_killed_run_is_removed_by_the_next(engine_hosts: Any) -> None:
    """Engines of a test process killed with -9 are removed by the next run's start-up, and a live run is left alone."""
    child = subprocess.Popen([sys.executable, "-c", CHILD.format(tests=str(Path(__file__).parent), image=STANDIN_MOBILINT)],
                             stdout=subprocess.PIPE, text=True)
    assert child.stdout is not None
    run = child.stdout.readline().strip()
    assert run, "the child process did not bring its engine up"
    assert run_traces(run)["pids"]
    child.send_signal(signal.SIGKILL)
    child.wait()
    enginecleanup.remove_stale()
    assert run_traces(run) == NOTHING
    assert engine_hosts["tls"].client().ping()  # the live session's engines are untouched
