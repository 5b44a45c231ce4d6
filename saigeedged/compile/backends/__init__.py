"""Compiler backends: each plans its steps and turns prepared inputs into an Artifact."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, cast

from saigeedged.adapters.joblog import JobLog
from saigeedged.compile import child
from saigeedged.errors import SaigeError

if TYPE_CHECKING:
    from saigeedged.adapters.docker import Container
    from saigeedged.compile.inputs import Prepared
    from saigeedged.config import Config
    from saigeedged.manifest import Entry


@dataclass
class Artifact:
    """What a backend produced: the bundle members and its part of checkpoint.yaml."""

    model_member: str
    members: dict[str, Path]
    quantization: dict[str, Any]
    platform: dict[str, Any] | None = None
    image: str | None = None
    image_id: str | None = None
    report: dict[str, Any] | None = None


@dataclass
class Context:
    """What a backend may use: the job log, the step marker, the config and (docker targets) its container."""

    log: JobLog
    step: Callable[[str], None]
    config: Config
    container: Callable[[str], Container] | None = None
    progress: Callable[[dict[str, Any]], None] = field(default=lambda event: None)
    deadline: float | None = None  # time.monotonic() limit for the whole job
    interrupted: Callable[[], str | None] = field(default=lambda: None)  # "stop" | "cancel" once the job must end
    # False once the store no longer names this attempt (requeued off a lost engine): it may not write what others
    # read, the cache included (SPEC §15)
    current: Callable[[], bool] = field(default=lambda: True)

    def step_timeout(self) -> int:
        """Seconds one step may take: limits.step_timeout_s, or less when the job's deadline is nearer."""
        limit = self.config.limits.step_timeout_s
        if self.deadline is None:
            return limit
        remaining = int(self.deadline - time.monotonic())
        if remaining <= 0:
            raise SaigeError("TIMEOUT", "the job ran longer than limits.job_timeout_s")
        return min(limit, remaining)

    def in_child(self, fn: Callable[..., Any], args: Sequence[Any], label: str) -> Any:
        """fn(*args) in a compile child (compile.child.run): bounded by the step's timeout and
        limits.child_memory_bytes (OUT_OF_MEMORY past it), ended by the job's stop or cancel."""
        return child.run(fn, args, label, self.step_timeout(), self.interrupted,
                         (self.config.limits.child_memory_bytes, "OUT_OF_MEMORY"))

    def in_background(self, fn: Callable[..., Any], args: Sequence[Any], label: str) -> Any:
        """fn(*args) in a compile child that yields the CPU to compiles (the report, at report.REPORT_NICE): its wall
        time is what the compiles beside it leave it, so it is bounded by the CPU it uses, limits.step_timeout_s on
        every core this process may use (what the step's wall-time bound allowed it on an idle host), and only the
        job's deadline bounds its wall time; memory, stop and cancel as in_child."""
        limits = self.config.limits
        wall = limits.job_timeout_s if self.deadline is None else self.deadline - time.monotonic()
        if wall <= 0:
            raise SaigeError("TIMEOUT", "the job ran longer than limits.job_timeout_s")
        cores = len(os.sched_getaffinity(0))
        return child.run(fn, args, label, wall, self.interrupted, (limits.child_memory_bytes, "OUT_OF_MEMORY"),
                         (limits.step_timeout_s * cores, f"limits.step_timeout_s on {cores} cores"))


class Backend(Protocol):
    def steps(self, entry: Entry) -> list[str]: ...

    def compile(self, prep: Prepared, ctx: Context) -> Artifact: ...


def get(target: str) -> Backend:
    """The backend module for a target (modules satisfy the Backend protocol)."""
    import importlib

    return cast(Backend, importlib.import_module(f"saigeedged.compile.backends.{target}"))
