"""The Debian package (SPEC §16), from a bare Debian 12 host to a running service: install, upgrade, remove, purge.

scripts/package builds the .deb once per session (and once more with a bumped version for the upgrade); the box
(tests/systemdbox) boots a bare bookworm with docker.io, whose engine is the host's (through its socket), and the
package goes in with `apt install ./saigeedged_<version>_amd64.deb` as an operator types it. The box's /srv/saige is
a host folder, so the test drops and reads there as the shares' other clients do. The tests run in file order on one
box: each starts where the previous one left the host.
"""

from __future__ import annotations

import gzip
import json
import re
import subprocess
import sys
import tomllib
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from conftest import STANDIN_ACUITY, STANDIN_MOBILINT
from factory import random_labels, valjson
from harness import container_output, drop_detector, job_named, read_status, release_standin, remove_containers, wait_for

sys.path.insert(0, str(Path(__file__).parent / "systemdbox"))
from box import ROOT, UPGRADE, Box, image, package, previous_package  # noqa: E402

pytestmark = [pytest.mark.systemd, pytest.mark.docker, pytest.mark.timeout(2400)]

VERSION = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
NEWER = f"{VERSION}{UPGRADE}"
CONFIG = "/etc/saigeedged/saigeedged.yml"
DB = "/var/lib/saigeedged/saigeedged.db"


