"""Faults against a real Docker engine (issue 8): a hung engine, cancels between steps, kills, shared containers."""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import write_config
from engineproxy import EngineProxy
from harness import drop, wait_for
from test_daemon_docker import cubie_daemon, in_quantize, procs, release  # noqa: F401 (cubie_daemon is a fixture)

from saigeedged import config as configmod
from saigeedged.adapters.docker import Containers
from saigeedged.cli import main as cli
from saigeedged.errors import SaigeError

pytestmark = pytest.mark.docker


def test_an_engine_that_does_not_answer_holds_jobs_and_keeps_the_worker(cubie_daemon: Any,  # noqa: F811
                                                                        det_inputs: dict[str, Any],
                                                                        tmp_path: Path) -> None:
    """An engine that takes connections but never answers (ReadTimeout, not a refused socket): past
    limits.engine_timeout_s the monitor marks it down (one engine.down), the cubie job waits in the queue with its
    attempt unspent, a host job still runs (the pings that time out do not hold up the worker), and once the engine
    answers (engine.up) the job succeeds on its first attempt."""
    proxy = EngineProxy(tmp_path / "engine.sock")
    proxy.up()
    # 8 s, not less: a busy engine on a loaded machine (image builds beside the suite) can take seconds over a healthy
    # call or ping, which was a second engine.down/engine.up before the hang
    d = cubie_daemon(env={"DOCKER_HOST": proxy.docker_host}, limits={"engine_timeout_s": 8.0})
    drop(d.inbox, "first", det_inputs["onnx"], det_inputs["manifest"])
    assert d.wait_job("first")["state"] == "succeeded"  # the daemon's engine client exists
    proxy.hang()
    down = wait_for(lambda: d.events("engine.down"), 30, "the engine marked down")
    assert down[0]["engine"] == "local" and down[0]["error_code"] == "DOCKER_UNAVAILABLE"
    assert "does not answer (" in down[0]["message"] and "timed out" in down[0]["message"], down[0]  # and why
    # dropped once it is down (dropped before, a loaded machine may claim and start it while the pings still wait)
    drop(d.inbox, "busy", det_inputs["onnx"], det_inputs["manifest"])
    job = d.wait_job("busy", ("queued",))
    d.expect("Docker engine unreachable", 10)
    drop(d.inbox, "onhost", det_inputs["onnx"], {**det_inputs["manifest"], "target": "host"})
    assert d.wait_job("onhost")["state"] == "succeeded"  # the worker thread outlived the pings that timed out
    assert d.status(job["job_id"])["state"] == "queued"  # passed over, ahead of the host job: nothing can compile it
    proxy.resume()
    done = d.wait_state(job["job_id"], ("succeeded", "failed"), timeout=90)
    assert (done["state"], done["attempt"]) == ("succeeded", 1)
    assert len(d.events("engine.down")) == 1 and len(d.events("engine.up")) == 1
    assert not d.events("job.internal_error")


def test_cancel_on_a_hung_engine_does_not_block_the_main_loop(cubie_daemon: Any, docker_client: Any,  # noqa: F811
                                                              det_inputs: dict[str, Any], tmp_path: Path) -> None:
    """`saigeedged cancel` while the engine hangs: the kill waits for the engine in its own thread, drops are
    still claimed meanwhile, and the job ends cancelled once the engine answers."""
    proxy = EngineProxy(tmp_path / "engine.sock")
    proxy.up()
    d = cubie_daemon(env={"DOCKER_HOST": proxy.docker_host}, limits={"engine_timeout_s": 120.0})
    job = in_quantize(d, docker_client, tmp_path, "hang", det_inputs["manifest"])
    proxy.hang()
    assert cli.main(["cancel", job["job_id"], "-c", str(d.config)]) == 0
    wait_for(lambda: d.status(job["job_id"]) is not None, 5, "")  # the request is in the database
    drop(d.inbox, "meanwhile", det_inputs["onnx"], {**det_inputs["manifest"], "target": "host"})
    wait_for(lambda: [e for e in d.events("drop.claimed") if e["job_name"] == "meanwhile"], 30,
             "the drop claimed while the engine hangs")
    proxy.resume()
    assert d.wait_state(job["job_id"], ("cancelled",), timeout=60)["error"]["code"] == "CANCELLED"
    assert d.wait_job("meanwhile")["state"] == "succeeded"
    wait_for(lambda: "sleep 100000" not in procs(docker_client, d), 10, "the step killed")


