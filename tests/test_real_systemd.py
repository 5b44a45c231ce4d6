"""The unit under a real systemd 252 (SPEC §9): installed from the Debian package as systemd/INSTALL.md says, driven
as an operator would.

The box (tests/systemdbox/) boots Debian's systemd as PID 1 in a container of the host's engine; the compiler
containers run on that engine too, so the state dir, inbox and outbox are bind-mounted at their host paths (the
config and a drop-in name them, as INSTALL.md's notes say for shares and a state dir elsewhere).
"""

from __future__ import annotations

import contextlib
import json
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from conftest import STANDIN_ACUITY, STANDIN_MOBILINT
from factory import random_labels, valjson
from harness import (
    STANDIN_QUANTIZE,
    container_output,
    drop_detector,
    job_named,
    read_status,
    release_standin,
    remove_containers,
    wait_for,
    wait_for_quantize,
)

sys.path.insert(0, str(Path(__file__).parent / "systemdbox"))
from box import Box, image, package  # noqa: E402

pytestmark = [pytest.mark.systemd, pytest.mark.docker, pytest.mark.timeout(1500)]


@dataclass
class Host:
    """The installed unit in its box and the paths the test shares with it."""

    box: Box
    inbox: Path
    outbox: Path
    data: Path
    config: str
    container: str

    def status(self, job_id: str) -> dict[str, Any] | None:
        return read_status(self.outbox, job_id)

    def job(self, name: str, states: tuple[str, ...] = ("succeeded", "failed", "cancelled"), timeout: float = 90,
            steps: tuple[str, ...] = ()) -> dict[str, Any]:
        return job_named(self.outbox, name, states, steps, timeout, lambda: "\n".join(self.box.messages()[-40:]))

    def drop(self, name: str, **fields: Any) -> None:
        drop_detector(self.inbox, self.data, name, **fields)


def _configure(b: Box, srv: Path, state: Path, data: Path, container: str) -> str:
    """What "edit the config" means here, and the drop-in INSTALL.md asks for when paths differ."""
    config = {"inbox": str(srv / "inbox"), "outbox": str(srv / "outbox"), "state_dir": str(state),
              "allowed_roots": [str(data)], "watch": {"settle_s": 0.3},
              "cubie": {"image": STANDIN_ACUITY, "container": container},
              "mobilint": {"image": STANDIN_MOBILINT, "container": f"{container}-mobilint"},
              "limits": {"step_timeout_s": 600}, "defaults": {"target": "host"}}
    text = json.dumps(config, indent=1)  # JSON is YAML
    b.sh(f"install -d -o saigeedged -g saigeedged {srv / 'inbox'} {srv / 'outbox'}\n"
         f"install -d -o saigeedged -g saigeedged -m 0750 {state}\n"
         f"cat > /etc/saigeedged/saigeedged.yml <<'EOF'\n{text}\nEOF\n"
         "mkdir -p /etc/systemd/system/saigeedged.service.d\n"
         f"printf '[Unit]\\nRequiresMountsFor={srv}\\n[Service]\\nReadWritePaths=\\nReadWritePaths={srv} {state}\\n' "
         "> /etc/systemd/system/saigeedged.service.d/paths.conf")
    return text


@pytest.fixture(scope="module")
def host(tmp_path_factory: pytest.TempPathFactory, docker_client: Any) -> Iterator[Host]:
    """Boot the bare box, install the package, then INSTALL.md's steps: edit the config, check, restart."""
    shared = tmp_path_factory.mktemp("systemdbox")
    shared.chmod(0o755)
    srv, state, data = shared / "srv" / "saige", shared / "var" / "lib" / "saigeedged", shared / "data"
    valjson(data, random_labels(8, 3))
    container = f"saige-systemdbox-{uuid.uuid4().hex[:8]}"
    b = Box(image(), shared)
    try:
        assert b.boot() in ("running", "degraded")
        b.host_setup()
        b.apt_install(package())
        config = _configure(b, srv, state, data, container)
        b.sh("set -e; runuser -u saigeedged -- saigeedged check; systemctl daemon-reload; systemctl restart saigeedged")
        yield Host(b, srv / "inbox", srv / "outbox", data, config, container)
    finally:
        b.remove()
        remove_containers(docker_client, container, f"{container}-mobilint")


