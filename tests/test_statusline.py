"""The STATUS= line of the engine pool (SPEC §11): busy slots named per engine, idle and down engines, the queue;
with one engine the line of §9, unchanged."""

from __future__ import annotations

from typing import Any

from saigeedged.adapters.store import EngineState
from saigeedged.jobs import RUNNING, Job, begin_attempt
from saigeedged.service.statusline import SlotView, slot_views, status_line


def job(name: str, target: str = "cubie", step: str | None = "quantize", index: int = 5, count: int = 11,
        **fields: Any) -> Job:
    return Job(job_id=f"{name}-1", name=name, target=target, task="detection", entry={}, subdir="", claim_dir="/c",
               manifest="x.yml", state=RUNNING, step=step, step_index=index, step_count=count, **fields)


def test_busy_slots_are_named_per_engine() -> None:
    """Several engines: each busy engine with its jobs, idle ones as idle, then the queue (the SPEC's example)."""
    slots = [SlotView("compile2", "cubie", job("det")), SlotView("local", "cubie", None),
             SlotView("local", "mobilint", None)]
    assert status_line(slots, 3, []) == "compile2: det quantize 5/11; local: idle; 3 queued"


def test_an_engine_with_two_busy_slots_and_a_down_engine() -> None:
    """Both slots of one engine busy are listed together; a down engine says down; a busy host slot is named too."""
    slots = [SlotView("local", "cubie", job("det")), SlotView("local", "mobilint", job("seg", "mobilint", "parse", 4, 7)),
             SlotView("compile3", "cubie", None), SlotView("host", "host", job("cls", "host", None))]
    assert status_line(slots, 0, ["compile3"]) == \
        "local: det quantize 5/11, seg parse 4/7; compile3: down; host: cls starting; 0 queued"
    assert status_line(slots[:2], 1, ["compile3"]) == "local: det quantize 5/11, seg parse 4/7; compile3: down; 1 queued"


def test_one_engine_keeps_the_line_of_section_9() -> None:
    """With one engine the line is exactly today's: idle, compiling, and the engine-unreachable note."""
    idle = [SlotView("local", "cubie", None), SlotView("local", "mobilint", None), SlotView("host", "host", None)]
    assert status_line(idle, 0, []) == "idle, 0 queued"
    busy = [SlotView("local", "cubie", job("det", step="quantize", index=8)), *idle[1:]]
    assert status_line(busy, 3, []) == "compiling det (quantize 8/11), 3 queued"
    assert status_line(idle, 2, ["local"]) == "idle, 2 queued, Docker engine unreachable: container jobs wait"
    host = [*idle[:2], SlotView("host", "host", job("cls", "host", "wrap", 4, 8))]
    assert status_line(host, 1, []) == "compiling cls (wrap 4/8), 1 queued"


def test_slots_of_recorded_engines_hold_their_running_jobs() -> None:
    """slot_views: a job sits in the slot of its attempt's engine and target; one without an engine in its target's
    first free slot; a host job in the host slot."""
    engines = [EngineState("local", True, None, "t", ("cubie", "mobilint")), EngineState("compile2", True, None, "t", ("cubie",))]
    remote, old, host = job("det"), job("seg"), job("cls", "host")
    begin_attempt(remote, "compile2", "t")
    begin_attempt(host, "host", "t")
    slots = slot_views(engines, [remote, old, host])
    assert [(s.engine, s.target, s.job.name if s.job else None) for s in slots] == \
        [("local", "cubie", "seg"), ("local", "mobilint", None), ("compile2", "cubie", "det"), ("host", "host", "cls")]


def test_a_slot_holds_the_job_its_worker_runs_not_the_one_finishing() -> None:
    """A job handed to the finishing stage beside the one its slot now compiles: the slot holds the compiling one, in
    either order of the rows (it held the finishing one, the compiling one shown nowhere), whatever the handed job's
    step: still `export` while it waits for a finisher, or `bundle`."""
    engines = [EngineState("local", True, None, "t", ("cubie",))]
    for step, index in (("bundle", 10), ("export", 9)):
        ending, compiling = job("sl1", step=step, index=index, finishing=True), job("sl2")
        for running in ([ending, compiling], [compiling, ending]):
            (slot,) = slot_views(engines, running)
            assert slot.job is compiling and ending.finishing and not compiling.finishing
        (slot,) = slot_views(engines, [ending])
        assert slot.job is None  # its worker is free: the finishing stage makes the report


def test_a_job_its_own_worker_bundles_and_publishes_holds_its_slot() -> None:
    """Not handed over (the stage's backlog was full, a Slurm job with a simulator report): a job in its `bundle` or
    `publish` step is its slot's (the slot showed idle, the job listed as finishing)."""
    engines = [EngineState("local", True, None, "t", ("cubie",))]
    for step in ("bundle", "publish"):
        own = job("sl3", step=step, index=11)
        (slot,) = slot_views(engines, [own])
        assert slot.job is own and not own.finishing
