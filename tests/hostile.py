"""Helpers of the hostile-input tests: the canary drop that must still succeed, and the daemon's memory."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from harness import Daemon, drop, wait_for

FINAL = ("succeeded", "failed", "cancelled")
RSS_BOUND = 200 << 20  # the daemon's peak resident memory after any hostile drop (about 65 MB measured here)


def peak_rss(d: Daemon) -> int:
    """The daemon process's peak resident set (VmHWM) in bytes; its child processes are not counted."""
    assert d.proc is not None
    for line in Path(f"/proc/{d.proc.pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM")


def canary(d: Daemon, det_inputs: dict[str, Any], name: str = "canary", folder: Path | None = None) -> dict[str, Any]:
    """A valid drop placed after the bad ones succeeds, and the daemon stayed within RSS_BOUND."""
    drop(folder or d.inbox, name, det_inputs["onnx"], det_inputs["manifest"])
    done = d.wait_job(name, timeout=120)
    assert done["state"] == "succeeded", done
    assert peak_rss(d) < RSS_BOUND, f"daemon peak RSS {peak_rss(d) >> 20} MiB"
    return done


def final(d: Daemon, manifest: str, timeout: float = 60) -> dict[str, Any]:
    """The final status of the job made from the manifest named `manifest` (as its status file prints it)."""
    def find() -> dict[str, Any] | None:
        return next((s for s in d.statuses() if s["inputs"]["manifest"] == manifest and s["state"] in FINAL), None)

    return wait_for(find, timeout, f"a final status for {manifest}\n{d.stderr()[-3000:]}")  # type: ignore[no-any-return]
