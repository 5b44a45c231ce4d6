"""Variant sweeps (SPEC §17): each variant compiled through the cache in its own folder (compile_all, in the job's
slot), then each evaluated (chosen, where a single job's report is made: the finishing stage, beside the next job's
steps, issue 25); the best one that passes the gate is the one published."""

from __future__ import annotations

import dataclasses
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from saigeedged import accuracytable, files, quantization
from saigeedged.compile import backends, reuse
from saigeedged.compile.backends import Context
from saigeedged.compile.inputs import Prepared
from saigeedged.manifest import Entry

if TYPE_CHECKING:
    from saigeedged.compile.report import Plan

UNCOMPARED = ("no held-out image (eval_samples 0, or calibration used every image): the variants cannot be compared, "
              "so only the first is compiled and published")


def label(index: int, overrides: dict[str, Any]) -> str:
    """A variant's name: its own `name`, else its overrides."""
    shown = ", ".join(f"{k} {v}" for k, v in overrides.items() if k != "name")
    return str(overrides.get("name") or shown or f"variant {index + 1}")


def _linked(src: Path, dest: Path) -> None:
    """The job's top-level input files (the models, external data, dataset.txt) in the variant's folder: the
    compilers find them by relative name in their working directory."""
    dest.mkdir(parents=True, exist_ok=True)
    for item in src.iterdir():  # regular files only: a link a step of an earlier variant left is not followed
        if files.written_inside(item, src) is None and not (dest / item.name).exists():
            try:
                os.link(item, dest / item.name)
            except OSError:
                shutil.copyfile(item, dest / item.name)


def entry_of(entry: Entry, overrides: dict[str, Any]) -> Entry:
    """One variant's entry: the base entry with the variant's overrides applied, no variants."""
    return dataclasses.replace(entry, variants=None, **{k: v for k, v in overrides.items() if k != "name"})


def backend_steps(entry: Entry) -> list[str]:
    """The compiler steps an entry runs; a sweep's: every step some variant runs, in the backend's order (a variant
    that adds hybrid_topn runs cubie's `hybrid`, which its base entry does not)."""
    backend = backends.get(entry.target)
    if not entry.variants:
        return backend.steps(entry)
    merged: list[str] = []
    for overrides in entry.variants:
        steps = backend.steps(entry_of(entry, overrides))
        for i, name in enumerate(steps):
            if name not in merged:  # after the step it follows in this variant's own order
                merged.insert(merged.index(steps[i - 1]) + 1 if i else 0, name)
    return merged


def prepared(prep: Prepared, index: int, overrides: dict[str, Any]) -> Prepared:
    """The prepared inputs of one variant: its entry (the overrides applied, no variants) in work/variantN/."""
    entry = entry_of(prep.entry, overrides)
    work = prep.work_dir / f"variant{index + 1}"
    _linked(prep.work_dir, work)
    model = work / prep.model.name
    return dataclasses.replace(prep, entry=entry, work_dir=work, model=model,
                               info=dataclasses.replace(prep.info, path=model))


def score(measured: dict[str, Any] | None) -> tuple[bool, float, float]:
    """How variants rank: passing first, then the worst cosine, then the smallest mAP drop."""
    if measured is None:
        return False, 0.0, 0.0
    drop = (measured.get("task") or {}).get("drop")
    return bool(measured["gate"]["passed"]), accuracytable.worst_cosine(measured) or 0.0, -(drop or 0.0)


def _row(index: int, overrides: dict[str, Any], made: reuse.Made, measured: dict[str, Any] | None) -> dict[str, Any]:
    task = (measured or {}).get("task") or {}
    return {"variant": index + 1, "name": label(index, overrides), "overrides": overrides,
            "cache_hit": made.hit, "worst_cosine": accuracytable.worst_cosine(measured) if measured else None,
            "map_drop": task.get("drop"), "passed": bool(measured and measured["gate"]["passed"])}


@dataclasses.dataclass
class Swept:
    """A sweep's outcome: the published variant's prep, compile and report (with the table), and which it is
    (checkpoint.yaml's `variant`)."""

    prep: Prepared
    made: reuse.Made
    measured: dict[str, Any] | None
    variant: dict[str, Any]


@dataclasses.dataclass(frozen=True)
class Candidate:
    """One compiled variant: its index in the manifest's list, prep, compile, and its report still to make (None:
    no held-out image)."""

    index: int
    prep: Prepared
    made: reuse.Made
    planned: Plan | None


