"""The engine pool end to end (SPEC §11): the daemon with the local engine and the extra test engines (tcp+TLS, ssh),
bursts, a missing image, engines killed or frozen mid-step, a daemon restart; the stand-in's call records and the
status files say where each job ran and that it ran once."""

from __future__ import annotations

import contextlib
import io
import json
import re
import signal
import subprocess
import tarfile
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import docker
import pytest
import yaml
from conftest import STANDIN_MOBILINT
from harness import Daemon, container_output, drop, wait_for

from saigeedged.cli import main as cli

pytestmark = [pytest.mark.engines, pytest.mark.docker, pytest.mark.journald]

LOCAL = {"name": "local", "url": "unix:///var/run/docker.sock", "targets": ["cubie", "mobilint"]}
REMOTE = ("tls", "ssh")  # the test engines reached over the network, each by its own transport
QUANTIZE = re.compile(r" pegasus\.py quantize .*--model (\S+)\.json")
JOB_S = 180  # a generous bound for one job through a fault (a hang guard, not a speed figure)


@pytest.fixture(scope="module")
def pool_image(engine_hosts: Any, docker_client: Any, fresh_acuity: str) -> str:
    """This checkout's stand-in ACUITY image (with its sleepN knob), also loaded into the tls and ssh engines."""
    data = b"".join(docker_client.images.get(fresh_acuity).save(named=True))
    for name in REMOTE:
        with contextlib.closing(engine_hosts[name].client(timeout=120)) as client:
            client.images.load(data)
    return fresh_acuity


@pytest.fixture
def pool(daemon: Callable[..., Daemon], engine_hosts: Any, docker_client: Any, pool_image: str) -> Iterator[Any]:
    """pool(engines, **config) -> a daemon compiling cubie jobs on `engines`, in containers unique to this test
    (removed from every engine after the daemons are stopped)."""
    tag = uuid.uuid4().hex[:8]
    names = {"cubie": f"saige-pool-cubie-{tag}", "mobilint": f"saige-pool-mobilint-{tag}"}
    started: list[Daemon] = []

    def start(engines: list[dict[str, Any]], **overrides: Any) -> Daemon:
        limits = {"step_timeout_s": 60, **overrides.pop("limits", {})}
        d = daemon(env={"HOME": str(engine_hosts["ssh"].ssh.home)}, engines=engines, limits=limits,
                   cubie={"image": pool_image, "container": names["cubie"]},
                   mobilint={"image": STANDIN_MOBILINT, "container": names["mobilint"]},
                   defaults={"target": "cubie"}, **overrides)
        started.append(d)
        return d

    yield start
    for d in started:
        d.close()
    for client in [docker_client, *(e.client(timeout=10) for e in engine_hosts.engines.values())]:
        for name in names.values():
            with contextlib.suppress(Exception):  # not there, or its engine is down after a fault test
                client.containers.get(name).remove(force=True)


def entries(engine_hosts: Any, *names: str) -> list[dict[str, Any]]:
    """The local engine and the named test engines as `engines:` items; each test engine by its own transport."""
    via = {"tls": "tls", "ssh": "ssh"}
    return [LOCAL if n == "local" else engine_hosts[n].config_entry(via.get(n, "unix")) for n in names]


def client_of(name: str, engine_hosts: Any, docker_client: Any) -> Any:
    """The test's own docker-py client of engine `name` (the host's engine for `local`)."""
    return docker_client if name == "local" else engine_hosts[name].client(timeout=30)


def call_record(client: Any, container: str) -> list[str]:
    """The stand-in's record of every call in `container` (read with get_archive: works on a stopped container too)."""
    try:
        stream, _ = client.api.get_archive(container, "/tmp/standin-calls.log")
    except docker.errors.NotFound:
        return []
    with tarfile.open(fileobj=io.BytesIO(b"".join(stream))) as tar:
        member = tar.extractfile(tar.getmembers()[0])
        assert member is not None
        return member.read().decode().splitlines()


def quantized(lines: list[str]) -> Counter[str]:
    """How many times each model (the stem pegasus sees) was quantized, from a call record."""
    return Counter(m.group(1) for line in lines if (m := QUANTIZE.search(line)))