def test_ready_with_status_text(host: Host) -> None:
    """`systemctl restart` returns once the daemon sent READY=1; StatusText says it is idle; memory is bounded."""
    shown = host.box.show("ActiveState", "SubState", "StatusText", "MemoryMax", "NRestarts")
    assert (shown["ActiveState"], shown["SubState"]) == ("active", "running"), shown
    assert shown["StatusText"] == "idle, 0 queued" and shown["NRestarts"] == "0"
    docs = host.box.show("Documentation")["Documentation"].removeprefix("file://")
    host.box.sh(f"test -s {docs}")  # the unit's Documentation= is installed
    assert shown["MemoryMax"] not in ("infinity", "")
    group = host.box.show("ControlGroup")["ControlGroup"]  # the kernel enforces it: cgroup v1 (this host) or v2
    limit = host.box.sh(f"cat /sys/fs/cgroup/memory{group}/memory.limit_in_bytes 2>/dev/null"
                        f" || cat /sys/fs/cgroup{group}/memory.max").stdout.strip()
    assert int(limit) == int(shown["MemoryMax"]), (group, limit)
    ready = wait_for(lambda: host.box.journal("SAIGEEDGE_EVENT=daemon.ready"), 30, "daemon.ready in the journal")
    assert ready[-1]["SYSLOG_IDENTIFIER"] == "saigeedged"


@contextlib.contextmanager
def released(host: Host, docker_client: Any, job_id: str, timeout: float = 60) -> Iterator[None]:
    """Once the job's re-attach is in the journal, end the stand-in's `untilreleased` quantize it follows (a step
    that outlasts a restart however slow the machine); the release file goes afterwards (the container serves the
    module's later tests)."""
    ctr = docker_client.containers.get(host.container)
    try:
        wait_for(lambda: host.box.journal(f"SAIGEEDGE_JOB_ID={job_id}", "SAIGEEDGE_EVENT=job.reattached"), timeout,
                 f"the re-attach of {job_id}")
        release_standin(ctr)
        yield
    finally:
        release_standin(ctr, released=False)


def ended_in_journal(host: Host, job_id: str) -> list[dict[str, Any]]:
    """The job's journal entries once its end event is there: journald stores the daemon's datagrams on its own time,
    so the final status file can be read before the event it follows is."""
    def ended() -> list[dict[str, Any]] | None:
        entries = host.box.journal(f"SAIGEEDGE_JOB_ID={job_id}")
        ends = ("job.succeeded", "job.failed", "job.cancelled")
        return entries if entries and entries[-1].get("SAIGEEDGE_EVENT") in ends else None
    result: list[dict[str, Any]] = wait_for(ended, 30, f"the journal's end event of {job_id}")
    return result


def test_host_and_cubie_jobs_and_their_journal(host: Host) -> None:
    """A host job and a cubie job (stand-in compiler on the host's engine) succeed; the journal tells each by id."""
    host.drop("hostdet")
    host.drop("cubiedet", target="cubie")
    for name, target in (("hostdet", "host"), ("cubiedet", "cubie")):
        doc = host.job(name)
        assert (doc["state"], doc["target"]) == ("succeeded", target), doc
        assert (host.outbox / doc["bundle"]["path"]).is_file()
        entries = ended_in_journal(host, doc["job_id"])
        events = [e["SAIGEEDGE_EVENT"] for e in entries]
        assert events[0] == "drop.claimed" and "job.started" in events and events[-1] == "job.succeeded", events
        assert {e["SAIGEEDGE_JOB_NAME"] for e in entries} == {name}
    containers = [e for e in host.box.journal() if e.get("SAIGEEDGE_EVENT", "").startswith("container.")]
    assert [e["SAIGEEDGE_EVENT"] for e in containers] == ["container.created"]  # its first start is no restart


