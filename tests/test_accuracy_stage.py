"""The accuracy report off the container's path (issue 25): the finishing stage makes a job's report, cubie's simulator
call included, while the next job's container steps run; a stop during the report redoes the report, never the
compile (SPEC §15, §17)."""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

import pytest
import yaml
from engineproxy import EngineProxy
from factory import random_labels, valjson, yolox
from harness import STANDIN_QUANTIZE, STANDIN_RELEASE, container_output, drop, reported_beside, wait_for, wait_for_quantize
from realmodels import yolox_nano
from simrefs import put_references, references

from saigeedged.cli import main as cli
from saigeedged.service.finishing import REPORTS_AT_ONCE, WAITING_MAX

pytestmark = pytest.mark.docker
HOLD_INFERENCE = "/tmp/standin-hold-inference"  # the stand-in's `pegasus inference` runs on while it exists
INFERENCE = "pegasus.py inference"  # among the container's processes while it runs


def _cubie_daemon(daemon: Any, docker_config: Path, **kwargs: Any) -> Any:
    settings = yaml.safe_load(docker_config.read_text())
    return daemon(cubie=settings["cubie"], mobilint=settings["mobilint"], limits=settings["limits"],
                  defaults={"target": "cubie"}, **kwargs)


def test_the_next_job_compiles_while_the_report_is_made(docker_config: Path, daemon: Any, tmp_path: Path) -> None:
    """A cubie job hands its report to the finishing stage after its last container step: the next job starts (and
    runs its container steps) before the first one ends, and both succeed with their reports, published."""
    d = _cubie_daemon(daemon, docker_config)
    calib = valjson(tmp_path / "data", random_labels(40, 3))
    fields = {"task": "detection", "num_classes": 3, "calib": str(calib), "n_samples": 8}
    drop(d.inbox, "first", yolox_nano(tmp_path / "first.onnx", 320), fields)
    first = d.wait_job("first", ("running",))
    drop(d.inbox, "second", yolox_nano(tmp_path / "second.onnx", 320, seed=1), fields)
    reported_beside(d, "emulated")
    assert first["job_id"] in {e["job_id"] for e in d.events("job.finishing")}


def test_a_stop_during_the_report_redoes_only_the_report(docker_config: Path, daemon: Any, docker_client: Any,
                                                         tmp_path: Path) -> None:
    """SIGTERM while a cubie job makes its accuracy report (step bundle, a 320 detector): the daemon exits 0, the next
    start re-attaches the job, which makes its report again and succeeds in attempt 1; import, quantize and export
    ran once in the container."""
    settings = yaml.safe_load(docker_config.read_text())
    d = _cubie_daemon(daemon, docker_config)
    calib = valjson(tmp_path / "data", random_labels(40, 3))
    drop(d.inbox, "det", yolox_nano(tmp_path / "det.onnx", 320),
         {"task": "detection", "num_classes": 3, "calib": str(calib), "n_samples": 8})
    job = d.wait_job("det", ("running",))
    d.wait_state(job["job_id"], ("running",), step="bundle", timeout=120)
    d.signal(signal.SIGTERM)
    assert d.proc.wait(30) == 0
    assert d.status(job["job_id"])["state"] == "running"  # left to the next start, its attempt open
    d.start()
    done = d.wait_state(job["job_id"], ("succeeded", "failed"), timeout=180)
    assert (done["state"], done["attempt"]) == ("succeeded", 1), done
    assert done["accuracy"]["method"] == "emulated" and done["accuracy"]["images"] == 16
    ctr = docker_client.containers.get(settings["cubie"]["container"])
    record = container_output(ctr, ["cat", "/tmp/standin-calls.log"]).splitlines()
    for verb in ("import", "quantize", "export"):
        assert len([c for c in record if f"pegasus.py {verb} " in c]) == 1, (verb, record)
    log = (d.outbox / done["log"]).read_text()
    assert "re-attached in step bundle" in log and log.count("accuracy (emulated, 16 held-out images)") == 1


SWEEP = [{"calibration_method": "minmax"}, {"calibration_method": "kl"}]


def _fields(tmp_path: Path, **extra: Any) -> dict[str, Any]:
    """A detector's manifest fields on 40 images, 8 calibrated: the rest are held out for the report."""
    return {"task": "detection", "num_classes": 3, "calib": str(valjson(tmp_path / "data", random_labels(40, 3))),
            "n_samples": 8, **extra}