def test_a_stop_that_lands_between_steps_is_not_erased_by_the_next_one(docker_config: Path, tmp_path: Path) -> None:
    """A cancel that arrives while no step runs (between two steps) stops the job's next step before it starts: the
    worker's reason raises before the launch, and a step launched in the race (the reason not seen yet) never runs,
    the stop file keeping the wrapper from starting it."""
    config = configmod.load(docker_config)
    container = Containers(config).container("cubie")
    workdir = config.work_root / "between"
    workdir.mkdir(parents=True)
    container.ensure()
    container.interrupt(workdir, "cancel")
    step = ["sh", "-c", "touch ran; sleep 30"]
    assert container.run_step(step, workdir, 60, lambda chunk: None) == 143  # launched in the race: never ran
    container.interrupted = lambda: "cancel"  # what the worker's interrupt("cancel") set before the kill
    with pytest.raises(SaigeError) as stopped:
        container.run_step(step, workdir, 60, lambda chunk: None)
    assert stopped.value.code == "CANCELLED" and stopped.value.fields["reason"] == "cancel"
    assert not (workdir / "ran").exists()


def test_the_reap_of_a_sweep_given_up_kills_its_variants_step(cubie_daemon: Any, docker_client: Any,  # noqa: F811
                                                                tmp_path: Path, det_inputs: dict[str, Any]) -> None:
    """The daemon SIGKILLed while a sweep's first variant quantizes (its step and pidfile in work/.../variant1/), at
    max_attempts 1: the next start ends the job failed and the engine monitor's reap kills that step, not only the
    attempt folder's, and removes the folder."""
    d = cubie_daemon(limits={"max_attempts": 1})
    sweep = [{"calibration_method": "minmax"}, {"calibration_method": "kl"}]
    job = in_quantize(d, docker_client, tmp_path, "sweephang", {**det_inputs["manifest"], "variants": sweep})
    d.kill()
    d.start()
    assert d.wait_state(job["job_id"], ("failed",))["error"]["code"] == "INTERNAL"
    wait_for(lambda: "sleep 100000" not in procs(docker_client, d), 30, "the variant's step reaped")
    wait_for(lambda: not (d.state_dir / "work" / job["job_id"]).exists(), 10, "the reaped attempt's folder removed")


def test_a_job_the_daemon_keeps_dying_under_ends_failed_at_max_attempts(cubie_daemon: Any,  # noqa: F811
                                                                        docker_client: Any, tmp_path: Path,
                                                                        det_inputs: dict[str, Any]) -> None:
    """The daemon SIGKILLed mid-step again and again (as the OOM killer would): the first time the step is
    re-attached (it belongs to its attempt), the second time (max_attempts 2) the job ends failed with a clear message
    instead of running forever, its step is killed, and the job behind it runs."""
    d = cubie_daemon(limits={"max_attempts": 2})
    job = in_quantize(d, docker_client, tmp_path, "hangkill", det_inputs["manifest"])
    drop(d.inbox, "behind", det_inputs["onnx"], det_inputs["manifest"])  # a cubie job: queued behind it
    wait_for(lambda: any(e["job_name"] == "behind" for e in d.events("drop.claimed")), 30, "the second drop claimed")
    d.kill()
    d.start()
    wait_for(lambda: d.events("job.reattached"), 60, "the step re-attached")
    assert procs(docker_client, d).count("sleep 100000") == 1
    d.kill()
    d.start()
    failed = d.wait_state(job["job_id"], ("failed",))
    assert failed["attempt"] == 1 and failed["error"]["code"] == "INTERNAL"
    assert "stopped during this job 2 times" in failed["error"]["message"] and "max_attempts" in failed["error"]["hint"]
    assert [(a["error"], bool(a["finished_at"])) for a in failed["attempts"]] == [("INTERNAL", True)]  # not "since"
    assert d.wait_job("behind")["state"] == "succeeded"
    wait_for(lambda: "sleep 100000" not in procs(docker_client, d), 10, "the leftover step reaped")
    # no work folder left behind by the kills (removed by the monitor right after its reap killed the step)
    wait_for(lambda: not (d.state_dir / "work" / job["job_id"]).exists(), 10, "the reaped attempt's folder removed")


