"""Compiler backends: each plans its steps and turns prepared inputs into an Artifact."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, cast

from saigeedged.joblog import JobLog

if TYPE_CHECKING:
    from saigeedged.config import Config
    from saigeedged.container import Container
    from saigeedged.inputs import Prepared
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


class Backend(Protocol):
    def steps(self, entry: Entry) -> list[str]: ...

    def compile(self, prep: Prepared, ctx: Context) -> Artifact: ...


def get(target: str) -> Backend:
    """The backend module for a target (modules satisfy the Backend protocol)."""
    import importlib

    return cast(Backend, importlib.import_module(f"saigeedged.backends.{target}"))
