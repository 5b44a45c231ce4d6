"""`saigeedged check` with an engine pool (SPEC §11): one line per engine, reachable over unix, tcp+TLS and ssh or
why not (refused, timed out, TLS, ssh authentication), each target's image and compiler, the runtime; an engine
that lacks something is named with what it lacks, and the exit code is 3 as for one engine not ready."""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import STANDIN_ACUITY, STANDIN_MOBILINT, write_config

from saigeedged import config as configmod
from saigeedged.cli import readiness

pytestmark = [pytest.mark.engines, pytest.mark.docker]
PEGASUS = "/root/acuity-toolkit-whl-6.30.22/bin/pegasus.py"


def pool_config(tmp_path: Path, engines: list[dict[str, Any]], **overrides: Any) -> Path:
    return write_config(tmp_path, cubie={"image": STANDIN_ACUITY}, mobilint={"image": STANDIN_MOBILINT},
                        engines=engines, **overrides)


def engine_lines(text: str) -> dict[str, str]:
    """`check` output → {engine name: its whole line}."""
    lines = [line.split(None, 2) for line in text.splitlines()]
    return {rest.split(":")[0]: line for line, (_, what, rest) in zip(text.splitlines(), lines, strict=True)
            if what == "engine"}


def check(config: Path, home: Path | None = None) -> subprocess.CompletedProcess[str]:
    """`saigeedged check` in its own process (HOME: where paramiko finds the ssh key and known_hosts)."""
    env = dict(os.environ, **({"HOME": str(home)} if home else {}))
    return subprocess.run([sys.executable, "-m", "saigeedged", "check", "-c", str(config)], capture_output=True,
                          text=True, env=env, timeout=120)


def test_every_engine_is_probed_and_the_one_without_cubie_is_named(tmp_path: Path, engine_hosts: Any) -> None:
    """tls, ssh and a local-socket engine each get a line: reachable, server, runtime, each target's image and
    compiler; `nocubie` is FAIL naming the cubie image it lacks, so check exits 3; the VIV SDK's --optimize targets
    are listed once for the engines that share them."""
    engines = [engine_hosts["tls"].config_entry("tls"), engine_hosts["ssh"].config_entry("ssh"),
               engine_hosts["nocubie"].config_entry("unix")]
    assert engine_hosts["ssh"].ssh is not None
    run = check(pool_config(tmp_path, engines), home=engine_hosts["ssh"].ssh.home)
    assert run.returncode == 3, run.stdout + run.stderr
    lines = engine_lines(run.stdout)
    assert list(lines) == ["tls", "ssh", "nocubie"]
    for name in ("tls", "ssh"):
        assert lines[name].startswith(f"ok    engine       {name}: reachable, server "), lines[name]
        assert f"runtime runc; cubie {STANDIN_ACUITY} (pegasus {PEGASUS}); mobilint {STANDIN_MOBILINT} " \
               "(qbcompiler python3 -m qbcompiler)" in lines[name]
    assert lines["nocubie"].startswith("FAIL  engine       nocubie: reachable")
    assert f"lacks cubie image {STANDIN_ACUITY} (docker load -i" in lines["nocubie"]
    assert f"mobilint {STANDIN_MOBILINT} (qbcompiler" in lines["nocubie"]
    sdk = [line for line in run.stdout.splitlines() if line.split()[1] == "viv_sdk"]
    assert len(sdk) == 1 and "VIP9000PICO_PID0XEE" in sdk[0] and sdk[0].endswith("(engine tls, ssh)")  # nocubie: none
    assert "state_dir" in run.stdout and "journald" in run.stdout  # the host's own checks still follow


def test_a_ready_pool_exits_0(tmp_path: Path, engine_hosts: Any) -> None:
    """An engine that serves only the targets whose images it has is ready: ok line, exit 0."""
    entry = {**engine_hosts["nocubie"].config_entry("unix"), "targets": ["mobilint"]}
    out = io.StringIO()
    assert readiness.main(configmod.load(pool_config(tmp_path, [entry])), out) == 0, out.getvalue()
    line = engine_lines(out.getvalue())["nocubie"]
    assert line.startswith("ok") and "cubie" not in line.replace("nocubie", "") and "lacks" not in line


def foreign_ssh_home(tmp_path: Path, ssh_home: Path) -> Path:
    """A HOME that knows the ssh engine's host key but holds a key the engine never authorized."""
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True, mode=0o700)
    shutil.copy(ssh_home / ".ssh" / "known_hosts", home / ".ssh" / "known_hosts")
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(home / ".ssh" / "id_ed25519")], check=True)
    return home


def test_unreachable_engines_say_why(tmp_path: Path, engine_hosts: Any) -> None:
    """Refused, timed out (a SIGSTOPped dockerd), a CA that did not sign the server, an ssh key not authorized:
    each engine's line says which, and check exits 3."""
    tls, ssh = engine_hosts["tls"], engine_hosts["ssh"]
    wrong_ca = {**tls.config_entry("tls")["tls"], "ca": str(tls.tls.client_cert)}
    engines = [{"name": "closed", "url": f"tcp://{tls.addr}:2390", "targets": ["cubie"]},
               {**tls.config_entry("tls"), "name": "badca", "tls": wrong_ca},
               {**ssh.config_entry("ssh"), "name": "badkey"},
               {**engine_hosts["nocubie"].config_entry("unix"), "name": "hung"}]
    config = pool_config(tmp_path, engines, limits={"engine_timeout_s": 3})
    home = foreign_ssh_home(tmp_path, ssh.ssh.home)
    engine_hosts["nocubie"].stop()
    try:
        run = check(config, home)
    finally:
        engine_hosts["nocubie"].cont()
    assert run.returncode == 3, run.stdout + run.stderr
    lines = engine_lines(run.stdout)
    assert all(line.startswith("FAIL") and ": unreachable: " in line for line in lines.values()), run.stdout
    assert "connection refused" in lines["closed"]
    assert "TLS handshake failed" in lines["badca"]
    assert "ssh authentication failed" in lines["badkey"]
    assert "timed out after 3 s" in lines["hung"]
