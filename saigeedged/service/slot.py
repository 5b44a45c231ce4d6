"""What a worker serves: one slot (engine, target) of the pool, or every target of the one engine (SPEC §11)."""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from saigeedged.engines import LOCAL, TARGETS
from saigeedged.jobs import HOST_ENGINE, Job

ATTEMPT = "attempt"  # an attempt's work dir is work/<job>/attempt<N>


@dataclass
class Slot:
    """The targets a worker takes on `engine` (`host` for host jobs); `pooled`: one slot per (engine, target), as
    with more than one engine; else the one engine's single slot takes every target, one job at a time (SPEC §2)."""

    engine: str = LOCAL
    targets: tuple[str, ...] = TARGETS
    pooled: bool = False
    ready: Callable[[str], bool] = field(default=lambda target: True)  # False: its engine is down or lacks the image
    on_lost: Callable[[str], None] = field(default=lambda reason: None)  # a job found the engine gone
    # may a running job of the target re-attach now? None: when `ready` (a Slurm partition: when Slurm answers, a free
    # node or not: the job holds its node already)
    reattach: Callable[[str], bool] | None = None

    def can_reattach(self, target: str) -> bool:
        return (self.reattach or self.ready)(target)

    def skip(self) -> tuple[str, ...]:
        """The targets this slot takes nothing of now."""
        return tuple(t for t in TARGETS if t not in self.targets or not self.ready(t))

    def engine_of(self, target: str) -> str:
        """The engine an attempt of a `target` job is recorded on."""
        return HOST_ENGINE if target == "host" else self.engine


def work_dir(root: Path, job: Job) -> Path:
    """The work dir of the job's current attempt: each attempt has its own, as a step of an attempt given up on may
    still write there until its engine answers; the preparer stages a queued job's host steps in it too.

    A step started by a daemon from before this layout (one engine kept one folder per job) is still found there:
    an upgrade during a compile re-attaches to it (SPEC §16)."""
    legacy, own = root / job.job_id, _own(root, job)
    # an attempt started by this daemon made its folder first (fresh): a legacy folder kept for its reap is not its
    return legacy if (legacy / ".steps").is_dir() and not own.is_dir() else own


def attempt_dir(root: Path, job: Job) -> Path:
    """The work dir an attempt of `job` that starts now gets (its number is the queued job's `attempt`)."""
    return _own(root, job)


def _own(root: Path, job: Job) -> Path:
    return root / job.job_id / f"{ATTEMPT}{job.attempt}"


def attempt_of(work: Path) -> int | None:
    """The attempt number of an attempt's work dir; None for a legacy job folder."""
    number = work.name.removeprefix(ATTEMPT)
    return int(number) if work.name.startswith(ATTEMPT) and number.isdigit() else None


def fresh_work_dir(root: Path, job: Job) -> Path:
    """An empty work dir for an attempt that starts now (not re-attached): its own, even beside a legacy folder."""
    own = _own(root, job)
    shutil.rmtree(own, ignore_errors=True)
    own.mkdir(parents=True)
    return own


def remove_work(work: Path) -> None:
    """Remove an attempt's work dir, and the job's folder once no attempt of it is left there."""
    shutil.rmtree(work, ignore_errors=True)
    if attempt_of(work) is not None:  # a legacy job folder's parent is the work root, bind-mounted: it stays
        with contextlib.suppress(OSError):
            work.parent.rmdir()
