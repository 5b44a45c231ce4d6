"""systemd/saigeedged.service (SPEC §9): verified by systemd-analyze without a single warning."""

from __future__ import annotations

import configparser
import re
import shutil
import subprocess
import sys
from pathlib import Path

UNIT = Path(__file__).parent.parent / "systemd" / "saigeedged.service"


def installed_copy(tmp_path: Path) -> Path:
    """The unit with ExecStart pointing at this venv's entry point (verify checks that it exists)."""
    exe = shutil.which("saigeedged", path=str(Path(sys.executable).parent))
    assert exe
    text = UNIT.read_text().replace("/opt/saigeedged/bin/saigeedged", exe)
    dest = tmp_path / "saigeedged.service"
    dest.write_text(text)
    return dest


def test_verify_is_clean(tmp_path: Path) -> None:
    """systemd-analyze verify exits 0 and prints nothing (it only warns on unknown keys)."""
    run = subprocess.run(["systemd-analyze", "verify", str(installed_copy(tmp_path))], capture_output=True, text=True)
    assert run.returncode == 0 and run.stderr == "" and run.stdout == ""


def test_service_settings() -> None:
    """Type=notify with a watchdog, a dedicated user in the docker group, a state directory, no PrivateTmp."""
    parser = configparser.ConfigParser(strict=False, interpolation=None)
    parser.optionxform = str  # type: ignore[assignment,method-assign]
    parser.read(UNIT)
    service = parser["Service"]
    assert service["Type"] == "notify" and int(service["WatchdogSec"]) > 0
    assert service["User"] == "saigeedged" and service["SupplementaryGroups"] == "docker"
    assert service["StateDirectory"] == "saigeedged" and "PrivateTmp" not in service
    assert service["Environment"] == f"TMPDIR=/run/{service['RuntimeDirectory']}"  # /tmp is read-only under strict
    assert "AF_UNIX" in service["RestrictAddressFamilies"]  # /run/docker.sock and the notify socket
    assert int(service["TimeoutStopSec"]) > 30


def test_hardening_score(tmp_path: Path) -> None:
    """systemd-analyze security rates the unit at most 4.0 (OK) while docker.sock stays reachable."""
    run = subprocess.run(["systemd-analyze", "security", "--offline=yes", str(installed_copy(tmp_path))],
                         capture_output=True, text=True)
    match = re.search(r"Overall exposure level for saigeedged.service: ([0-9.]+)", run.stdout + run.stderr)
    assert match, run.stdout + run.stderr
    assert float(match.group(1)) <= 4.0


def test_reload_restart_and_memory_settings() -> None:
    """reload signals the main process only; a config error (exit 2) is not restarted; memory is bounded, soft first."""
    parser = configparser.ConfigParser(strict=False, interpolation=None)
    parser.optionxform = str  # type: ignore[assignment,method-assign]
    parser.read(UNIT)
    service = parser["Service"]
    assert service["ExecReload"] == "/bin/kill -HUP $MAINPID"
    assert "2" in service["RestartPreventExitStatus"].split() and service["Restart"] == "on-failure"
    high, most = (int(service[key].rstrip("%")) for key in ("MemoryHigh", "MemoryMax"))
    assert 0 < high < most <= 100 and service["OOMPolicy"] == "continue"
    readme = (UNIT.parent.parent / "README.md").read_text()
    assert "systemctl reload saigeedged" in readme and "kill -s HUP" not in readme
