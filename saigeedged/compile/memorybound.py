"""Which memory bound a child ran into (issue 25): its address-space limit (RLIMIT_AS, from limits.child_memory_bytes
or the hard limit the daemon runs under) or the cgroup's (the unit's MemoryMax=), named in an OUT_OF_MEMORY error."""

from __future__ import annotations

import signal
from dataclasses import dataclass
from pathlib import Path

from saigeedged.errors import Code, SaigeError

UNLIMITED = 1 << 62  # cgroup v1 writes "no limit" as a page-rounded 2**63 - 1
SERVER_BYTES = 200 << 20  # what the fork server maps once it has imported onnxruntime (VmPeak 198 MB, measured)


@dataclass(frozen=True)
class Bound:
    """The RLIMIT_AS a child set before its work, and whether the hard limit it inherited (prlimit --as, ulimit -v,
    LimitAS=) capped it below limits.child_memory_bytes."""

    limit: int
    hard: bool


ALLOCATION_FAILED = ("Failed to allocate memory", "bad_alloc")  # onnxruntime's arena and C++ allocators, raised as Fail


def allocation_failed(exc: BaseException) -> bool:
    """Did the work fail for want of memory: Python's MemoryError, or onnxruntime's own allocation failure (its
    BFC arena raises a plain `Fail` naming it, not MemoryError)?"""
    return isinstance(exc, MemoryError) or any(text in str(exc) for text in ALLOCATION_FAILED)


def cgroup_limit(proc_cgroup: str, root: Path = Path("/sys/fs/cgroup")) -> int | None:
    """The memory limit of the cgroup in `proc_cgroup` (the text of /proc/self/cgroup): v2 memory.max, v1
    memory.limit_in_bytes; None when there is none."""
    for line in proc_cgroup.splitlines():
        _, controllers, path = line.split(":", 2)
        rel = path.lstrip("/")
        if controllers == "":
            files = [root / rel / "memory.max", root / "unified" / rel / "memory.max"]
        elif "memory" in controllers.split(","):
            files = [root / "memory" / rel / "memory.limit_in_bytes"]
        else:
            continue
        for file in files:
            try:
                text = file.read_text().strip()
            except OSError:
                continue
            if text.isdigit() and int(text) < UNLIMITED:
                return int(text)
    return None


def exceeded(label: str, code: Code, configured: int, bound: Bound) -> SaigeError:
    """A MemoryError (or an allocator's abort) under the child's address-space limit."""
    if bound.hard:
        return SaigeError(code, f"{label} ran out of memory at the address-space limit RLIMIT_AS ({bound.limit} bytes) "
                          f"the daemon runs under (prlimit --as, ulimit -v or the unit's LimitAS=), below "
                          f"limits.child_memory_bytes ({configured} bytes)", bound="RLIMIT_AS",
                          hint="raise or remove that address-space limit, or give the job a smaller input (for the "
                          "accuracy report: fewer `eval_samples`)")
    return SaigeError(code, f"{label} needs more than limits.child_memory_bytes ({configured} bytes) of memory",
                      bound="limits.child_memory_bytes",
                      hint="the input is too large for this host's bound: make it smaller (for the accuracy "
                      "report: fewer `eval_samples`), or raise limits.child_memory_bytes (the service's MemoryMax= "
                      "too) if the host has the memory")


def starved(label: str, what: str, hard_as: int | None, cgroup: int | None) -> SaigeError:
    """The children's fork server (onnxruntime loaded once for all of them) `what` (died, could not start) for want
    of memory, before any work: OUT_OF_MEMORY naming the bound, the hard RLIMIT_AS the daemon runs under when it has
    one, else the cgroup's limit, else the host's memory."""
    server = f"{label}: the fork server that runs onnxruntime for the job's host-side work {what}"
    if hard_as is not None:
        return SaigeError("OUT_OF_MEMORY", f"{server}, at the address-space limit RLIMIT_AS ({hard_as} bytes) the daemon "
                          "runs under (prlimit --as, ulimit -v or the unit's LimitAS=)", bound="RLIMIT_AS",
                          hint="raise or remove that address-space limit (prlimit --as, ulimit -v, LimitAS=): the "
                          f"fork server maps about {SERVER_BYTES >> 20} MB with onnxruntime loaded, before any work")
    if cgroup is not None:
        return SaigeError("OUT_OF_MEMORY", f"{server}, at the cgroup memory limit ({cgroup} bytes: the unit's "
                          "MemoryMax=)", bound="MemoryMax", hint="raise MemoryMax= (systemctl edit saigeedged)")
    return SaigeError("OUT_OF_MEMORY", f"{server}: the host ran out of memory", bound="host",
                      hint="the host has too little free memory for onnxruntime: free some, or add memory")


def own_cgroup_limit() -> int | None:
    """The memory limit of this process's cgroup (the unit's MemoryMax=), None when there is none."""
    with open("/proc/self/cgroup") as fh:
        return cgroup_limit(fh.read())


def someones_kill(status: int, ooms: int | None) -> bool:
    """Was a SIGKILL (`status` -9) someone's `kill -9`, not the OOM killer's: the kernel counted no OOM kill since
    `ooms` (oom_kills() before the process started)?"""
    return status == -signal.SIGKILL and ooms is not None and (oom_kills() or 0) <= ooms


def oom_kills(vmstat: Path = Path("/proc/vmstat")) -> int | None:
    """How many processes the kernel's OOM killer has killed since boot (None where the kernel does not say)."""
    try:
        for line in vmstat.read_text().splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill":
                return int(value)
    except (OSError, ValueError):
        pass
    return None


def killed(label: str, code: Code, cgroup: int | None) -> SaigeError:
    """A child SIGKILLed while bounded: the kernel's OOM killer, at the cgroup's limit when there is one."""
    if cgroup is not None:
        return SaigeError(code, f"{label} was killed at the cgroup memory limit ({cgroup} bytes: the unit's MemoryMax=)",
                          bound="MemoryMax", hint="raise MemoryMax= (systemctl edit saigeedged), or give the job a "
                          "smaller input (for the accuracy report: fewer `eval_samples`)")
    return SaigeError(code, f"{label} was killed by the kernel's OOM killer (the host ran out of memory)", bound="host",
                      hint="the host has too little free memory for this job: lower limits.child_memory_bytes so a "
                      "job fails before the host runs out, or add memory")
