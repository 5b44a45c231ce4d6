"""The children's machinery (fork server, preload) under an address-space limit too tight for it: the job fails
OUT_OF_MEMORY naming RLIMIT_AS, the daemon goes on and the next job gets a fresh fork server."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from harness import drop

pytestmark = pytest.mark.memory

# enough for the daemon (and the CLI) to start and run, too little for the fork server to import onnxruntime
TIGHT_AS = 180_000_000


def test_a_daemon_whose_fork_server_cannot_start_fails_its_jobs_out_of_memory(daemon: Any,
                                                                              det_inputs: dict[str, Any]) -> None:
    """Under `prlimit --as=180000000` every host job fails OUT_OF_MEMORY at validate naming RLIMIT_AS (it was INTERNAL
    "EOFError", "a bug in saigeedged"); the daemon keeps running and the next job starts a fork server afresh."""
    d = daemon()
    assert d.stop() == 0
    d.prefix = ["prlimit", f"--as={TIGHT_AS}"]
    d.start()
    for name in ("first", "second"):
        drop(d.inbox, name, det_inputs["onnx"], det_inputs["manifest"])
        doc = d.wait_job(name, timeout=120)
        assert doc["state"] == "failed" and doc["error"]["code"] == "OUT_OF_MEMORY", doc
        assert doc["error"]["step"] == "validate" and f"RLIMIT_AS ({TIGHT_AS} bytes)" in doc["error"]["message"], doc
        assert "fork server" in doc["error"]["message"] and "prlimit" in doc["error"]["hint"], doc
    assert d.proc is not None and d.proc.poll() is None


def test_the_cli_under_a_limit_too_tight_for_its_children_fails_out_of_memory(det_inputs: dict[str, Any],
                                                                             tmp_path: Path) -> None:
    """`prlimit --as=180000000 saigeedged compile` exits 1 with OUT_OF_MEMORY naming RLIMIT_AS, not INTERNAL."""
    config = tmp_path / "cfg.yml"
    config.write_text(yaml.safe_dump({"inbox": str(tmp_path / "inbox"), "outbox": str(tmp_path / "outbox"),
                                      "state_dir": str(tmp_path / "state"), "cache": {"max_bytes": 0}}))
    manifest = tmp_path / "m_host.yml"
    manifest.write_text(yaml.safe_dump({**det_inputs["manifest"], "onnx": str(det_inputs["onnx"]), "target": "host",
                                        "output": str(tmp_path / "out" / "det.saigeedge")}))
    done = subprocess.run(["prlimit", f"--as={TIGHT_AS}", sys.executable, "-m", "saigeedged", "compile", str(manifest),
                           "-c", str(config)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "OUT_OF_MEMORY: validate: the fork server" in done.stdout and f"RLIMIT_AS ({TIGHT_AS} bytes)" in done.stdout, \
        done.stdout + done.stderr


@pytest.mark.parametrize("limit", ["240000000", "6000000000"])
def test_the_daemon_starts_and_compiles_under_an_address_space_limit(daemon: Any, det_inputs: dict[str, Any],
                                                                     limit: str) -> None:
    """Under `prlimit --as=240000000` the daemon starts (its threads' malloc arenas, 64 MB of address space each, took
    the room of their stacks: "can't start new thread") and a host job, whose fork server fits, succeeds; so it does
    under 6 GB (LimitAS=), where limits.child_memory_bytes (24 GiB by default) gives way to the hard limit."""
    d = daemon()
    assert d.stop() == 0
    d.prefix = ["prlimit", f"--as={limit}"]
    d.start()
    drop(d.inbox, "det", det_inputs["onnx"], det_inputs["manifest"])
    doc = d.wait_job("det", timeout=120)
    assert doc["state"] == "succeeded", doc
