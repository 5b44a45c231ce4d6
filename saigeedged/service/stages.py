"""What a worker asks of the stages around it: the preparer before a job's container steps (service/ahead.py) and
the finishing stage after them (service/finishing.py). Both know the workers, so a worker knows them only as these."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from saigeedged.adapters.docker import Container
from saigeedged.compile import ahead, pipeline
from saigeedged.jobs import Job


class Ahead(Protocol):
    """What a worker asks of the preparer: host steps of queued jobs done while one compiles."""

    def take(self, job: Job, interrupted: Callable[[], str | None]) -> ahead.Prep | None:
        """The prep made for this attempt of `job` (waited for if in progress), or None: run the host steps now."""


class Finishing(Protocol):
    """What a worker asks of the finishing stage: a job's report, bundle and publication, off its slot."""

    def hand(self, job: Job, compiled: pipeline.Compiled, container: Container | None = None,
             taken: Callable[[], None] = lambda: None) -> bool:
        """Take `job` after its last container step (a host job: after its compile): its report, bundle, publication
        and end are the stage's; `container` (Container.beside): where a container call of its report (cubie's
        simulator) is still to run; `taken()` is called once it is taken, before a finisher can start on it. False:
        jobs enough wait for a finisher already, the worker makes this one's report itself (the stage's backlog, and
        the work dirs it keeps, stay bounded in a burst)."""
