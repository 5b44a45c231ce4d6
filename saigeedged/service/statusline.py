"""What the engine pool is doing, in one line (systemd STATUS=) and as slots (pure: built from rows, no I/O)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from saigeedged.adapters.store import EngineState
from saigeedged.config import Config
from saigeedged.jobs import HOST_ENGINE, Job, status_text


@dataclass(frozen=True)
class SlotView:
    """One slot: a target's container on an engine (host jobs: engine `host`), and the job it runs if any."""

    engine: str
    target: str
    job: Job | None


def doing(job: Job) -> str:
    """`det quantize 5/11` (`det starting` before its first step)."""
    return f"{job.name} {job.step} {job.step_index}/{job.step_count}" if job.step else f"{job.name} starting"


def status_line(slots: Sequence[SlotView], queued: int, down: Sequence[str]) -> str:
    """`compile2: det quantize 5/11; local: idle; 3 queued` (SPEC §11); one engine keeps the line of §9.

    `down` names the engines that do not answer: they show as `down` (with one engine: container jobs wait).
    """
    engines = list(dict.fromkeys([*(s.engine for s in slots if s.engine != HOST_ENGINE), *down]))
    busy = [s.job for s in slots if s.job is not None]
    if len(engines) <= 1 and len(busy) <= 1:
        return status_text(busy[0] if busy else None, queued, engine_down=bool(down))
    parts = []
    for engine in engines + ([HOST_ENGINE] if any(s.engine == HOST_ENGINE and s.job for s in slots) else []):
        jobs = [doing(s.job) for s in slots if s.engine == engine and s.job is not None]
        state = "down" if engine in down else "idle"
        parts.append(f"{engine}: {', '.join(jobs) if jobs else state}{' (down)' if jobs and engine in down else ''}")
    return "; ".join([*parts, f"{queued} queued"])


def slot_views(engines: Sequence[EngineState], running: Sequence[Job]) -> list[SlotView]:
    """The slots of the recorded engines, each with the running job whose attempt is there: the one its worker runs,
    never one the finishing stage holds (Job.finishing: those are listed apart).

    A running job with no engine recorded (started before the pool kept one) sits in the first slot of its target.
    """
    slots = [SlotView(e.name, target, None) for e in engines for target in e.slots]
    for job in (j for j in running if not j.finishing):
        engine = HOST_ENGINE if job.target == "host" else job.engine
        at = next((i for i, s in enumerate(slots) if s.target == job.target and s.job is None
                   and (engine is None or s.engine == engine)), None)
        if at is None and job.target == "host":
            slots.append(SlotView(HOST_ENGINE, "host", job))
        elif at is not None:
            slots[at] = SlotView(slots[at].engine, slots[at].target, job)
    return slots


def configured(config: Config, engines: Sequence[EngineState]) -> list[EngineState]:
    """The recorded engines the config still lists, in its order (a row of an engine since removed is not shown)."""
    recorded = {e.name: e for e in engines}
    names = [spec.name for spec in config.engines]
    return [recorded[name] for name in names if name in recorded]