def procs(client: Any, container: str) -> str:
    """The command lines running in `container`, or "" when it is not running."""
    try:
        return container_output(client.containers.get(container), ["ps", "-o", "args"])
    except docker.errors.APIError:
        return ""


def journal(**match: str) -> list[dict[str, Any]]:
    """Journal entries with these fields, oldest first."""
    run = subprocess.run(["journalctl", "--no-pager", "-o", "json", *[f"{k}={v}" for k, v in match.items()]],
                         capture_output=True, text=True)
    return [json.loads(line) for line in run.stdout.splitlines() if line.startswith("{")]


def journal_event(d: Daemon, name: str, after: dict[str, Any] | None = None, **fields: str) -> dict[str, Any]:
    """Wait for the daemon's journal entry `name` with these SAIGEEDGE_ fields (the first one logged after `after`)."""
    assert d.proc is not None
    match = {f"SAIGEEDGE_{k.upper()}": v for k, v in fields.items()}
    since = int(after["__REALTIME_TIMESTAMP"]) if after else -1

    def found() -> dict[str, Any] | None:
        entries = journal(_PID=str(d.proc.pid), SAIGEEDGE_EVENT=name, **match)  # type: ignore[union-attr]
        return next((e for e in entries if int(e["__REALTIME_TIMESTAMP"]) > since), None)

    return wait_for(found, 30, f"journal event {name} {fields}")  # type: ignore[no-any-return]


def bundles(d: Daemon) -> list[Path]:
    return sorted(d.outbox.rglob("*.saigeedge"))


def test_burst_spreads_over_three_engines_and_compiles_each_job_once(pool: Any, engine_hosts: Any, docker_client: Any,
                                                                     det_inputs: dict[str, Any], capsys: Any) -> None:
    """30 drops on local + tls + ssh: every job succeeds once, on all three engines, one quantize each in the call
    records, one bundle each; the remote containers have no mounts; `saigeedged status` shows each engine busy."""
    d = pool(entries(engine_hosts, "local", "tls", "ssh"))
    names = [f"burst{i:02d}_sleep1" for i in range(30)]
    for name in names:
        drop(d.inbox, name, det_inputs["onnx"], {**det_inputs["manifest"], "cache": False})

    def all_busy() -> str | None:
        cli.main(["status", "-c", str(d.config)])
        out: str = capsys.readouterr().out
        return out if all(busy_engine(out, engine) for engine in ("local", "tls", "ssh")) else None

    wait_for(all_busy, JOB_S, "`saigeedged status` showing every engine busy")
    for engine in ("local", "tls", "ssh"):
        d.expect(f"{engine}: burst", JOB_S)  # STATUS= names the busy slots
    docs = {name: d.wait_job(name, timeout=JOB_S) for name in names}
    assert {n: doc["state"] for n, doc in docs.items() if doc["state"] != "succeeded"} == {}
    assert {doc["engine"] for doc in docs.values()} == {"local", "tls", "ssh"}
    assert all(len(doc["attempts"]) == 1 and doc["attempts"][0]["engine"] == doc["engine"] for doc in docs.values())
    container = cubie(d)["container"]
    runs: Counter[str] = Counter()
    for engine in ("local", "tls", "ssh"):
        record = quantized(call_record(client_of(engine, engine_hosts, docker_client), container))
        assert {m.removesuffix("_surgery") for m in record} == {n for n, doc in docs.items() if doc["engine"] == engine}
        runs += record
    assert sorted(runs.values()) == [1] * 30
    assert len(bundles(d)) == 30 and len(d.statuses()) == 30
    assert sorted(e["job_name"] for e in d.events("job.succeeded")) == names
    for engine in REMOTE:
        assert engine_hosts[engine].client().api.inspect_container(container)["Mounts"] == []
    assert docker_client.api.inspect_container(container)["Mounts"]  # only the local engine bind-mounts


def busy_engine(status: str, engine: str) -> bool:
    """`saigeedged status` lists `engine` as up with a burst job in one of its slots."""
    block = re.search(rf"^\s*{engine}\b.*?(?=^\S|\Z)", status, re.M | re.S)
    return block is not None and " up" in block.group(0) and "burst" in block.group(0)


