"""Daemon faults against a real Docker engine (SPEC §9): kills, stops, dead containers, timeouts, cancel."""

from __future__ import annotations

import signal
import time
import zlib
from datetime import datetime
from pathlib import Path
from typing import Any

import docker
import pytest
import yaml
from engineproxy import EngineProxy
from factory import classifier, manifest, yolox
from harness import STANDIN_QUANTIZE, container_output, drop, release_standin, wait_for

from saigeedged.cli import client
from saigeedged.cli import main as cli

pytestmark = pytest.mark.docker


@pytest.fixture
def cubie_daemon(docker_config: Path, daemon: Any) -> Any:
    """daemon(...) with the stand-in container settings of docker_config and target cubie."""
    settings = yaml.safe_load(docker_config.read_text())

    def start(**overrides: Any) -> Any:
        limits = {**settings["limits"], **overrides.pop("limits", {})}
        cubie = {**settings["cubie"], **overrides.pop("cubie", {})}
        return daemon(cubie=cubie, mobilint=settings["mobilint"], limits=limits, defaults={"target": "cubie"},
                      **overrides)

    return start


def procs(docker_client: Any, d: Any) -> str:
    name = yaml.safe_load(d.config.read_text())["cubie"]["container"]
    return container_output(docker_client.containers.get(name), ["ps", "-o", "args"])


def release(docker_client: Any, d: Any) -> None:
    """End the stand-in's `untilreleased` quantize in the daemon's container, through the engine itself (never a
    test's EngineProxy): a step that runs until the test has done what it does meanwhile, however slow the machine
    (a fixed `slow` 3 s could end before a loaded machine got there)."""
    name = yaml.safe_load(d.config.read_text())["cubie"]["container"]
    release_standin(docker_client.containers.get(name))


def quantize_runs(docker_client: Any, d: Any) -> bool:
    """Is a stand-in quantize running in the daemon's container (False while the container is gone or recreated)?"""
    try:
        return STANDIN_QUANTIZE in procs(docker_client, d)
    except docker.errors.DockerException:
        return False


def named_model(tmp_path: Path, name: str) -> Path:
    """A model of its own (weights seeded by the name): the cache would serve an identical model's compile."""
    return yolox(tmp_path / f"{name}.onnx", size=(64, 64), seed=zlib.crc32(name.encode()))


def in_quantize(d: Any, docker_client: Any, tmp_path: Path, name: str, manifest: dict[str, Any]) -> dict[str, Any]:
    """Drop a model whose name picks the stand-in's behaviour; return once its quantize step runs in the container."""
    drop(d.inbox, name, named_model(tmp_path, name), manifest)
    job: dict[str, Any] = d.wait_job(name, ("running",))
    d.wait_state(job["job_id"], ("running",), step="quantize")
    marker = {"hang": "sleep 100000", "untilreleased": STANDIN_QUANTIZE}
    (mode,) = [m for m in marker if m in name]  # steps that end when the test says so: release()
    wait_for(lambda: marker[mode] in procs(docker_client, d), 30, f"{name}'s quantize step running")
    return job


def test_cubie_drop_and_failure_modes_keep_the_daemon_going(cubie_daemon: Any, det_inputs: dict[str, Any],
                                                            tmp_path: Path) -> None:
    """Failing pegasus jobs end with their codes; the good one beside them succeeds with an A733 bundle."""
    d = cubie_daemon()
    m = det_inputs["manifest"]
    drop(d.inbox, "failimport", named_model(tmp_path, "failimport"), m)
    drop(d.inbox, "fatal65280", named_model(tmp_path, "fatal65280"), m)
    drop(d.inbox, "silent", det_inputs["onnx"], {**m, "qtype": "int16"})
    drop(d.inbox, "good", det_inputs["onnx"], m)
    codes = {n: d.wait_job(n)["error"] for n in ("failimport", "fatal65280", "silent")}
    assert {n: e["code"] for n, e in codes.items()} == {"failimport": "STEP_FAILED", "fatal65280": "EXPORT_FAILED",
                                                       "silent": "QUANTIZE_NO_OUTPUT"}
    assert codes["failimport"]["step"] == "import" and "exited 1" in codes["failimport"]["message"]
    said = codes["failimport"]["message"].split("last lines:\n", 1)[1]  # the compiler's, not the job log's banners
    assert "onnx model import failed: unsupported op" in said and "=====" not in said and "$ " not in said, said
    good = d.wait_job("good")
    assert good["state"] == "succeeded" and good["step_count"] == 11
    assert (d.outbox / good["bundle"]["path"]).is_file()


