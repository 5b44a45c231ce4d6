"""What a worker serves: one slot (engine, target) of the pool, or every target of the one engine (SPEC §11)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from saigeedged.engines import LOCAL
from saigeedged.jobs import HOST_ENGINE, Job

ALL_TARGETS = ("cubie", "mobilint", "host")


@dataclass
class Slot:
    """The targets a worker takes on `engine` (`host` for host jobs); `pooled`: more than one engine, so a job whose
    engine stops answering goes to another one (ENGINE_LOST) instead of waiting for it (DOCKER_UNAVAILABLE)."""

    engine: str = LOCAL
    targets: tuple[str, ...] = ALL_TARGETS
    pooled: bool = False
    ready: Callable[[str], bool] = field(default=lambda target: True)  # False: its engine is down or lacks the image
    on_lost: Callable[[str], None] = field(default=lambda reason: None)  # a job found the engine gone
    on_back: Callable[[], None] = field(default=lambda: None)  # the one engine answers again (its outage ended)

    def skip(self) -> tuple[str, ...]:
        """The targets this slot takes nothing of now."""
        return tuple(t for t in ALL_TARGETS if t not in self.targets or not self.ready(t))

    def engine_of(self, target: str) -> str:
        """The engine an attempt of a `target` job is recorded on."""
        return HOST_ENGINE if target == "host" else self.engine

    def work_dir(self, root: Path, job: Job) -> Path:
        """The job's work dir: in a pool each attempt has its own, as a step of an attempt lost with its engine may
        still write; the preparer stages a queued job's host steps in it too."""
        return root / job.job_id / f"attempt{job.attempt}" if self.pooled else root / job.job_id