def died_at_the_limit_on_a_hung_engine(cubie_daemon: Any, docker_client: Any, tmp_path: Path,  # noqa: F811
                                       det_inputs: dict[str, Any]) -> tuple[Any, EngineProxy, dict[str, Any]]:
    """A daemon killed mid-step at limits.max_attempts 1, started again while its only engine hangs; returns once
    the job ended failed (daemon, engine proxy, final status)."""
    proxy = EngineProxy(tmp_path / "engine.sock")
    proxy.up()
    d = cubie_daemon(env={"DOCKER_HOST": proxy.docker_host}, limits={"max_attempts": 1})
    job = in_quantize(d, docker_client, tmp_path, "hangstart", det_inputs["manifest"])
    d.kill()
    proxy.hang()
    d.start()  # within the harness's ready timeout (30 s), far below engine_timeout_s (120 s): nothing waited on it
    return d, proxy, d.wait_state(job["job_id"], ("failed",))


def test_start_up_on_a_hung_engine_is_ready_at_once_and_reaps_when_it_answers(cubie_daemon: Any,  # noqa: F811
                                                                              docker_client: Any, tmp_path: Path,
                                                                              det_inputs: dict[str, Any]) -> None:
    """A daemon killed mid-step at limits.max_attempts, restarted while its only engine hangs: READY=1 comes at once
    (no Docker call before it), the job ends failed INTERNAL, a host job runs; its step and work folder are kept
    until the engine answers, then the monitor kills the step and removes the folder."""
    d, proxy, failed = died_at_the_limit_on_a_hung_engine(cubie_daemon, docker_client, tmp_path, det_inputs)
    job = failed
    assert failed["error"]["code"] == "INTERNAL" and "stopped during this job 1 time" in failed["error"]["message"]
    drop(d.inbox, "onhost", det_inputs["onnx"], {**det_inputs["manifest"], "target": "host"})
    assert d.wait_job("onhost")["state"] == "succeeded"
    work = d.state_dir / "work" / job["job_id"]
    assert "sleep 100000" in procs(docker_client, d) and (work / "attempt1" / ".step.pid").is_file()  # still to reap
    proxy.resume()
    wait_for(lambda: "sleep 100000" not in procs(docker_client, d), 30, "the step killed once the engine answers")
    wait_for(lambda: not work.exists(), 10, "its work folder removed")


def test_two_daemons_with_one_container_name_do_not_remove_each_others(docker_config: Path, tmp_path: Path,
                                                                        docker_client: Any) -> None:
    """A second daemon (another state_dir) configured with the same container name refuses with CONTAINER_FAILED
    naming the owner, and the first daemon's container is left running."""
    first = configmod.load(docker_config)
    settings = yaml.safe_load(docker_config.read_text())
    (tmp_path / "other").mkdir()
    other = write_config(tmp_path / "other", cubie=settings["cubie"])
    ours = Containers(first).container("cubie")
    ours.ensure()
    name = settings["cubie"]["container"]
    before = docker_client.containers.get(name).id
    with pytest.raises(SaigeError) as refused:
        Containers(configmod.load(other)).container("cubie").ensure()
    assert refused.value.code == "CONTAINER_FAILED" and str(first.state_dir) in refused.value.message
    assert "own container name" in refused.value.hint
    ctr = docker_client.containers.get(name)
    assert (ctr.id, ctr.status) == (before, "running")


def test_a_container_the_engine_cannot_start_is_made_afresh(docker_config: Path, docker_client: Any) -> None:
    """Our stopped container whose network is gone (an engine restart can leave that): ensure() makes a new one
    and starts it instead of failing the job CONTAINER_FAILED for good."""
    container = Containers(configmod.load(docker_config)).container("cubie")
    old = container.ensure()
    network = docker_client.networks.create(f"{container.spec.name}-net")
    network.connect(old)
    old.stop(timeout=1)
    network.remove()
    new = container.ensure()
    assert new.id != old.id and docker_client.containers.get(container.spec.name).status == "running"