def calls(docker_client: Any, d: Any, verb: str) -> list[str]:
    """The stand-in pegasus calls of `verb` recorded in the daemon's cubie container (cwd, argv)."""
    name = yaml.safe_load(d.config.read_text())["cubie"]["container"]
    out = container_output(docker_client.containers.get(name), ["cat", "/tmp/standin-calls.log"])
    return [line for line in out.splitlines() if f"pegasus.py {verb}" in line]


def reattached(d: Any, sig: signal.Signals, docker_client: Any, tmp_path: Path, det_inputs: dict[str, Any]) -> None:
    """The daemon ends by `sig` during a quantize and starts again: the job goes on in its first attempt."""
    first = in_quantize(d, docker_client, tmp_path, "job_untilreleased", det_inputs["manifest"])
    d.signal(sig)
    assert d.proc.wait(30) == 0 if sig == signal.SIGTERM else d.proc.wait(10) != 0
    assert STANDIN_QUANTIZE in procs(docker_client, d)  # the step outlived the daemon
    d.start()
    wait_for(lambda: d.events("job.reattached"), 60, "the new daemon re-attached")
    release(docker_client, d)  # the step it follows ends only now
    done = d.wait_state(first["job_id"], ("succeeded", "failed"))
    assert (done["state"], done["attempt"]) == ("succeeded", 1)
    assert len(calls(docker_client, d, "quantize")) == 1 and len(calls(docker_client, d, "import")) == 1
    assert [s["job_id"] for s in d.statuses()] == [first["job_id"]]
    assert [e["job_id"] for e in d.events("job.reattached")] == [first["job_id"]]
    assert not d.events("job.requeued") and (d.outbox / done["bundle"]["path"]).is_file()
    log = (d.outbox / done["log"]).read_text()
    assert log.count("===== [8/11] quantize") == 2 and "re-attached in step quantize" in log
    assert log.count("----- quantize: ok") == 1
    if sig == signal.SIGTERM:  # its step ran on: no failure (it said "failed CANCELLED")
        assert log.count("----- quantize: stopped with the daemon") == 1 and "CANCELLED" not in log
        assert "### stopped: the daemon stops; the step runs on" in log
    steps = [e["step"] for e in d.events("job.step") if e["job_id"] == first["job_id"]]  # both daemons' events
    assert steps == ["validate", "surgery", "calibration", "import", "inputmeta", "postprocess", "patch", "quantize",
                     "export", "bundle", "publish"], steps  # the steps gone through again after it are no new ones
    assert [(e["step"], e["index"]) for e in d.events("job.reattached")] == [("quantize", 8)]


def test_sigkill_mid_step_reattaches_on_restart(cubie_daemon: Any, docker_client: Any, tmp_path: Path,
                                                det_inputs: dict[str, Any]) -> None:
    """kill -9 during quantize: the step runs on; the next start re-attaches, the job succeeds in attempt 1 and
    quantize ran once."""
    reattached(cubie_daemon(), signal.SIGKILL, docker_client, tmp_path, det_inputs)


def test_sigterm_mid_step_leaves_the_step_running_and_reattaches(cubie_daemon: Any, docker_client: Any,
                                                                 tmp_path: Path, det_inputs: dict[str, Any]) -> None:
    """SIGTERM during quantize: STOPPING=1, exit 0, the step goes on in the container; the next start re-attaches
    and the job succeeds in attempt 1 with quantize run once."""
    d = cubie_daemon()
    reattached(d, signal.SIGTERM, docker_client, tmp_path, det_inputs)
    assert "STOPPING=1" in " ".join(d.messages)
    assert [e["job_id"] for e in d.events("job.detached")]


