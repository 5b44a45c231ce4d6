"""What `saigeedged status` says about the engines (SPEC §11, §15: one engine is a pool of one): engines and their
slots, a job's attempts."""

from __future__ import annotations

from collections.abc import Sequence

from saigeedged.adapters.store import EngineState
from saigeedged.config import Config
from saigeedged.guards import printable
from saigeedged.jobs import HOST_ENGINE, QUEUED, Job
from saigeedged.service.statusline import configured, doing, slot_views


def pool_configured(config: Config) -> bool:
    """True when the config lists engines (`check` probes each of them; without, the local engine as before)."""
    return bool(config.raw.get("engines"))


def engine_lines(config: Config, recorded: Sequence[EngineState], running: Sequence[Job]) -> list[str]:
    """A header, then one line per configured engine: name, up/down, each slot `target: job step i/n` or idle, why
    it is down; an engine the daemon has not recorded yet (not started since it was added) says so; the host jobs'
    slot; then the jobs of the finishing stage, if any (their slots run the next job meanwhile)."""
    engines = configured(config, recorded)
    slots = slot_views(engines, running)
    lines = [f"{'ENGINE':<16} {'STATE':<5} SLOTS"]
    for engine in engines:
        busy = [f"{s.target}: {doing(s.job) if s.job else 'idle'}" for s in slots if s.engine == engine.name]
        why = "" if engine.up else f"  ({engine.reason or 'no answer'}, since {engine.since})"
        lines.append(printable(f"{engine.name:<16} {'up' if engine.up else 'down':<5} {'; '.join(busy) or 'no slots'}{why}"))
    known = {e.name for e in engines}
    for spec in config.engines:
        if spec.name not in known:
            lines.append(printable(f"{spec.name:<16} {'?':<5} not seen by the daemon yet (is it running with this config?)"))
    hosted = [doing(s.job) for s in slots if s.engine == HOST_ENGINE and s.job is not None]  # host jobs' own slot
    lines.append(printable(f"{'this host':<16} {'up':<5} host: {'; '.join(hosted) or 'idle'}"))
    ending = [f"{job.target}: {doing(job)}" for job in running if job.finishing]
    if ending:
        lines.append(printable(f"{'finishing':<16} {'-':<5} {'; '.join(ending)}"))
    return lines


def attempt_lines(job: Job) -> list[str]:
    """The engine of the job's current/last attempt and every attempt: where, when, how it ended. Numbered by the job's
    attempt each was (a retried job's next is 2, as its status file says; records older than that number, by place);
    a queued job's last line is the attempt it waits to start."""
    lines = [f"engine {job.engine or '-'}"]
    for place, attempt in enumerate(job.attempts, 1):
        number = attempt.get("attempt", place)
        if attempt.get("finished_at") is None:
            lines.append(f"attempt {number} on {attempt['engine']} since {attempt['started_at']}")
        else:
            how = "stopped with the daemon" if attempt.get("stopped") else attempt.get("error") or "ok"
            lines.append(f"attempt {number} on {attempt['engine']} {attempt['started_at']} .. {attempt['finished_at']}: {how}")
    if job.state == QUEUED:
        lines.append(f"attempt {job.attempt} queued")
    return [printable(line) for line in lines]
