"""Round trips of a step on a remote engine (SPEC §11, §15): the step runs detached and the short exec that reads
its end brings back its exit code and the listing of what it wrote; a cancel still kills it."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from harness import container_output
from test_docker_seam import remote  # noqa: F401  (the fixture)

from saigeedged.adapters.docker import Engine
from saigeedged.errors import SaigeError


def execs_in(engine: Any, container: str, since: float, work: Path) -> list[str]:
    """The commands exec'd in `container` since `since` that name the work dir `work`, as the engine recorded them."""
    events = engine.client().events(since=f"{since:.6f}", until=int(time.time()) + 1, decode=True,
                                    filters={"container": container, "type": "container"})
    return [e["Action"] for e in events if e["Action"].startswith("exec_create") and str(work) in e["Action"]]


@pytest.mark.engines
@pytest.mark.docker
def test_remote_step_is_one_exec_with_its_code_output_and_outputs(remote: tuple[Engine, Any],  # noqa: F811
                                                                   engine_hosts: Any) -> None:
    """A step on a remote engine is one detached exec followed by short reads of its files: no exec of its own lists
    its outputs, yet its exit code, its stdout and stderr, and the file it wrote all come back."""
    engine, config = remote
    container = engine.container("cubie")
    work = config.work_root / "job-execs"
    work.mkdir(parents=True)
    (work / "in.txt").write_text("in")
    container.run_step(["true"], work, 60, lambda chunk: None)  # the first step also empties the dir: one more exec
    since = time.time()
    out: list[bytes] = []
    code = container.run_step(["sh", "-c", "cat in.txt > out.txt; echo said; echo warned >&2; exit 3"], work, 60,
                              out.append)
    assert code == 3
    assert b"said" in b"".join(out) and b"warned" in b"".join(out)
    assert (work / "out.txt").read_text() == "in"
    execs = execs_in(engine_hosts["tls"], container.spec.name, since, work)
    assert len([e for e in execs if "mkdir -p" in e]) == 1  # the step's own wrapper, started once
    assert all("@@" in e for e in execs if "mkdir -p" not in e)  # the rest read its end: no listing exec of its own


@pytest.mark.engines
@pytest.mark.docker
def test_remote_step_stopped_mid_run_is_cancelled_and_killed(remote: tuple[Engine, Any],  # noqa: F811
                                                             engine_hosts: Any) -> None:
    """interrupt() of a remote step kills it (its process gone from the container) and the step raises CANCELLED."""
    engine, config = remote
    container = engine.container("cubie")
    work = config.work_root / "job-stop"
    work.mkdir(parents=True)
    container.run_step(["true"], work, 60, lambda chunk: None)
    out: list[bytes] = []
    marker = "sleep 4321"

    def stop_when_running(chunk: bytes) -> None:
        out.append(chunk)
        if b"started" in chunk:
            container.interrupt(work, "cancel")

    with pytest.raises(SaigeError) as err:
        container.run_step(["sh", "-c", f"echo started; {marker}"], work, 60, stop_when_running)
    assert err.value.code == "CANCELLED"
    ctr = engine_hosts["tls"].client().containers.get(container.spec.name)
    assert marker not in container_output(ctr, ["ps", "-o", "args"])


@pytest.mark.engines
@pytest.mark.docker
def test_an_ended_attempt_leaves_no_work_folder_in_the_remote_container(remote: tuple[Engine, Any],  # noqa: F811
                                                                       engine_hosts: Any) -> None:
    """When an attempt ends its copy of the work dir is removed from the remote container (a mobilint job leaves
    ~0.5 GB there otherwise); one only released (detached by a stop) is kept for the re-attach."""
    from saigeedged.adapters.docker import Containers

    engine, config = remote
    containers = Containers(config, engine=engine)
    kept, ended = config.work_root / "job-kept", config.work_root / "job-ended"
    for work in (kept, ended):
        work.mkdir(parents=True)
        (work / "calib.bin").write_bytes(b"\1" * 1000)
        containers.get("cubie").run_step(["true"], work, 60, lambda chunk: None)
        containers.release(ended if work == ended else None)
    ctr = engine_hosts["tls"].client().containers.get(containers.container("cubie").spec.name)
    assert ctr.exec_run(["test", "-d", str(ended)]).exit_code == 1
    assert ctr.exec_run(["test", "-f", str(kept / "calib.bin")]).exit_code == 0