def test_sigterm_on_a_hung_step_exits_in_time_and_leaves_it_running(cubie_daemon: Any, docker_client: Any,
                                                                    tmp_path: Path, det_inputs: dict[str, Any]) -> None:
    """SIGTERM during a hung step: exit 0 within 30 s, the job's row stays running in its first attempt, the step
    runs on in the container (a stop no longer kills it)."""
    d = cubie_daemon()
    job = in_quantize(d, docker_client, tmp_path, "hang", det_inputs["manifest"])
    start = time.monotonic()
    d.signal(signal.SIGTERM)
    assert d.proc.wait(30) == 0
    assert time.monotonic() - start < 30
    doc = d.status(job["job_id"])
    assert doc is not None and (doc["state"], doc["attempt"], doc["step"]) == ("running", 1, "quantize")
    assert "sleep 100000" in procs(docker_client, d)
    d.start()
    wait_for(lambda: d.events("job.reattached"), 30, "the hung step re-attached")
    cli.main(["cancel", job["job_id"], "-c", str(d.config)])
    assert d.wait_state(job["job_id"], ("cancelled",))["attempt"] == 1
    wait_for(lambda: "sleep 100000" not in procs(docker_client, d), 30, "the step killed by the cancel")


def test_a_cancel_made_while_the_daemon_was_down_kills_the_step_it_re_attaches(cubie_daemon: Any, docker_client: Any,
                                                                             tmp_path: Path,
                                                                             det_inputs: dict[str, Any]) -> None:
    """`saigeedged cancel` of a running job while the daemon is stopped: the next start ends it cancelled (attempt 1)
    and kills its step, which the stop left running in the container."""
    d = cubie_daemon()
    job = in_quantize(d, docker_client, tmp_path, "hang", det_inputs["manifest"])
    d.signal(signal.SIGTERM)
    assert d.proc.wait(30) == 0 and "sleep 100000" in procs(docker_client, d)
    assert cli.main(["cancel", job["job_id"], "-c", str(d.config)]) == 0  # the row is running: flagged
    d.start()
    ended = d.wait_state(job["job_id"], ("cancelled",))
    assert ended["attempt"] == 1 and "before its step was re-attached" in ended["error"]["message"], ended["error"]
    wait_for(lambda: "sleep 100000" not in procs(docker_client, d), 30, "the step killed")


def test_container_killed_mid_job_is_recreated_and_retried(cubie_daemon: Any, docker_client: Any, tmp_path: Path,
                                                           det_inputs: dict[str, Any]) -> None:
    """docker kill during a step: CONTAINER_LOST, container recreated, job retried to success."""
    d = cubie_daemon()
    job = in_quantize(d, docker_client, tmp_path, "kill_untilreleased", det_inputs["manifest"])
    name = yaml.safe_load(d.config.read_text())["cubie"]["container"]
    old = docker_client.containers.get(name)
    old.kill()
    wait_for(lambda: d.events("job.requeued") and quantize_runs(docker_client, d), 60, "attempt 2's quantize")
    release(docker_client, d)  # in the new container
    done = d.wait_state(job["job_id"], ("succeeded", "failed"))
    assert done["state"] == "succeeded" and done["attempt"] == 2
    assert docker_client.containers.get(name).id != old.id
    assert [e["error_code"] for e in d.events("job.requeued")] == ["CONTAINER_LOST"]
    assert d.events("container.created")


def test_container_lost_is_bounded_by_max_attempts(cubie_daemon: Any, docker_client: Any, tmp_path: Path,
                                                   det_inputs: dict[str, Any]) -> None:
    """With max_attempts 1 a lost container fails the job with CONTAINER_LOST, whose hint no longer says the job is
    retried (it is not: its attempts ran out) but what to check and `saigeedged retry`."""
    d = cubie_daemon(limits={"max_attempts": 1})
    job = in_quantize(d, docker_client, tmp_path, "lost_untilreleased", det_inputs["manifest"])
    docker_client.containers.get(yaml.safe_load(d.config.read_text())["cubie"]["container"]).kill()
    error = d.wait_state(job["job_id"], ("failed",))["error"]
    assert error["code"] == "CONTAINER_LOST" and "retried" not in error["hint"]
    assert "under every attempt (limits.max_attempts)" in error["hint"] and "saigeedged retry" in error["hint"]


def test_hung_step_times_out(cubie_daemon: Any, docker_client: Any, tmp_path: Path, det_inputs: dict[str, Any]) -> None:
    """A hung step past step_timeout_s ends TIMEOUT with nothing left running; the queue goes on."""
    d = cubie_daemon(limits={"step_timeout_s": 2})
    drop(d.inbox, "hang", named_model(tmp_path, "hang"), det_inputs["manifest"])
    drop(d.inbox, "after", det_inputs["onnx"], det_inputs["manifest"])
    failed = d.wait_job("hang")
    assert failed["error"]["code"] == "TIMEOUT" and failed["error"]["step"] == "quantize"
    assert "sleep 100000" not in procs(docker_client, d)
    assert d.wait_job("after")["state"] == "succeeded"