@dataclass
class Host:
    """The box with the package's shares on the host side, the two builds and lintian running on the first."""

    box: Box
    srv: Path
    data: Path
    debs: tuple[Path, Path]
    lintian: subprocess.Popen[str]
    container: str

    def sh(self, script: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return self.box.sh(script, check=check)

    def status(self, job_id: str) -> dict[str, Any] | None:
        return read_status(self.srv / "outbox", job_id)

    def job(self, name: str, states: tuple[str, ...] = ("succeeded", "failed", "cancelled"),
            timeout: float = 120, steps: tuple[str, ...] = ()) -> dict[str, Any]:
        return job_named(self.srv / "outbox", name, states, steps, timeout,
                         lambda: "\n".join(self.box.messages()[-40:]))

    def drop(self, name: str, **fields: Any) -> None:
        drop_detector(self.srv / "inbox", self.data, name, **{"target": "host", **fields})

    def check(self) -> subprocess.CompletedProcess[str]:
        """`saigeedged check` as the service's user, with the installed config."""
        return self.sh("runuser -u saigeedged -- saigeedged check", check=False)


@pytest.fixture(scope="module")
def host(tmp_path_factory: pytest.TempPathFactory, docker_client: Any) -> Iterator[Host]:
    """Both builds, lintian started on the first, and a booted bare box with its /srv/saige on the host."""
    debs = (package(), package(NEWER))
    lintian = subprocess.Popen(["lintian", "--tag-display-limit", "0", str(debs[0])], stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True)
    shared = tmp_path_factory.mktemp("package")
    shared.chmod(0o755)
    srv, data = shared / "srv", shared / "data"
    srv.mkdir()
    valjson(data, random_labels(8, 3))
    container = f"saige-package-{uuid.uuid4().hex[:8]}"
    b = Box(image(), shared, mounts={srv: "/srv/saige"})
    try:
        assert b.boot() in ("running", "degraded")
        b.host_setup()
        yield Host(b, srv, data, debs, lintian, container)
    finally:
        lintian.kill()
        b.remove()
        remove_containers(docker_client, container, f"{container}-mobilint")


def md5sums(deb: Path) -> dict[str, str]:
    out = subprocess.run(["dpkg-deb", "--info", str(deb), "md5sums"], capture_output=True, text=True, check=True).stdout
    return {path: digest for digest, path in (line.split(maxsplit=1) for line in out.splitlines())}


def test_two_builds_of_one_commit_install_the_same_files(host: Host) -> None:
    """Both builds carry the same files, byte for byte, but the changelog naming the version; the layout is §16's."""
    first, second = (md5sums(deb) for deb in host.debs)
    changelog = "usr/share/doc/saigeedged/changelog.gz"
    assert first.pop(changelog) != second.pop(changelog)
    assert first == second
    listing = subprocess.run(["dpkg-deb", "--contents", str(host.debs[0])], capture_output=True, text=True,
                             check=True).stdout
    for path in ("./opt/saigeedged/bin/saigeedged", "./usr/bin/saigeedged -> /opt/saigeedged/bin/saigeedged",
                 "./lib/systemd/system/saigeedged.service", "./usr/lib/sysusers.d/saigeedged.conf",
                 "./usr/lib/tmpfiles.d/saigeedged.conf", f".{CONFIG}", "./usr/share/doc/saigeedged/README.md",
                 "./usr/share/man/man1/saigeedged.1.gz",
                 "./usr/share/doc/saigeedged/INSTALL.md", "./usr/share/doc/saigeedged/examples/saigeedged.yml"):
        assert path in listing, path
    conffiles = subprocess.run(["dpkg-deb", "--info", str(host.debs[0]), "conffiles"], capture_output=True,
                               text=True, check=True).stdout.split()
    assert conffiles == [CONFIG]


def test_the_manual_page_is_the_cli_help(host: Host) -> None:
    """The shipped man page is made from the CLI's parser: every sub-command with its help text, the version, and the
    exit codes (lintian's check that `man` renders it without a warning is in the lintian test)."""
    from saigeedged.cli.main import _parser

    tar = subprocess.run(["dpkg-deb", "--fsys-tarfile", str(host.debs[0])], capture_output=True, check=True).stdout
    page = subprocess.run(["tar", "-xOf", "-", "./usr/share/man/man1/saigeedged.1.gz"], input=tar, capture_output=True,
                          check=True).stdout
    text = re.sub(r"\\f[BIR]|\\[,/]", "", gzip.decompress(page).decode().replace("\\-", "-"))  # roff's escapes
    commands = next(a for a in _parser()._actions if a.dest == "command")
    for action in commands._choices_actions:  # type: ignore[attr-defined]
        assert f"saigeedged {action.dest}\n{action.help}\n" in text, action.dest
    assert f'"saigeedged {VERSION}"' in text and ".SH EXIT STATUS" in text and "the host is not ready" in text


def test_install_on_a_bare_host_gives_a_running_enabled_service(host: Host) -> None:
    """`apt install ./deb` alone: the user in group docker, the shares, the unit enabled, active and READY."""
    seconds = host.box.apt_install(host.debs[0])
    print(f"install-to-ready: {seconds:.1f} s")  # apt returns once the unit sent READY=1 (Type=notify)
    shown = host.box.show("ActiveState", "SubState", "StatusText", "UnitFileState", "User")
    assert shown == {"ActiveState": "active", "SubState": "running", "StatusText": "idle, 0 queued",
                     "UnitFileState": "enabled", "User": "saigeedged"}, shown
    # READY=1 and the journal's datagram go to two sockets: the entry may be stored a moment after apt returns
    wait_for(lambda: host.box.journal("SAIGEEDGE_EVENT=daemon.ready"), 30, "daemon.ready in the journal")
    assert "docker" in host.sh("id -nG saigeedged").stdout.split()
    owners = host.sh("stat -c '%U %a %n' /srv/saige/inbox /srv/saige/outbox /var/lib/saigeedged").stdout.splitlines()
    assert owners == ["saigeedged 755 /srv/saige/inbox", "saigeedged 755 /srv/saige/outbox",
                      "saigeedged 750 /var/lib/saigeedged"], owners
    assert host.sh("readlink -f /usr/bin/saigeedged").stdout.strip() == "/opt/saigeedged/bin/saigeedged"
    security = host.sh("systemd-analyze security saigeedged 2>&1 | tail -1").stdout
    exposure = float(re.search(r"exposure level for saigeedged.service: ([0-9.]+)", security).group(1))  # type: ignore[union-attr]
    print(f"systemd-analyze security: {exposure}")
    assert exposure <= 3.7  # the unit's score before the package (SPEC §16: no worse)


def _configure(host: Host, state_dir: str = "/var/lib/saigeedged") -> None:
    """INSTALL.md's "edit the config": the loaded compiler images (the stand-ins here), host drops, the test's data."""
    config = {"inbox": "/srv/saige/inbox", "outbox": "/srv/saige/outbox", "state_dir": state_dir,
              "allowed_roots": [str(host.data)], "watch": {"settle_s": 0.3},
              "cubie": {"image": STANDIN_ACUITY, "container": host.container},
              "mobilint": {"image": STANDIN_MOBILINT, "container": f"{host.container}-mobilint"},
              "defaults": {"target": "host"}}
    host.sh(f"cat > {CONFIG} <<'EOF'\n{json.dumps(config, indent=1)}\nEOF")  # JSON is YAML


def test_check_passes_on_the_shipped_config_then_a_host_drop_succeeds(host: Host) -> None:
    """Right after `apt install`, `check` with the shipped config passes (exit 0, no FAIL): the vendor images not loaded
    yet are warnings saying what to `docker load`; once the config names loaded images it still passes, and after a
    restart a host drop succeeds."""
    before = host.check()
    assert before.returncode == 0, before.stdout + before.stderr
    lines = before.stdout.splitlines()
    assert not [line for line in lines if line.startswith("FAIL")], before.stdout
    warned = [line for line in lines if line.split()[:2] == ["warn", "image"]]
    assert len(warned) == 2 and all("docker load" in line for line in warned), before.stdout
    for what in ("docker", "inbox", "outbox", "state_dir", "journald"):
        assert any(line.split()[:2] == ["ok", what] for line in lines), (what, before.stdout)
    _configure(host)
    after = host.check()
    assert after.returncode == 0, after.stdout + after.stderr
    host.sh("systemctl restart saigeedged")
    host.drop("pkgdet")
    doc = host.job("pkgdet")
    assert (doc["state"], doc["target"], doc["attempt"]) == ("succeeded", "host", 1), doc
    assert (host.srv / "outbox" / doc["bundle"]["path"]).is_file()


def test_upgrade_restarts_the_service_and_keeps_the_database(host: Host) -> None:
    """Installing the newer build restarts the running service (no stop before unpack); the queue database and the
    edited config stay, and the new daemon knows the jobs of the old one."""
    old = host.box.show("InvocationID", "MainPID")
    prerm = host.sh("cat /var/lib/dpkg/info/saigeedged.prerm").stdout
    stops = [line for line in prerm.splitlines() if "deb-systemd-invoke stop" in line or "$1\" = remove" in line]
    assert stops and all('"$1" = remove' in line for line in stops if "if" in line), prerm  # only remove stops it
    config = host.sh(f"cat {CONFIG}").stdout
    host.box.apt_install(host.debs[1])
    assert host.sh("dpkg-query -W -f '${Version}' saigeedged").stdout == NEWER
    new = host.box.show("InvocationID", "MainPID", "ActiveState", "StatusText")
    assert new["InvocationID"] != old["InvocationID"] and new["MainPID"] != old["MainPID"], (old, new)
    assert (new["ActiveState"], new["StatusText"]) == ("active", "idle, 0 queued"), new
    assert host.sh(f"cat {CONFIG}").stdout == config  # a conffile the operator edited is kept
    done = host.job("pkgdet")
    shown = json.loads(host.sh(f"runuser -u saigeedged -- saigeedged status {done['job_id']} --json").stdout)
    assert shown["state"] == "succeeded", shown
    host.drop("afterupgrade")
    assert host.job("afterupgrade")["state"] == "succeeded"


def test_remove_keeps_state_and_a_reinstall_runs_the_jobs_queued_before(host: Host) -> None:
    """`apt remove` while jobs wait: the unit is gone, state, config and shares stay, the unfinished jobs stay queued;
    the reinstalled service runs each of them (the same job ids)."""
    # one job at a time (SPEC §2): six 640 host jobs (quantize and report, seconds each) keep the last ones queued at
    # the remove (four 320 ones calibrated on all 8 images, no report, could all end before it on an idle machine)
    names = ("queued1", "queued2", "queued3", "queued4", "queued5", "queued6")
    for name in names:
        host.drop(name, size=(640, 640))
    for name in names:
        host.job(name, ("queued", "running"))
    host.job(names[-1], ("queued",))
    host.sh("DEBIAN_FRONTEND=noninteractive apt-get remove -y -q saigeedged")
    shown = host.box.show("LoadState", "ActiveState")
    assert shown["LoadState"] in ("not-found", "masked") and shown["ActiveState"] == "inactive", shown
    host.sh(f"test ! -e /usr/bin/saigeedged && test ! -e /opt/saigeedged/bin/python && test -s {DB} && test -s {CONFIG}")
    docs = [host.job(name, ("queued", "succeeded"), timeout=5) for name in names]  # the one running was requeued
    pending = [doc for doc in docs if doc["state"] == "queued"]
    assert pending and pending[-1]["name"] == names[-1], docs
    host.box.apt_install(host.debs[1])
    for doc in pending:
        done = host.job(doc["name"], timeout=300)
        assert done["state"] == "succeeded" and done["job_id"] == doc["job_id"], done


def test_purge_removes_config_and_state_but_never_the_shares(host: Host, docker_client: Any) -> None:
    """`apt purge`: the config and the state dir are gone; the bundles, the user and the compiler images stay."""
    bundles = sorted((host.srv / "outbox").rglob("*.saigeedge"))
    assert bundles
    host.sh("DEBIAN_FRONTEND=noninteractive apt-get purge -y -q saigeedged")
    host.sh("test ! -e /etc/saigeedged && test ! -e /var/lib/saigeedged && test ! -e /opt/saigeedged")
    assert host.box.show("LoadState")["LoadState"] == "not-found"
    assert sorted((host.srv / "outbox").rglob("*.saigeedge")) == bundles
    host.sh("getent passwd saigeedged && test -d /srv/saige/inbox")
    docker_client.images.get(STANDIN_ACUITY)


def test_lintian_reports_no_error_nor_warning(host: Host) -> None:
    """lintian (Debian 12's) finds no error and no warning in the package: each tag it would give is fixed or
    overridden in debian/saigeedged.lintian-overrides with the reason it is expected."""
    out, _ = host.lintian.communicate(timeout=1200)
    flagged = [line for line in out.splitlines() if line.startswith(("E:", "W:"))]
    assert flagged == [], out[-4000:]
    print("lintian:\n" + out)


def test_upgrade_from_the_previous_schema_during_a_cubie_step_keeps_attempt_1(host: Host, docker_client: Any) -> None:
    """An upgrade from the release of the previous database schema (box.PREVIOUS, schema 2: its attempts kept their
    facts in their work dirs) while a cubie step compiles (SPEC §15, §16): `apt install` of this package restarts the
    service; the database is copied to saigeedged.db.bak-2 and migrated to 3, the new daemon rebuilds the running
    attempt's record from what it can check (service/legacy.py, `job.legacy_adopted`) and re-attaches to the step,
    which runs only once; the job ends succeeded in its first attempt and the journal tells one `job.step quantize`."""
    host.box.apt_install(previous_package())  # after the purge above: a fresh install of the previous release
    # the work dirs are bind-mounted into the compiler container by the host's engine: a state dir at the same path
    # on both sides, as INSTALL.md's notes say for a state_dir elsewhere
    state = host.box.shared / "state"
    _configure(host, state_dir=str(state))
    host.sh(f"install -d -o saigeedged -g saigeedged -m 0750 {state} && mkdir -p /etc/systemd/system/saigeedged.service.d"
            f" && printf '[Service]\\nReadWritePaths={state}\\n' > /etc/systemd/system/saigeedged.service.d/state.conf"
            " && systemctl daemon-reload && systemctl restart saigeedged")
    name = "upgrade_untilreleased"  # the stand-in's quantize runs until the test releases it: past the upgrade
    host.drop(name, target="cubie")
    running = host.job(name, ("running",), steps=("quantize",))
    compiler = docker_client.containers.get(host.container)

    def calls(what: str) -> list[str]:
        out = container_output(compiler, ["cat", "/tmp/standin-calls.log"])
        return [line for line in out.splitlines() if running["job_id"] in line and what in line]

    def events() -> list[str]:
        return [e["SAIGEEDGE_EVENT"] for e in host.box.journal(f"SAIGEEDGE_JOB_ID={running['job_id']}")]

    wait_for(lambda: calls(" quantize "), 30, "the stand-in's quantize step")
    host.box.apt_install(host.debs[1])  # the previous release's daemon stops, leaving its step running (SPEC §15)
    assert host.box.show("ActiveState")["ActiveState"] == "active"
    # the new daemon adopts the attempt while its step still runs (however long the upgrade took), then re-attaches
    wait_for(lambda: "job.reattached" in events(), 120, "the new daemon re-attached", lambda: str(events()))
    assert "job.legacy_adopted" in events(), events()
    release_standin(compiler)
    done = host.job(name, timeout=180)
    assert (done["state"], done["attempt"], done["job_id"]) == ("succeeded", 1, running["job_id"]), done
    assert len(calls(" quantize ")) == 1, calls("")
    version = host.sh(f"runuser -u saigeedged -- python3.11 -c 'import sqlite3; print(sqlite3.connect(\"{state}/saigeedged.db\")"
                      ".execute(\"PRAGMA user_version\").fetchone()[0])'").stdout.strip()
    assert version == "3" and (state / "saigeedged.db.bak-2").stat().st_size > 0
    assert "job.requeued" not in events() and "job.legacy_unresumable" not in events(), events()
    steps = [e["SAIGEEDGE_STEP"] for e in host.box.journal("SAIGEEDGE_EVENT=job.step", f"SAIGEEDGE_JOB_ID={running['job_id']}")]
    assert steps.count("quantize") == 1 and steps[-2:] == ["bundle", "publish"], steps