def test_a_failure_in_the_journal_then_status_and_retry_as_root_and_as_a_group_member(host: Host) -> None:
    """A failed compile's journal line says the compiler's last word and the hint; `status` as a user of the package's
    group is one line (exit 2), never a traceback; `status` and `retry` as root act as the service's user: the inbox's
    `.saigeedged` stays the service's (root's retry moved it aside as a dropper's, and no drop was claimed again), the job
    runs again and the next drop is claimed."""
    host.drop("rootretry_failimport", target="cubie")
    failed = host.job("rootretry_failimport")
    assert (failed["state"], failed["error"]["code"]) == ("failed", "STEP_FAILED"), failed
    told = ended_in_journal(host, failed["job_id"])[-1]
    assert told["SAIGEEDGE_MESSAGE"].endswith("E onnx model import failed: unsupported op"), told
    assert told["SAIGEEDGE_HINT"] == failed["error"]["hint"] and "hint=" in told["MESSAGE"], told
    host.box.sh("id ops >/dev/null 2>&1 || useradd -G saigeedged ops")
    member = host.box.sh("runuser -u ops -- saigeedged status", check=False)
    assert member.returncode == 2 and member.stderr.startswith("saigeedged: "), member
    assert "Traceback" not in member.stderr and "sudo -u saigeedged" in member.stderr, member.stderr
    assert failed["job_id"] in host.box.sh("saigeedged status").stdout
    assert host.box.sh(f"saigeedged retry {failed['job_id']}").stdout.strip().endswith("queued again (attempt 2)")

    def retried() -> bool:
        doc = host.status(failed["job_id"])
        return bool(doc and (doc["state"], doc["attempt"]) == ("failed", 2))

    wait_for(retried, 60, "the retried job's second end", lambda: str(host.status(failed["job_id"])))
    owners = host.box.sh(f"stat -c '%U %n' {host.inbox}/.saigeedged {host.inbox}/.saigeedged/*").stdout.split("\n")
    assert all(line.startswith("saigeedged ") for line in owners if line), owners
    assert not [p.name for p in host.inbox.iterdir() if "not-ours" in p.name]
    host.drop("afterrootretry")
    assert host.job("afterrootretry")["state"] == "succeeded"


def test_root_retry_takes_the_groups_the_unit_gives_the_service(host: Host) -> None:
    """The inbox is a share's folder the service reaches only through a group a unit drop-in gives it
    (`SupplementaryGroups=`, not in /etc/group): root's `retry` switched to the service's user with /etc/group's groups
    only, could not reach the inputs and said PATH_NOT_ALLOWED; it takes the unit's groups too."""
    box, dropin = host.box, "/etc/systemd/system/saigeedged.service.d/share.conf"
    box.sh(f"set -e; getent group dropshare >/dev/null || groupadd dropshare; mkdir -p {Path(dropin).parent}\n"
           f"printf '[Service]\\nSupplementaryGroups=dropshare\\n' > {dropin}\n"
           f"chown root:dropshare {host.inbox}; chmod 2770 {host.inbox}\n"
           "systemctl daemon-reload; systemctl restart saigeedged")
    try:
        host.drop("groupretry_failimport", target="cubie")
        failed = host.job("groupretry_failimport")
        assert failed["state"] == "failed", failed
        retried = box.sh(f"saigeedged retry {failed['job_id']}", check=False)
        assert retried.returncode == 0 and retried.stdout.strip().endswith("queued again (attempt 2)"), retried
    finally:
        box.sh(f"rm -f {dropin}; chown saigeedged:saigeedged {host.inbox}; chmod 0755 {host.inbox}; "
               "systemctl daemon-reload; systemctl restart saigeedged")


def test_reload_and_hup_to_every_process_keep_a_host_job(host: Host) -> None:
    """`systemctl reload` and `systemctl kill -s HUP` while a host job quantizes: the job succeeds, so does the next."""
    host.drop("hupdet", size=(320, 320), n_samples=8)
    running = host.job("hupdet", ("running",), steps=("quantize", "report"))  # both run in the onnxruntime child
    host.box.sh("systemctl reload saigeedged && systemctl kill -s HUP saigeedged")
    done = host.job("hupdet")
    assert done["state"] == "succeeded" and done["attempt"] == 1, done
    assert host.box.journal("SAIGEEDGE_EVENT=daemon.hangup")
    assert running["job_id"] == done["job_id"]
    host.box.sh("systemctl kill -s HUP saigeedged")  # idle: the helpers stay for the next host job
    host.drop("afterhup")
    assert host.job("afterhup")["state"] == "succeeded"
    assert host.box.show("NRestarts")["NRestarts"] == "0"


def test_restart_mid_step_reattaches_and_runs_the_step_once(host: Host, docker_client: Any) -> None:
    """`systemctl restart` during a cubie quantize: nothing is SIGKILLed, the step runs on in its container (SPEC §15),
    the new daemon re-attaches, and the job succeeds in attempt 1 with quantize run once, one status file, one bundle;
    the unit's journal tells each step once."""
    host.drop("stop_untilreleased", target="cubie")
    job = host.job("stop_untilreleased", ("running",), steps=("quantize",))
    ctr = docker_client.containers.get(host.container)
    wait_for_quantize(ctr)
    host.box.sh("systemctl restart saigeedged")
    killed = [m for m in host.box.messages() if "SIGKILL" in m or "remains running" in m]
    assert killed == [], killed
    with released(host, docker_client, job["job_id"]):
        done = host.job("stop_untilreleased")
    assert done["state"] == "succeeded" and done["attempt"] == 1, done
    record = container_output(ctr, ["cat", "/tmp/standin-calls.log"]).splitlines()
    assert len([line for line in record if job["job_id"] in line and STANDIN_QUANTIZE in line]) == 1, record
    assert len(list((host.outbox / "status").glob("stop_untilreleased-*.json"))) == 1
    assert len(list(host.outbox.glob("stop_untilreleased*.saigeedge"))) == 1
    entries = ended_in_journal(host, job["job_id"])
    events = [e["SAIGEEDGE_EVENT"] for e in entries]
    assert "job.detached" in events and "job.reattached" in events and "job.requeued" not in events, events
    assert events[-1] == "job.succeeded", events
    steps = [e["SAIGEEDGE_STEP"] for e in entries if e["SAIGEEDGE_EVENT"] == "job.step"]  # `journalctl -u saigeedged`
    assert steps.count("quantize") == 1 and steps.count("validate") == 1, steps  # a re-attach is not a new start