def test_cancel_running_and_queued(cubie_daemon: Any, docker_client: Any, tmp_path: Path,
                                   det_inputs: dict[str, Any]) -> None:
    """cancel kills a running step (state cancelled) and cancels a queued job before it starts."""
    d = cubie_daemon()
    drop(d.inbox, "hang", named_model(tmp_path, "hang"), det_inputs["manifest"])
    running = d.wait_job("hang", ("running",))
    drop(d.inbox, "waiting", det_inputs["onnx"], det_inputs["manifest"])
    queued = d.wait_job("waiting", ("queued",))
    assert cli.main(["cancel", queued["job_id"], "-c", str(d.config)]) == 0
    assert d.status(queued["job_id"])["state"] == "cancelled"
    d.wait_state(running["job_id"], ("running",), step="quantize")
    assert cli.main(["cancel", running["job_id"], "-c", str(d.config)]) == 0
    done = d.wait_state(running["job_id"], ("cancelled",))
    assert done["error"]["code"] == "CANCELLED"
    assert "sleep 100000" not in procs(docker_client, d)
    assert (d.inbox / ".saigeedged" / "failed" / running["job_id"] / "hang.onnx").is_file()
    assert [e["job_name"] for e in d.events("job.started")] == ["hang"]


def test_a_host_job_runs_beside_a_container_compile(cubie_daemon: Any, docker_client: Any, tmp_path: Path,
                                                    det_inputs: dict[str, Any]) -> None:
    """With one engine, host jobs keep their own slot (SPEC §11): one queued behind a cubie compile runs and succeeds
    while that compile's step still runs (it waited for it, its slot idle), and STATUS= names both; the cubie job
    then goes on."""
    d = cubie_daemon()
    job = in_quantize(d, docker_client, tmp_path, "job_untilreleased", det_inputs["manifest"])
    drop(d.inbox, "onhost", det_inputs["onnx"], {**det_inputs["manifest"], "target": "host"})
    assert d.wait_job("onhost", timeout=120)["state"] == "succeeded"
    assert quantize_runs(docker_client, d) and d.status(job["job_id"])["step"] == "quantize"
    assert any("job_untilreleased quantize" in m and "host: onhost" in m for m in d.messages), d.messages[-5:]
    release(docker_client, d)
    assert d.wait_state(job["job_id"], ("succeeded", "failed"), timeout=120)["state"] == "succeeded"


def test_a_cancel_signals_only_the_pids_of_its_own_step(cubie_daemon: Any, docker_client: Any, tmp_path: Path,
                                                        det_inputs: dict[str, Any]) -> None:
    """The pidfile lies in the folder the step writes: a step that adds other pids to it (a process of the container
    outside the job, and the container's init, which made the kill `kill -- -1`: every process) has its own step
    killed by a cancel and nothing else."""
    d = cubie_daemon()
    drop(d.inbox, "plantpid", named_model(tmp_path, "plantpid"), det_inputs["manifest"])
    job = d.wait_job("plantpid", ("running",))
    d.wait_state(job["job_id"], ("running",), step="quantize")
    ctr = docker_client.containers.get(yaml.safe_load(d.config.read_text())["cubie"]["container"])
    ctr.exec_run(["sleep", "4242"], detach=True)  # another job's step, as far as the kill can tell
    wait_for(lambda: "sleep 100001" in procs(docker_client, d), 30, "the step planted the pids and hangs")
    assert cli.main(["cancel", job["job_id"], "-c", str(d.config)]) == 0
    assert d.wait_state(job["job_id"], ("cancelled",))["error"]["code"] == "CANCELLED"
    running = procs(docker_client, d)
    assert "sleep 100001" not in running  # its own step was killed
    assert "sleep 4242" in running, running  # the planted pid was not
    ctr.reload()
    assert ctr.status == "running"


def regulus_classifier(tmp_path: Path, det_inputs: dict[str, Any]) -> tuple[Path, dict[str, Any]]:
    """A classifier and its manifest for a regulus-rb (mobilint) job."""
    cls = classifier(tmp_path / "cls.onnx", 3, (224, 224))
    # the noise images' INT8 scores tie, so this classifier's mAP drop is noise (tests/test_daemon.py NOISE_MAP)
    return cls, {**det_inputs["manifest"], "task": "mlc", "target": "mobilint", "device": "regulus-rb",
                 "accuracy": {"max_map_drop": 1.0}}


