"""Where a machine's CPU goes while a command runs (not a test): every second, the user+system time each process used
since the last look, summed by what its command line says it is (a daemon, a forkserver child, pip, dpkg, dockerd...),
and the machine's busy share a second. Used to find what made CI slow (README, "The suite is CPU-bound").

    python3 bench/cpusample.py OUT.json -- CI=true bash .ci/run

A process that lives less than a second between two looks is missed (its parent's share is not counted either): the
sums are a lower bound, the busy share (from /proc/stat) is whole.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

HZ = os.sysconf("SC_CLK_TCK")
KINDS = ("dockerd", "containerd-shim", "containerd", "runc", "docker", "mmdebstrap", "dpkg", "apt", "pip", "gzip",
         "lintian", "perl", "slurmd", "slurmctld", "munged", "systemd", "mypy", "ruff", "bash", "python")


def kind(pid: int) -> str:
    """What the process is, by its command line."""
    try:
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")[:300]
    except OSError:
        return "?"
    words = cmd.split()
    if "saigeedged" in cmd and ("-m saigeedged" in cmd or "/bin/saigeedged" in cmd):
        return "saigeedged " + (words[3] if words[1:3] == ["-m", "saigeedged"] and len(words) > 3 else "?")
    if "forkserver" in cmd or "multiprocessing" in cmd:
        return "forkserver and its children"
    if "pytest" in cmd or "exec(eval(sys.stdin.readline()))" in cmd:
        return "pytest and its workers"
    return next((k for k in KINDS if k in cmd), words[0] if words else "kernel or zombie")


def ticks(pid: int) -> tuple[int, int] | None:
    """(start time, user+system ticks) of the process."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        fields = stat[stat.rindex(")") + 2:].split()
        return int(fields[19]), int(fields[11]) + int(fields[12])
    except (OSError, ValueError, IndexError):
        return None


def busy() -> tuple[int, int]:
    values = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:9]]
    return values[3] + values[4], sum(values)


def sample(stop: threading.Event) -> dict[str, Any]:
    seen: dict[int, tuple[int, int, str]] = {}
    used: Counter[str] = Counter()
    timeline, start, last = [], time.monotonic(), busy()
    for pid in (int(p) for p in os.listdir("/proc") if p.isdigit()):  # what ran before is not counted
        if (t := ticks(pid)) is not None:
            seen[pid] = (t[0], t[1], kind(pid))
    while not stop.wait(1.0):
        for pid in (int(p) for p in os.listdir("/proc") if p.isdigit()):
            if (t := ticks(pid)) is None:
                continue
            old = seen.get(pid)
            if old is None or old[0] != t[0]:  # new (or a pid reused)
                old = (t[0], 0, kind(pid))
            used[old[2]] += t[1] - old[1]
            seen[pid] = (t[0], t[1], old[2])
        now = busy()
        idle, total = now[0] - last[0], now[1] - last[1]
        timeline.append((round(time.monotonic() - start), round(1 - idle / max(1, total), 2)))
        last = now
    return {"cpu_seconds": {k: round(v / HZ, 1) for k, v in used.most_common()}, "busy_share": timeline}


def main() -> int:
    if len(sys.argv) < 4 or sys.argv[2] != "--":
        print(__doc__)
        return 2
    stop, result = threading.Event(), dict[str, Any]()
    thread = threading.Thread(target=lambda: result.update(sample(stop)))
    thread.start()
    started = time.monotonic()
    code = subprocess.run(" ".join(sys.argv[3:]), shell=True, check=False).returncode
    stop.set()
    thread.join()
    result["seconds"], result["exit"] = round(time.monotonic() - started), code
    Path(sys.argv[1]).write_text(json.dumps(result, indent=1))
    shares = [s for _, s in result["busy_share"]]
    print(f"{result['seconds']} s, busy {sum(shares) / max(1, len(shares)):.0%}; CPU seconds by kind:")
    for name, seconds in list(result["cpu_seconds"].items())[:15]:
        print(f"  {seconds:8.1f}  {name}")
    return code


if __name__ == "__main__":
    sys.exit(main())
