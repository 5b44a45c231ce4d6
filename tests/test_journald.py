"""Job events in the real journal (SPEC §9), read back with journalctl."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from factory import yolox
from harness import drop, release_standin, wait_for

from saigeedged.adapters.journal import journal_field, journal_fields, journal_unreachable

pytestmark = pytest.mark.journald

JOURNAL_SOCKET = Path("/run/systemd/journal/socket")


def journal(**match: str) -> list[dict[str, Any]]:
    args = ["journalctl", "--no-pager", "-o", "json", *[f"{k}={v}" for k, v in match.items()]]
    run = subprocess.run(args, capture_output=True, text=True)
    return [json.loads(line) for line in run.stdout.splitlines() if line.startswith("{")]


@pytest.fixture(autouse=True)
def _needs_journald() -> None:
    if reason := journal_unreachable():
        pytest.fail(f"systemd-journald is not listening ({reason}); scripts/setup-host starts it")


def test_field_names_are_valid() -> None:
    """Keys become SAIGEEDGE_* fields of A-Z0-9_ only, no leading digit, at most 64 characters."""
    assert journal_field("job_id") == "SAIGEEDGE_JOB_ID"
    assert journal_field("error-code.x") == "SAIGEEDGE_ERROR_CODE_X"
    assert journal_field("9lives") == "SAIGEEDGE_LIVES"
    assert len(journal_field("k" * 100)) == 64
    fields = journal_fields({"event": "job.failed", "level": "warning", "job_id": "a-1", "error_code": "TIMEOUT",
                             "step": None})
    assert fields["SAIGEEDGE_EVENT"] == "job.failed" and fields["PRIORITY"] == "4"
    assert fields["SAIGEEDGE_ERROR_CODE"] == "TIMEOUT" and "SAIGEEDGE_STEP" not in fields
    assert fields["MESSAGE"].startswith("job.failed a-1")


def test_a_job_tells_its_story_in_the_journal(daemon: Any, det_inputs: dict[str, Any]) -> None:
    """journalctl SAIGEEDGE_JOB_ID=<id> shows claim, start, each step and success, with the SPEC's fields."""
    d = daemon(log={"format": "journal"})
    drop(d.inbox, "journaled", det_inputs["onnx"], det_inputs["manifest"])
    job_id = d.wait_job("journaled")["job_id"]
    entries = wait_for(lambda: (e := journal(SAIGEEDGE_JOB_ID=job_id)) and e[-1].get("SAIGEEDGE_EVENT") == "job.succeeded"
                       and e, 30, "the job's journal entries")
    events = [e["SAIGEEDGE_EVENT"] for e in entries]
    assert events[:2] == ["drop.claimed", "job.started"] and events[-1] == "job.succeeded"
    assert events.count("job.step") == 8
    last = entries[-1]
    assert last["SYSLOG_IDENTIFIER"] == "saigeedged" and last["SAIGEEDGE_JOB_NAME"] == "journaled"
    assert last["SAIGEEDGE_STATE"] == "succeeded" and last["SAIGEEDGE_STEP"] == "publish"
    assert {e.get("SAIGEEDGE_ATTEMPT") for e in entries if e["SAIGEEDGE_EVENT"] == "job.step"} == {"1"}  # whose step
    assert "job.step" not in d.stderr()  # nothing printed: journal only


def test_failures_carry_the_error_code(daemon: Any, det_inputs: dict[str, Any]) -> None:
    """A failed job's entry has SAIGEEDGE_ERROR_CODE and warning priority."""
    d = daemon(log={"format": "journal"})
    drop(d.inbox, "jfail", det_inputs["onnx"], {**det_inputs["manifest"], "num_classes": 9})
    job_id = d.wait_job("jfail")["job_id"]
    failed = wait_for(lambda: journal(SAIGEEDGE_JOB_ID=job_id, SAIGEEDGE_EVENT="job.failed"), 30, "job.failed entry")
    assert failed[0]["SAIGEEDGE_ERROR_CODE"] == "CALIB_INVALID" and failed[0]["PRIORITY"] == "4"


def test_auto_format_detects_a_journal_stream_and_logs_once(tmp_path: Path) -> None:
    """With stderr being the stream JOURNAL_STREAM names, auto sends to the journal and prints nothing."""
    marker = f"auto-{os.getpid()}-{tmp_path.name}"
    err = (tmp_path / "stderr").open("w+b")
    st = os.fstat(err.fileno())
    code = ("import structlog; from saigeedged.adapters import journal; "
            f"print(journal.configure('auto'), flush=True); structlog.get_logger().info('daemon.ready', marker='{marker}')")
    env = dict(os.environ, JOURNAL_STREAM=f"{st.st_dev}:{st.st_ino}")
    run = subprocess.run([sys.executable, "-c", code], stderr=err, capture_output=False, stdout=subprocess.PIPE,
                         text=True, env=env)
    assert run.stdout.strip() == "journal"
    err.seek(0)
    assert err.read() == b""
    assert wait_for(lambda: journal(SAIGEEDGE_MARKER=marker), 30, "the entry")[0]["SAIGEEDGE_EVENT"] == "daemon.ready"
    env["JOURNAL_STREAM"] = "1:1"
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert run.stdout.strip() == "json" and '"event": "daemon.ready"' in run.stderr