def test_mobilint_and_cubie_share_the_queue(cubie_daemon: Any, tmp_path: Path, det_inputs: dict[str, Any]) -> None:
    """A regulus-rb classifier and a cubie detector dropped together both succeed; a chip name is refused. Their
    host-side work (calibration tensors, reports) runs in children: the daemon maps no numpy, onnx or onnxruntime."""
    from test_daemon import model_libraries

    d = cubie_daemon()
    cls, m = regulus_classifier(tmp_path, det_inputs)
    drop(d.inbox, "tags", cls, m)
    drop(d.inbox, "det", det_inputs["onnx"], det_inputs["manifest"])
    drop(d.inbox, "chip", cls, {**m, "device": "REGULUS"})
    tags, det = d.wait_job("tags"), d.wait_job("det")
    assert tags["state"] == det["state"] == "succeeded"
    assert tags["bundle"]["path"] == "tags.mobilint.saigeedge" and tags["target"] == "mobilint"
    bad = d.wait_job("chip")
    assert bad["error"]["code"] == "MANIFEST_INVALID" and "regulus-rb-usb" in bad["error"]["message"]
    assert tags["progress"] == {"step": "quantize", "stage": "calibration", "done": 4, "total": 4}  # qbcompiler's JSON events
    assert model_libraries(d.proc.pid) == []


def test_a_compiler_output_that_links_to_a_host_file_is_never_published(cubie_daemon: Any, tmp_path: Path,
                                                                         det_inputs: dict[str, Any]) -> None:
    """A step leaves its .mxq as a symbolic link to the daemon's database (a path only the host sees): the job fails
    EXPORT_FAILED naming the link, and neither the outbox nor the cache gets the database; the next job runs."""
    d = cubie_daemon()
    cls, m = regulus_classifier(tmp_path, det_inputs)
    drop(d.inbox, "stolen_qblink", cls, m)
    drop(d.inbox, "det", det_inputs["onnx"], det_inputs["manifest"])
    bad, det = d.wait_job("stolen_qblink"), d.wait_job("det")
    assert bad["state"] == "failed" and bad["error"]["code"] == "EXPORT_FAILED", bad
    assert "stolen_qblink.mxq is a symbolic link to ../../../saigeedged.db" in bad["error"]["message"]
    assert det["state"] == "succeeded"
    assert not list(d.outbox.rglob("stolen_qblink*.saigeedge"))
    assert not [p for p in (d.state_dir / "cache").rglob("*.mxq")]


def test_waiting_for_the_container_lock_ends_on_sigterm(cubie_daemon: Any, det_inputs: dict[str, Any]) -> None:
    """While a one-shot compile holds the container lock the job waits; SIGTERM still stops the daemon and requeues it."""
    from saigeedged.adapters.hostlock import HostLock

    d = cubie_daemon()
    lock = HostLock(d.state_dir, yaml.safe_load(d.config.read_text())["cubie"]["container"])
    lock.acquire()
    try:
        drop(d.inbox, "blocked", det_inputs["onnx"], det_inputs["manifest"])
        job = d.wait_job("blocked", ("running",))
        # (its host steps come first: seconds of children on a loaded machine)
        wait_for(lambda: d.events("container.lock_wait"), 60, "the worker waiting for the lock")
        d.signal(signal.SIGTERM)
        assert d.proc.wait(30) == 0
        doc = d.status(job["job_id"])
        assert doc is not None and doc["state"] == "queued" and doc["step"] is None
    finally:
        lock.release()
    d.start()
    assert d.wait_state(job["job_id"], ("succeeded",))["attempt"] == 2