def _calls(ctr: Any) -> set[str]:
    """The output folders of the simulator calls running in the container (each shows as several processes)."""
    return {line.split("--output-dir ")[1].split()[0] for line in container_output(ctr, ["ps", "-o", "args"]).splitlines()
            if INFERENCE in line and "--output-dir " in line}


def _held_simulator(d: Any, docker_client: Any, settings: dict[str, Any], tmp_path: Path,
                    fields: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    """A cubie job `first` whose simulator call is running, held in the container (its quantize is held until the hold
    is in place, so the call cannot come first): the container and the job's status."""
    drop(d.inbox, "first_untilreleased", yolox_nano(tmp_path / "first_untilreleased.onnx", 320), fields)
    job = d.wait_job("first_untilreleased", ("running",))
    d.wait_state(job["job_id"], ("running",), step="quantize", timeout=120)
    ctr = docker_client.containers.get(settings["cubie"]["container"])
    wait_for_quantize(ctr)
    ctr.exec_run(["touch", HOLD_INFERENCE])
    ctr.exec_run(["touch", STANDIN_RELEASE])
    wait_for(lambda: INFERENCE in container_output(ctr, ["ps", "-o", "args"]), 120, "the first job's simulator call")
    return ctr, job


def test_the_simulator_call_runs_beside_the_next_jobs_steps(docker_config: Path, daemon: Any, docker_client: Any,
                                                             tmp_path: Path) -> None:
    """A cubie job's `pegasus inference` over its held-out images runs in the container beside the next job: while it
    is held there, the next job runs its import, quantize and export and is handed over for its own report; once it
    ends, both succeed, each with one simulator call (answered without reference tensors: the reports say so and are
    emulated)."""
    settings = yaml.safe_load(docker_config.read_text())
    d = _cubie_daemon(daemon, docker_config)
    fields = _fields(tmp_path)
    ctr, first = _held_simulator(d, docker_client, settings, tmp_path, fields)
    drop(d.inbox, "second", yolox_nano(tmp_path / "second.onnx", 320, seed=1), fields)
    wait_for(lambda: [e for e in d.events("job.finishing") if e["job_name"] == "second"], 120,
             "the second job's container steps, with the first job's simulator call held")
    assert d.status(first["job_id"])["state"] == "running"  # its simulator call still held
    ctr.exec_run(["rm", "-f", HOLD_INFERENCE])
    done = [d.wait_job(name, timeout=180) for name in ("first_untilreleased", "second")]
    assert [j["state"] for j in done] == ["succeeded", "succeeded"], done
    record = container_output(ctr, ["cat", "/tmp/standin-calls.log"]).splitlines()
    for job in done:
        assert job["accuracy"]["method"] == "emulated"
        assert any("`pegasus inference` exited 1" in note for note in job["accuracy"]["notes"]), job["accuracy"]
    assert len([c for c in record if INFERENCE in c]) == 2, record


def test_a_sweeps_reports_run_beside_the_next_jobs_steps(docker_config: Path, daemon: Any, docker_client: Any,
                                                        tmp_path: Path) -> None:
    """A cubie sweep is handed over after its last variant's export, before any variant's report: while its first
    variant's simulator call is held, the next job runs its container steps and is handed over too; then the sweep
    succeeds with both variants in its table (their reports were made in its slot, the container idle meanwhile)."""
    settings = yaml.safe_load(docker_config.read_text())
    d = _cubie_daemon(daemon, docker_config)
    fields = _fields(tmp_path)
    ctr, first = _held_simulator(d, docker_client, settings, tmp_path, {**fields, "variants": SWEEP})
    drop(d.inbox, "second", yolox_nano(tmp_path / "second.onnx", 320, seed=1), fields)
    wait_for(lambda: [e for e in d.events("job.finishing") if e["job_name"] == "second"], 120,
             "the second job's container steps, with the sweep's first simulator call held")
    assert d.status(first["job_id"])["state"] == "running"
    ctr.exec_run(["rm", "-f", HOLD_INFERENCE])
    done = [d.wait_job(name, timeout=180) for name in ("first_untilreleased", "second")]
    assert [j["state"] for j in done] == ["succeeded", "succeeded"], done
    assert [r["variant"] for r in done[0]["accuracy"]["variants"]] == [1, 2], done[0]["accuracy"]
    record = container_output(ctr, ["cat", "/tmp/standin-calls.log"]).splitlines()
    assert len([c for c in record if INFERENCE in c]) == 3, record  # one for each variant, one for the second job


def test_a_stop_during_a_sweeps_reports_redoes_only_the_reports(docker_config: Path, daemon: Any, docker_client: Any,
                                                               tmp_path: Path) -> None:
    """SIGTERM while a cubie sweep's variant reports are made (handed over after both variants' exports): the next start
    re-attaches it, replays both variants' ended steps and makes their reports again; the job succeeds in attempt 1
    with both variants in its table, and each variant's import, quantize and export ran once in the container."""
    settings = yaml.safe_load(docker_config.read_text())
    d = _cubie_daemon(daemon, docker_config)
    ctr, first = _held_simulator(d, docker_client, settings, tmp_path, _fields(tmp_path, variants=SWEEP))
    assert first["job_id"] in {e["job_id"] for e in d.events("job.finishing")}  # handed over before any report
    d.signal(signal.SIGTERM)
    assert d.proc.wait(30) == 0
    ctr.exec_run(["rm", "-f", HOLD_INFERENCE])
    d.start()
    done = d.wait_state(first["job_id"], ("succeeded", "failed"), timeout=180)
    assert (done["state"], done["attempt"]) == ("succeeded", 1), done
    assert [r["variant"] for r in done["accuracy"]["variants"]] == [1, 2], done["accuracy"]
    record = container_output(ctr, ["cat", "/tmp/standin-calls.log"]).splitlines()
    for verb in ("import", "quantize", "export"):
        assert len([c for c in record if f"pegasus.py {verb} " in c]) == 2, (verb, record)


def test_host_jobs_waiting_for_a_report_are_bounded_cancelled_at_once_and_requeued_at_a_stop(
        docker_config: Path, daemon: Any, docker_client: Any, tmp_path: Path) -> None:
    """Host jobs are handed to the finishing stage too (the next compile never waits for a report). While the
    finishers make other jobs' reports (two cubie simulator calls, held), host jobs wait there, at most WAITING_MAX
    jobs in all: the next one makes its report in its worker and succeeds. A cancel of a waiting one ends it at once.
    SIGTERM sends the other waiting host jobs back to the queue as a stop (nothing of theirs runs on; left running they
    counted as crashes at the next start), the cubie jobs stay running, detached. After the restart all succeed: the
    cubie jobs in attempt 1, the host jobs compiled again."""
    settings = yaml.safe_load(docker_config.read_text())
    d = _cubie_daemon(daemon, docker_config)
    fields = _fields(tmp_path)
    ctr, first = _held_simulator(d, docker_client, settings, tmp_path, fields)
    drop(d.inbox, "second", yolox(tmp_path / "second.onnx", size=(64, 64)), fields)
    wait_for(lambda: "second" in {e["job_name"] for e in d.events("job.finishing")}, 120, "the second job handed over")
    busy = min(2, REPORTS_AT_ONCE)  # the finishers, each on a held call; the cubie job no finisher took waits
    wait_for(lambda: len(_calls(ctr)) == busy, 60, "the held calls", lambda: container_output(ctr, ["ps", "-o", "args"]))
    hosts = [f"host{i}" for i in range(WAITING_MAX - (2 - busy) + 1)]
    for name in hosts:
        drop(d.inbox, name, yolox(tmp_path / f"{name}.onnx", size=(64, 64)), {**fields, "target": "host"})
        d.wait_job(name, ("running", "succeeded"), timeout=120)  # taken one after the other, in order
    last = d.wait_job(hosts[-1], timeout=120)  # the stage is full: its report made by its worker
    assert last["state"] == "succeeded" and last["accuracy"]["method"] == "int8", last
    handed = {e["job_name"] for e in d.events("job.finishing")}
    assert set(hosts[:-1]) <= handed and hosts[-1] not in handed, handed
    waiting = [d.wait_job(name, ("running",)) for name in hosts[:-1]]
    assert cli.main(["cancel", waiting[0]["job_id"], "-c", str(d.config)]) == 0
    assert d.wait_state(waiting[0]["job_id"], ("cancelled", "succeeded", "failed"), timeout=30)["state"] == "cancelled"
    d.signal(signal.SIGTERM)
    assert d.proc.wait(30) == 0
    assert [d.status(j["job_id"])["state"] for j in waiting[1:]] == ["queued"] * len(waiting[1:])
    ended = [d.status(j["job_id"])["attempts"][-1] for j in waiting[1:]]  # a stop, not a cancel (they said CANCELLED)
    assert all(a["stopped"] is True and a["error"] is None and a["finished_at"] for a in ended), ended
    assert d.status(first["job_id"])["state"] == "running"
    d.start()
    ctr.exec_run(["rm", "-f", HOLD_INFERENCE])
    done = {name: d.wait_job(name, timeout=180) for name in ("first_untilreleased", "second", *hosts[1:-1])}
    assert {n: (j["state"], j["attempt"]) for n, j in done.items()} == {
        "first_untilreleased": ("succeeded", 1), "second": ("succeeded", 1),
        **{n: ("succeeded", 2) for n in hosts[1:-1]}}, done


def test_a_stop_during_the_simulator_call_follows_the_same_call_after_the_restart(
        docker_config: Path, daemon: Any, docker_client: Any, tmp_path: Path) -> None:
    """SIGTERM while a job's simulator call runs in the finishing stage: the daemon exits 0 leaving it running, the
    next start re-attaches the job and follows that same call (the stand-in records one) to its end; the job succeeds
    in attempt 1 with its compile run once and the simulator's report. The replay takes the compile from the cache
    (kept before the stop), so the call's step number is its own (it followed the import's record, exit 0, and read an
    empty folder), and its output folder is left as the call made it (it was removed and made again under the
    running call, which then wrote nothing there)."""
    settings = yaml.safe_load(docker_config.read_text())
    d = _cubie_daemon(daemon, docker_config)
    fields = _fields(tmp_path)
    ctr, job = _held_simulator(d, docker_client, settings, tmp_path, fields)
    put_references(ctr, references(tmp_path / "first_untilreleased.onnx", tmp_path / "data" / "images", 320))
    d.signal(signal.SIGTERM)
    assert d.proc.wait(30) == 0
    assert d.status(job["job_id"])["state"] == "running"
    assert INFERENCE in container_output(ctr, ["ps", "-o", "args"])  # left running, its attempt's
    d.start()
    wait_for(lambda: len([e for e in d.events("job.finishing") if e["job_id"] == job["job_id"]]) == 2, 120,
             "the re-attached job handed over again")
    assert INFERENCE in container_output(ctr, ["ps", "-o", "args"])  # still held: followed, not read after its end
    ctr.exec_run(["rm", "-f", HOLD_INFERENCE])
    done = d.wait_state(job["job_id"], ("succeeded", "failed"), timeout=180)
    assert (done["state"], done["attempt"]) == ("succeeded", 1), done
    assert done["accuracy"]["method"] == "simulator", done["accuracy"]["notes"]
    record = container_output(ctr, ["cat", "/tmp/standin-calls.log"]).splitlines()
    for verb in ("import", "quantize", "export", "inference"):
        assert len([c for c in record if f"pegasus.py {verb} " in c]) == 1, (verb, record)


def test_a_cancel_during_the_simulator_call_kills_it(docker_config: Path, daemon: Any, docker_client: Any,
                                                      tmp_path: Path) -> None:
    """`saigeedged cancel` of a job whose simulator call runs in the finishing stage: the call is killed in the
    container and the job ends cancelled."""
    settings = yaml.safe_load(docker_config.read_text())
    d = _cubie_daemon(daemon, docker_config)
    fields = _fields(tmp_path)
    ctr, job = _held_simulator(d, docker_client, settings, tmp_path, fields)
    assert cli.main(["cancel", job["job_id"], "-c", str(d.config)]) == 0
    done = d.wait_state(job["job_id"], ("cancelled", "failed", "succeeded"), timeout=60)
    assert done["state"] == "cancelled", done
    wait_for(lambda: INFERENCE not in container_output(ctr, ["ps", "-o", "args"]), 30, "the simulator call killed")


def test_a_simulator_call_whose_container_dies_leaves_the_report_emulated(docker_config: Path, daemon: Any,
                                                                          docker_client: Any, tmp_path: Path) -> None:
    """The container is removed under a job's simulator call in the finishing stage: the compile is done, so the job
    is not compiled again; its report is emulated and says why, and it succeeds in attempt 1."""
    settings = yaml.safe_load(docker_config.read_text())
    d = _cubie_daemon(daemon, docker_config)
    fields = _fields(tmp_path)
    ctr, job = _held_simulator(d, docker_client, settings, tmp_path, fields)
    ctr.remove(force=True)
    done = d.wait_state(job["job_id"], ("succeeded", "failed"), timeout=180)
    assert (done["state"], done["attempt"]) == ("succeeded", 1), done
    assert done["accuracy"]["method"] == "emulated"
    assert any("`pegasus inference` did not answer (CONTAINER_LOST" in n for n in done["accuracy"]["notes"]), done


def test_an_engine_outage_during_the_simulator_call_holds_the_job_for_its_slot(docker_config: Path, daemon: Any,
                                                                                docker_client: Any,
                                                                                tmp_path: Path) -> None:
    """The engine stops answering while a job's simulator call runs in the finishing stage: the call may run on, so
    the job is held (not given an emulated report) and goes back to its slot's worker, which re-attaches it once the
    engine answers and hands it over again; the same call is followed to its end and the report is the simulator's,
    in attempt 1."""
    proxy = EngineProxy(tmp_path / "engine.sock")
    proxy.up()
    settings = yaml.safe_load(docker_config.read_text())
    d = _cubie_daemon(daemon, docker_config, env={"DOCKER_HOST": proxy.docker_host})
    fields = _fields(tmp_path)
    ctr, job = _held_simulator(d, docker_client, settings, tmp_path, fields)
    put_references(ctr, references(tmp_path / "first_untilreleased.onnx", tmp_path / "data" / "images", 320))
    proxy.down()
    waiting = wait_for(lambda: [e for e in d.events("job.waiting") if e["job_id"] == job["job_id"]], 60,
                       "the job held for its engine")
    assert waiting[0]["error_code"] == "DOCKER_UNAVAILABLE"
    proxy.up()
    wait_for(lambda: len([e for e in d.events("job.finishing") if e["job_id"] == job["job_id"]]) == 2, 120,
             "the job re-attached by its slot's worker and handed over again")
    ctr.exec_run(["rm", "-f", HOLD_INFERENCE])
    done = d.wait_state(job["job_id"], ("succeeded", "failed"), timeout=180)
    assert (done["state"], done["attempt"]) == ("succeeded", 1), done
    assert done["accuracy"]["method"] == "simulator", done["accuracy"]["notes"]
    record = container_output(ctr, ["cat", "/tmp/standin-calls.log"]).splitlines()
    assert len([c for c in record if INFERENCE in c]) == 1, record


def test_a_variant_sweep_runs_each_variants_steps_in_its_own_folder(docker_config: Path, daemon: Any,
                                                                    docker_client: Any, tmp_path: Path) -> None:
    """A cubie job with two variants through the daemon: each variant numbers its steps from 1 in its own folder, and
    the attempt's record keeps them apart, so the second variant's import runs rather than following the first's
    exec; both are compiled and evaluated and the job succeeds in attempt 1."""
    settings = yaml.safe_load(docker_config.read_text())
    d = _cubie_daemon(daemon, docker_config)
    fields = _fields(tmp_path, variants=SWEEP)
    drop(d.inbox, "det", yolox_nano(tmp_path / "det.onnx", 320), fields)
    done = d.wait_job("det", timeout=300)
    assert (done["state"], done["attempt"]) == ("succeeded", 1), done
    assert [r["variant"] for r in done["accuracy"]["variants"]] == [1, 2], done["accuracy"]
    ctr = docker_client.containers.get(settings["cubie"]["container"])
    record = container_output(ctr, ["cat", "/tmp/standin-calls.log"]).splitlines()
    assert len([c for c in record if "pegasus.py import " in c]) == 2, record


def test_a_cancel_kills_the_running_step_of_a_variant(docker_config: Path, daemon: Any, docker_client: Any,
                                                      tmp_path: Path) -> None:
    """`saigeedged cancel` of a sweep whose first variant's quantize runs (in the variant's own folder): the step is
    killed in the container and the job ends cancelled, not once the step ends by itself."""
    settings = yaml.safe_load(docker_config.read_text())
    d = _cubie_daemon(daemon, docker_config)
    fields = _fields(tmp_path, variants=SWEEP)
    drop(d.inbox, "sweep_untilreleased", yolox_nano(tmp_path / "sweep_untilreleased.onnx", 320), fields)
    job = d.wait_job("sweep_untilreleased", ("running",))
    d.wait_state(job["job_id"], ("running",), step="quantize", timeout=120)
    ctr = docker_client.containers.get(settings["cubie"]["container"])
    wait_for_quantize(ctr)
    assert cli.main(["cancel", job["job_id"], "-c", str(d.config)]) == 0
    done = d.wait_state(job["job_id"], ("cancelled", "failed", "succeeded"), timeout=60)
    assert done["state"] == "cancelled", done
    wait_for(lambda: STANDIN_QUANTIZE not in container_output(ctr, ["ps", "-o", "args"]), 30,
             "the variant's quantize killed")