STALE_SOCKET = "import socket, sys; socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM).bind(sys.argv[1])"
DEAD_JOURNALS = pytest.mark.parametrize(
    ("setup", "error"), [("true", "o such file"), (f"python3 -c '{STALE_SOCKET}' {JOURNAL_SOCKET}", "Connection refused")],
    ids=["no-socket", "stale-socket"])


def with_dead_journal(setup: str, *argv: str) -> subprocess.CompletedProcess[str]:
    """Run argv where journald is gone: an empty tmpfs over its socket dir in a private mount namespace,
    then `setup` (e.g. leave a socket file nobody listens on, as a stopped journald does)."""
    script = f'mount -t tmpfs none {JOURNAL_SOCKET.parent} && {setup} && exec "$@"'
    return subprocess.run(["unshare", "--mount", "sh", "-c", script, "sh", *argv], capture_output=True, text=True,
                          cwd=Path(__file__).parent.parent)


@DEAD_JOURNALS
def test_an_unreachable_journal_costs_no_event_and_no_crash(setup: str, error: str) -> None:
    """Each event is printed as a JSON line naming the journal error, and the process goes on."""
    code = ("import structlog; from saigeedged.adapters import journal; journal.configure('journal'); "
            "structlog.get_logger().info('daemon.ready', n=1); structlog.get_logger().warning('job.failed', n=2); "
            "print('still running')")
    run = with_dead_journal(setup, sys.executable, "-c", code)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "still running"
    lines = [json.loads(line) for line in run.stderr.splitlines()]
    assert [(e["event"], e["n"], e["level"]) for e in lines] == [("daemon.ready", 1, "info"), ("job.failed", 2, "warning")]
    assert all(e["timestamp"] for e in lines)
    assert all(error in e["journal_error"] for e in lines)


@DEAD_JOURNALS
def test_check_warns_when_journald_does_not_listen(setup: str, error: str, config_path: Path) -> None:
    """`check` probes the socket rather than trusting the file, and says why events would go to stderr."""
    run = with_dead_journal(setup, sys.executable, "-m", "saigeedged", "check", "-c", str(config_path))
    line = next(x for x in run.stdout.splitlines() if x.split()[1] == "journald")
    assert line.split()[0] == "warn" and error in line and "events go to stderr" in line, run.stdout


@pytest.mark.docker
def test_a_reattach_reads_as_one_in_the_journal(docker_config: Path, daemon: Any, docker_client: Any, tmp_path: Path,
                                                det_inputs: dict[str, Any]) -> None:
    """A restart during a cubie quantize: journald has one `job.reattached` in quantize and each step's `job.step` once,
    so the steps the new daemon goes through again do not read as a job started over."""
    settings = yaml.safe_load(docker_config.read_text())
    d = daemon(log={"format": "journal"}, cubie=settings["cubie"], mobilint=settings["mobilint"],
               limits=settings["limits"], defaults={"target": "cubie"})
    drop(d.inbox, "jreattach_untilreleased", yolox(tmp_path / "j.onnx", size=(64, 64), seed=7),
         det_inputs["manifest"])
    job_id = d.wait_job("jreattach_untilreleased", ("running",))["job_id"]
    d.wait_state(job_id, ("running",), step="quantize")
    d.signal(signal.SIGTERM)  # the stand-in's quantize runs until released: on without the daemon
    assert d.proc is not None and d.proc.wait(30) == 0
    d.start()
    wait_for(lambda: journal(SAIGEEDGE_JOB_ID=job_id, SAIGEEDGE_EVENT="job.reattached"), 60, "the re-attach")
    release_standin(docker_client.containers.get(settings["cubie"]["container"]))
    entries = wait_for(lambda: (e := journal(SAIGEEDGE_JOB_ID=job_id)) and e[-1].get("SAIGEEDGE_EVENT") == "job.succeeded"
                       and e, 60, "the job's end in the journal")
    steps = [e["SAIGEEDGE_STEP"] for e in entries if e["SAIGEEDGE_EVENT"] == "job.step"]
    assert steps == ["validate", "surgery", "calibration", "import", "inputmeta", "postprocess", "patch", "quantize",
                     "export", "bundle", "publish"], steps
    reattached = [e for e in entries if e["SAIGEEDGE_EVENT"] == "job.reattached"]
    assert [(e["SAIGEEDGE_STEP"], e["SAIGEEDGE_INDEX"]) for e in reattached] == [("quantize", "8")], reattached