@dataclasses.dataclass(frozen=True)
class Sweep:
    """Every variant a sweep compiled (compile_all), their reports not made yet."""

    entry: Entry
    candidates: list[Candidate]


def compared(prep: Prepared, ctx: Context, skip: Callable[[list[str]], None]) -> list[tuple[int, dict[str, Any]]]:
    """The variants a sweep compiles, each with its index: without a held-out image (nothing to rank them by) only the
    first; else each but those that compile the same model as an earlier one (quantization.compiled_as: a setting
    the target's compiler is never given), which would be the same artifact judged by settings the board never ran
    (mobilint: every variant the same .mxq). Each left out is said in the job log; `skip` gets the steps only the
    variants left out would have run."""
    rows = prep.entry.variants or []
    if not prep.held_out:
        ctx.log.line(f"variants: {UNCOMPARED}: {label(0, rows[0])}")
        kept = [(0, rows[0])]
    else:
        twins = folded(prep.entry)
        kept = [(i, overrides) for i, overrides in enumerate(rows) if i not in twins]
        for i, same in twins.items():
            ctx.log.line(f"variants: {label(i, rows[i])} {same_as(prep.entry, same)}")
    backend = backends.get(prep.entry.target)
    own = {name for _, overrides in kept for name in backend.steps(entry_of(prep.entry, overrides))}
    skip([name for name in backend_steps(prep.entry) if name not in own])
    return kept


def folded(entry: Entry) -> dict[int, int]:
    """The variants that give the target's compiler the same settings as an earlier one (the same model), each with
    that earlier one's index."""
    given = [quantization.compiled_as(entry.target, entry_of(entry, overrides)) for overrides in entry.variants or []]
    return {i: given.index(settings) for i, settings in enumerate(given) if given.index(settings) < i}


def same_as(entry: Entry, index: int) -> str:
    """Why a variant folded into variant `index` is not compiled on its own."""
    rows = entry.variants or []
    return (f"compiles the same model as {label(index, rows[index])} for target {entry.target} (it changes only "
            "settings its compiler is never given): compiled and evaluated once")


def compile_all(prep: Prepared, ctx: Context, job_id: str, plan: Callable[[Prepared, reuse.Made], Plan | None],
                skip: Callable[[list[str]], None]) -> Sweep:
    """Compile every variant (see compared), each with its report planned (`plan`: the container part it may make
    now); the reports are made by chosen()."""
    of = len(prep.entry.variants or [])
    candidates = []
    for i, overrides in compared(prep, ctx, skip):
        ctx.log.line(f"variant {i + 1}/{of}: {label(i, overrides)}")
        vprep = prepared(prep, i, overrides)
        made = reuse.compile(vprep, ctx, job_id, lambda names: None)  # the steps stay: the next variant runs them
        candidates.append(Candidate(i, vprep, made, plan(vprep, made)))
    return Sweep(prep.entry, candidates)


def chosen(sweep: Sweep, judge: Callable[[Candidate], dict[str, Any] | None]) -> Swept:
    """Each variant's report (`judge`: made and gated), and the one to publish: its prep, compile and report, and
    which it is."""
    variants = sweep.entry.variants or []
    results = [(c, judge(c)) for c in sweep.candidates]
    best, measured = max(results, key=lambda r: (score(r[1]), -r[0].index))
    ranked = best.index
    if measured is not None:
        rows = {c.index: _row(c.index, variants[c.index], c.made, r) for c, r in results}
        twins = folded(sweep.entry)
        for i, same in twins.items():  # SPEC §17's table of all: a folded variant's row is its twin's, saying so
            if same in rows:
                rows[i] = {**rows[same], "variant": i + 1, "name": label(i, variants[i]), "overrides": variants[i],
                           "same_as": same + 1}
        measured["variants"] = [rows[i] for i in sorted(rows)]
        measured["chosen"] = ranked + 1
        measured["notes"] += [f"variant {i + 1} ({label(i, variants[i])}) {same_as(sweep.entry, same)}"
                              for i, same in twins.items()]
    return Swept(best.prep, best.made, measured, {"index": ranked + 1, "of": len(variants),
                                                  "name": label(ranked, variants[ranked]),
                                                  "overrides": variants[ranked], "compared": len(results) > 1})
