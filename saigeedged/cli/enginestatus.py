"""What `saigeedged status` says about the engine pool (SPEC §11): engines and their slots, a job's attempts."""

from __future__ import annotations

from collections.abc import Sequence

from saigeedged.adapters.store import EngineState
from saigeedged.config import Config
from saigeedged.guards import printable
from saigeedged.jobs import Job
from saigeedged.service.statusline import doing, slot_views


def pool_configured(config: Config) -> bool:
    """True when the config lists engines: without `engines:` the output stays what it was for the one local engine."""
    return bool(config.raw.get("engines"))


def engine_lines(engines: Sequence[EngineState], running: Sequence[Job]) -> list[str]:
    """A header, then one line per engine: name, up/down, each slot `target: job step i/n` or idle, why it is down."""
    slots = slot_views(engines, running)
    lines = [f"{'ENGINE':<16} {'STATE':<5} SLOTS"]
    for engine in engines:
        busy = [f"{s.target}: {doing(s.job) if s.job else 'idle'}" for s in slots if s.engine == engine.name]
        why = "" if engine.up else f"  ({engine.reason or 'no answer'}, since {engine.since})"
        lines.append(printable(f"{engine.name:<16} {'up' if engine.up else 'down':<5} {'; '.join(busy) or 'no slots'}{why}"))
    return lines


def attempt_lines(job: Job) -> list[str]:
    """The engine of the job's current/last attempt and every attempt: where, when, how it ended."""
    lines = [f"engine {job.engine or '-'}"]
    for number, attempt in enumerate(job.attempts, 1):
        if attempt.get("finished_at") is None:
            lines.append(f"attempt {number} on {attempt['engine']} since {attempt['started_at']}")
        else:
            lines.append(f"attempt {number} on {attempt['engine']} {attempt['started_at']} .. {attempt['finished_at']}: "
                         f"{attempt.get('error') or 'ok'}")
    return [printable(line) for line in lines]