def test_engine_outage_holds_container_jobs_while_host_jobs_go_on(cubie_daemon: Any, docker_client: Any,
                                                                 tmp_path: Path, det_inputs: dict[str, Any]) -> None:
    """The engine goes away mid-step (dockerd stopped, restarting): the job waits with its attempt unspent and
    DOCKER_UNAVAILABLE as the reason, a host job still runs, and when the engine is back the job re-attaches to the
    step that ran on meanwhile (SPEC §15): nothing is killed, nothing runs twice."""
    proxy = EngineProxy(tmp_path / "engine.sock")
    proxy.up()
    d = cubie_daemon(env={"DOCKER_HOST": proxy.docker_host})
    job = in_quantize(d, docker_client, tmp_path, "hang", det_inputs["manifest"])
    seen = len(d.messages)
    proxy.down()
    held = wait_for(lambda: (s := d.status(job["job_id"])) and s["error"] and s, 30, "the job held")
    assert (held["state"], held["attempt"], held["step"]) == ("running", 1, "quantize")
    assert held["error"]["code"] == "DOCKER_UNAVAILABLE" and "start dockerd" in held["error"]["hint"]
    d.expect("Docker engine unreachable", 10, after=seen)
    drop(d.inbox, "onhost", det_inputs["onnx"], {**det_inputs["manifest"], "target": "host"})
    assert d.wait_job("onhost")["state"] == "succeeded"
    waiting = d.events("job.waiting")
    assert [(e["job_id"], e["error_code"]) for e in waiting] == [(job["job_id"], "DOCKER_UNAVAILABLE")]
    proxy.up()
    wait_for(lambda: d.events("job.reattached"), 30, "the job re-attached")
    assert procs(docker_client, d).count("sleep 100000") == 1  # the same step: it ran on, nothing started again
    assert not d.events("job.requeued") and not d.events("engine.down")  # back within engine_timeout_s: not down
    assert len(calls(docker_client, d, "quantize")) == 1 and d.status(job["job_id"])["attempt"] == 1


def test_a_missing_image_fails_its_job_with_the_image_named_and_the_daemon_goes_on(cubie_daemon: Any,
                                                                                  det_inputs: dict[str, Any]) -> None:
    """One engine without the cubie image: the monitor takes the engine up all the same (no engine has the image),
    so the cubie job fails IMAGE_NOT_FOUND naming the image instead of waiting for ever, and a host job runs."""
    d = cubie_daemon(cubie={"image": "saigeedged-standin/not-loaded:none"})
    drop(d.inbox, "noimage", det_inputs["onnx"], det_inputs["manifest"])
    failed = d.wait_job("noimage")
    assert failed["state"] == "failed" and failed["error"]["code"] == "IMAGE_NOT_FOUND", failed
    assert "saigeedged-standin/not-loaded:none" in failed["error"]["message"] and failed["error"]["hint"]
    missing = d.events("engine.image_missing")
    assert [(e["engine"], e["targets"]) for e in missing] == [("local", "cubie")]
    drop(d.inbox, "onhost", det_inputs["onnx"], {**det_inputs["manifest"], "target": "host"})
    assert d.wait_job("onhost")["state"] == "succeeded"


def test_submit_wait_outlasts_the_claim_wait(cubie_daemon: Any, tmp_path: Path, det_inputs: dict[str, Any],
                                             monkeypatch: Any, capsys: Any) -> None:
    """Without --timeout only the claim is bounded: `submit --wait` waits out a compile longer than that."""
    monkeypatch.setattr(client, "CLAIM_WAIT_S", 8.0)  # the claim itself has seconds to spare on a loaded machine
    d = cubie_daemon()
    mf = manifest(tmp_path / "long_sleep12.yml", **det_inputs["manifest"])
    assert cli.main(["submit", str(named_model(tmp_path, "long_sleep12")), str(mf), "--wait", "-c", str(d.config)]) == 0
    out = capsys.readouterr().out
    doc = d.status(Path(out.splitlines()[0]).stem)
    assert doc is not None and doc["state"] == "succeeded" and "succeeded" in out
    took = datetime.fromisoformat(doc["finished_at"]) - datetime.fromisoformat(doc["created_at"])
    assert took.total_seconds() > 8.0  # it did outlast the claim wait



def test_a_step_longer_than_the_engine_timeout_leaves_the_engine_in_service(cubie_daemon: Any, det_inputs: dict[str, Any],
                                                                            tmp_path: Path) -> None:
    """A running step is not an engine call under way: a quantize of 20 s under `limits.engine_timeout_s: 8` neither
    takes the engine out of service (`engine.slow`; past 5x the timeout the daemon was unhealthy: systemd's watchdog
    killed it); the job succeeds on its first attempt (the real toolkit's steps run for minutes against the default 120 s)."""
    d = cubie_daemon(limits={"engine_timeout_s": 8})  # 8 s: healthy calls of a loaded machine stay under it
    drop(d.inbox, "long_sleep20", named_model(tmp_path, "long_sleep20"), det_inputs["manifest"])
    job = d.wait_job("long_sleep20")
    assert job["state"] == "succeeded" and job["attempt"] == 1, job
    assert not d.events("engine.slow"), d.events("engine.slow")