def test_watchdog_restarts_a_frozen_daemon_and_the_job_resumes(host: Host, docker_client: Any) -> None:
    """A daemon frozen mid-job misses its watchdog pings: systemd kills and restarts it, and the new daemon re-attaches
    to the step that ran on: the job succeeds in its first attempt."""
    dropin = "/etc/systemd/system/saigeedged.service.d/watchdog.conf"  # short, so the test waits seconds, not minutes
    host.box.sh(f"printf '[Service]\\nWatchdogSec=12\\nTimeoutAbortSec=2\\n' > {dropin} && systemctl daemon-reload "
                "&& systemctl restart saigeedged")
    try:
        host.drop("freeze_untilreleased", target="cubie")
        job = host.job("freeze_untilreleased", ("running",), steps=("quantize",))
        wait_for_quantize(docker_client.containers.get(host.container))  # a freeze in the step's running state, not
        # between its exec's create and start (the new daemon starts such a step: test_detached_steps covers that)
        host.box.sh("kill -STOP $(systemctl show -p MainPID --value saigeedged)")
        with released(host, docker_client, job["job_id"], timeout=120):
            done = host.job("freeze_untilreleased", timeout=120)
        assert done["state"] == "succeeded" and done["attempt"] == 1 and done["job_id"] == job["job_id"], done
        assert host.box.show("NRestarts", "ActiveState") == {"NRestarts": "1", "ActiveState": "active"}
        assert any("Watchdog timeout" in m for m in host.box.messages())
    finally:
        host.box.sh(f"rm -f {dropin} && systemctl daemon-reload && systemctl restart saigeedged")


@pytest.mark.parametrize(("breakage", "said"), [
    ("sed -i '1a \"inbx\": \"/x\",' /etc/saigeedged/saigeedged.yml", "unknown key `inbx`"),
    ("chmod 0600 /etc/saigeedged/saigeedged.yml", "cannot read config /etc/saigeedged/saigeedged.yml: Permission denied"),
], ids=["unknown key", "unreadable"])
def test_bad_config_fails_once_without_a_restart_loop(host: Host, breakage: str, said: str) -> None:
    """A config error ends the unit `failed` with one clear journal line; systemd does not restart it."""
    host.box.sh(f"{breakage} && systemctl restart saigeedged", check=False)
    try:
        wait_for(lambda: host.box.show("ActiveState")["ActiveState"] == "failed", 30,
                 f"the unit failed for good\n{host.box.show('ActiveState', 'SubState', 'NRestarts')}")
        shown = host.box.show("Result", "ExecMainStatus", "NRestarts")
        assert shown == {"Result": "exit-code", "ExecMainStatus": "2", "NRestarts": "0"}, shown
        # the line comes over stdout, the unit's failure by SIGCHLD: journald may store it after systemctl says failed
        lines = wait_for(lambda: [m for m in host.box.messages() if said in m], 30, f"the journal saying {said}",
                         lambda: "\n".join(host.box.messages()[-10:]))
        assert lines[-1].startswith("saigeedged: "), lines
        hint = next(m for m in reversed(host.box.messages()) if m.startswith("  hint: "))
        named = [word for word in hint.split() if word.startswith("/")]  # what it names is on the installed host
        assert named or "unknown key" not in said, hint
        assert all(host.box.sh(f"test -s {path}", check=False).returncode == 0 for path in named), hint
        assert not any("Traceback" in m for m in host.box.messages())
    finally:
        host.box.sh(f"cat > /etc/saigeedged/saigeedged.yml <<'EOF'\n{host.config}\nEOF\n"
                    "chmod 0644 /etc/saigeedged/saigeedged.yml && systemctl reset-failed saigeedged && "
                    "systemctl start saigeedged")