def test_engine_without_the_image_takes_no_job_of_that_target(pool: Any, engine_hosts: Any, det_inputs: dict[str, Any],
                                                              capsys: Any) -> None:
    """An engine lacking the cubie image never gets a cubie job: all run on the engine that has it, first time;
    `saigeedged check` names the engine and the missing image."""
    d = pool(entries(engine_hosts, "local", "nocubie"))
    names = [f"noimg{i}_sleep1" for i in range(4)]
    for name in names:
        drop(d.inbox, name, det_inputs["onnx"], {**det_inputs["manifest"], "cache": False})
    docs = [d.wait_job(name, timeout=JOB_S) for name in names]
    assert [(doc["state"], doc["engine"], len(doc["attempts"])) for doc in docs] == [("succeeded", "local", 1)] * 4
    container = cubie(d)["container"]
    assert not engine_hosts["nocubie"].client().containers.list(all=True, filters={"name": container})
    capsys.readouterr()
    assert cli.main(["check", "-c", str(d.config)]) == 3
    lacking = [line for line in capsys.readouterr().out.splitlines() if "nocubie" in line and line.startswith("FAIL")]
    assert len(lacking) == 1 and f"lacks cubie image {cubie(d)['image']}" in lacking[0], lacking


def cubie(d: Daemon) -> dict[str, str]:
    """The daemon's cubie section: its container name and image."""
    section: dict[str, str] = yaml.safe_load(d.config.read_text())["cubie"]
    return section


def moved_job(pool: Any, engine_hosts: Any, det_inputs: dict[str, Any], name: str) -> tuple[Daemon, dict[str, Any], Any]:
    """A daemon on tls + ssh for cubie (local serves mobilint only) with job `name` in its quantize step (the
    stand-in's `sleep LONG`): the daemon, the job's status and the engine running it."""
    d = pool([{**LOCAL, "targets": ["mobilint"]}, *entries(engine_hosts, *REMOTE)], limits={"engine_timeout_s": 3},
             log={"format": "journal"})
    drop(d.inbox, name, det_inputs["onnx"], {**det_inputs["manifest"]})
    job = d.wait_job(name, ("running",), timeout=JOB_S)
    doc = d.wait_state(job["job_id"], ("running",), step="quantize", timeout=JOB_S)
    engine = engine_hosts[doc["engine"]]
    wait_for(lambda: f"sleep {LONG}" in procs(engine.client(), cubie(d)["container"]), 30,
             f"{name}'s quantize step running on {engine.name}")
    return d, doc, engine


def assert_moved_once(d: Daemon, job_id: str, lost: str) -> dict[str, Any]:
    """The job ended succeeded on the other engine after one ENGINE_LOST attempt on `lost`, published once."""
    other = next(n for n in REMOTE if n != lost)
    done = d.wait_state(job_id, ("succeeded", "failed", "cancelled"), timeout=JOB_S)
    assert done["state"] == "succeeded", done
    assert done["engine"] == other and done["attempt"] == 2
    assert [(a["engine"], a["error"]) for a in done["attempts"]] == [(lost, "ENGINE_LOST"), (other, None)]
    assert done["attempts"][0]["finished_at"]
    moved = journal_event(d, "job.moved", job_id=job_id)
    assert (moved["SAIGEEDGE_FROM_ENGINE"], moved["SAIGEEDGE_TO_ENGINE"]) == (lost, other)
    return done


def assert_published_once(d: Daemon, job_id: str, bundle: dict[str, Any]) -> None:
    """One status file and one bundle, the one the status names; one job.succeeded in the journal."""
    assert d.proc is not None
    assert [s["job_id"] for s in d.statuses()] == [job_id]
    assert bundles(d) == [d.outbox / bundle["path"]]
    assert d.status(job_id) is not None and d.status(job_id)["bundle"] == bundle  # type: ignore[index]
    journal_event(d, "job.succeeded", job_id=job_id)
    assert len(journal(_PID=str(d.proc.pid), SAIGEEDGE_EVENT="job.succeeded")) == 1


FAULTS = {"kill": ("kill", "restart"), "freeze": ("stop", "cont")}  # what befalls the engine, and how it comes back
LONG = 12  # seconds of the stand-in's quantize: the lost attempt's step still runs when its engine comes back