def test_sigterm_on_a_hung_engine_exits_in_time_and_the_job_runs_again(cubie_daemon: Any,  # noqa: F811
                                                                       docker_client: Any, tmp_path: Path,
                                                                       det_inputs: dict[str, Any]) -> None:
    """SIGTERM while the engine hangs mid-step: the daemon exits 0 within 30 s leaving the job's row running and
    its step running in the container; at the next start the job re-attaches and succeeds in its first attempt."""
    proxy = EngineProxy(tmp_path / "engine.sock")
    proxy.up()
    d = cubie_daemon(env={"DOCKER_HOST": proxy.docker_host})
    job = in_quantize(d, docker_client, tmp_path, "term_untilreleased", det_inputs["manifest"])
    proxy.hang()
    d.signal(signal.SIGTERM)
    assert d.proc.wait(30) == 0
    assert d.status(job["job_id"])["state"] == "running"
    proxy.resume()
    d.start()
    wait_for(lambda: d.events("job.reattached"), 60, "the new daemon re-attached")
    release(docker_client, d)
    done = d.wait_state(job["job_id"], ("succeeded", "failed"), timeout=90)
    assert (done["state"], done["attempt"]) == ("succeeded", 1) and d.events("job.reattached")


def test_a_frozen_engine_holds_the_job_which_reattaches_when_it_answers(cubie_daemon: Any,  # noqa: F811
                                                                       docker_client: Any, tmp_path: Path,
                                                                       det_inputs: dict[str, Any], capsys: Any) -> None:
    """The only engine stops answering mid-step for longer than limits.engine_timeout_s (a hung dockerd): the job
    waits running with DOCKER_UNAVAILABLE and its first attempt, the monitor marks the engine down (STATUS= and
    `status` say so) while the watchdog pings go on; once the engine answers the job re-attaches to the step that
    ran on and succeeds, the step run once."""
    from test_daemon_docker import calls

    proxy = EngineProxy(tmp_path / "engine.sock")
    proxy.up()
    d = cubie_daemon(env={"DOCKER_HOST": proxy.docker_host, "WATCHDOG_USEC": "2000000"},
                     limits={"engine_timeout_s": 8.0})  # (8 s: see the test above)
    job = in_quantize(d, docker_client, tmp_path, "frozen_untilreleased", det_inputs["manifest"])
    seen = len(d.messages)
    proxy.hang()
    held = wait_for(lambda: (s := d.status(job["job_id"])) and s["error"] and s, 30, "the job held")
    assert (held["state"], held["attempt"], held["error"]["code"]) == ("running", 1, "DOCKER_UNAVAILABLE")
    line = d.expect("Docker engine unreachable", 10, after=seen)
    assert "compiling frozen_untilreleased (quantize" in line, line  # its step runs on: the slot is not idle
    seen = len(d.messages)
    d.expect("WATCHDOG=1", 10, after=seen)  # the main loop stays healthy while the engine hangs
    wait_for(lambda: d.events("engine.down"), 30, "the engine marked down")
    capsys.readouterr()
    assert cli.main(["status", "-c", str(d.config)]) == 0
    (local,) = [line for line in capsys.readouterr().out.splitlines() if line.startswith("local ")]
    assert local.split()[1] == "down" and "does not answer" in local, local
    proxy.resume()
    release(docker_client, d)
    done = d.wait_state(job["job_id"], ("succeeded", "failed"), timeout=90)
    assert (done["state"], done["attempt"], done["error"]) == ("succeeded", 1, None), done
    # one attempt, held open (a second one was seen once in CI, not reproduced: the journal events say which path)
    assert [(a["engine"], a["error"]) for a in done["attempts"]] == [("local", None)], \
        [{k: e.get(k) for k in ("timestamp", "event", "error_code", "message")} for e in d.events() if "job_id" in e]
    assert [e["job_id"] for e in d.events("job.reattached")] == [job["job_id"]]
    assert len(calls(docker_client, d, "quantize")) == 1
    assert [e["engine"] for e in d.events("engine.up")] == ["local"]