@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_engine_lost_mid_step_moves_the_job_and_never_publishes_the_lost_attempt(
        fault: str, pool: Any, engine_hosts: Any, det_inputs: dict[str, Any]) -> None:
    """kill -9 or SIGSTOP (past engine_timeout_s) of the dockerd running a job's quantize: engine.down, the job moves
    (job.moved) and succeeds on the other engine after an ENGINE_LOST attempt; when the engine is back (engine.up)
    the old attempt's step is already killed there and its folders removed, and nothing is published twice."""
    d, doc, engine = moved_job(pool, engine_hosts, det_inputs, f"{fault}_sleep{LONG}")
    lose, come_back = FAULTS[fault]
    getattr(engine, lose)()
    try:
        down = journal_event(d, "engine.down", engine=engine.name)
        journal_event(d, "job.moved", job_id=doc["job_id"])
    finally:
        getattr(engine, come_back)()
    journal_event(d, "engine.up", after=down, engine=engine.name)
    assert f"sleep {LONG}" not in procs(engine.client(), cubie(d)["container"])  # killed before engine.up
    old = d.state_dir / "work" / doc["job_id"] / "attempt1"  # the lost attempt's folder went with its step:
    assert not old.exists()  # here, and in the engine's container (unless it died with its dockerd: kill -9)
    ctr = engine.client().containers.get(cubie(d)["container"])
    assert fault == "kill" or ctr.exec_run(["test", "-e", str(old)]).exit_code == 1
    done = assert_moved_once(d, doc["job_id"], engine.name)
    assert_published_once(d, doc["job_id"], done["bundle"])


def test_daemon_restart_resumes_the_jobs_of_every_engine(pool: Any, engine_hosts: Any, docker_client: Any,
                                                         det_inputs: dict[str, Any]) -> None:
    """SIGKILL of the daemon while jobs compile on local, tls and ssh: the next start re-attaches each to its step
    on its engine (SPEC §15): one success in attempt 1 each, one bundle each, nothing requeued."""
    d = pool(entries(engine_hosts, "local", "tls", "ssh"))
    names = [f"resume{i}_sleep10" for i in range(3)]  # long enough for all three to be in quantize at once
    for name in names:
        drop(d.inbox, name, det_inputs["onnx"], {**det_inputs["manifest"]})

    def spread() -> list[dict[str, Any]] | None:
        docs = [s for s in d.statuses() if s["state"] == "running" and s["step"] == "quantize"]
        return docs if {s.get("engine") for s in docs} == {"local", "tls", "ssh"} else None

    running = wait_for(spread, JOB_S, "a job in quantize on each engine")
    d.signal(signal.SIGKILL)
    assert d.proc is not None
    d.proc.wait(10)
    d.start()
    for first in running:
        done = d.wait_state(first["job_id"], ("succeeded", "failed", "cancelled"), timeout=JOB_S)
        assert (done["state"], done["attempt"], len(done["attempts"])) == ("succeeded", 1, 1), done
        assert done["attempts"][0]["engine"] == first["engine"]
    assert len(d.statuses()) == 3 and len(bundles(d)) == 3
    assert not d.events("job.requeued")
    assert {e["job_id"] for e in d.events("job.reattached")} == {s["job_id"] for s in running}


def test_an_ssh_engine_whose_transport_dies_comes_back_without_a_restart(pool: Any, engine_hosts: Any,
                                                                      det_inputs: dict[str, Any]) -> None:
    """Every sshd of the ssh engine killed (its open transport dies, new ones are refused) and started again: the
    engine is marked down, then up again with a new client, and a cubie job runs there, all in one daemon."""
    ssh = engine_hosts["ssh"]
    d = pool([{**LOCAL, "targets": ["mobilint"]}, *entries(engine_hosts, "ssh")], limits={"engine_timeout_s": 3},
             log={"format": "journal"})
    journal_event(d, "engine.ready", engine="ssh")
    ssh.kill_sshd()
    try:
        down = journal_event(d, "engine.down", engine="ssh")
    finally:
        ssh.start_sshd()
    journal_event(d, "engine.up", after=down, engine="ssh")
    drop(d.inbox, "afterssh", det_inputs["onnx"], {**det_inputs["manifest"]})
    done = d.wait_job("afterssh", timeout=JOB_S)
    assert (done["state"], done["engine"], done["attempt"]) == ("succeeded", "ssh", 1), done
