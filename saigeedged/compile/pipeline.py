"""One job through its steps: validate, surgery, calibration, the backend's steps, bundle, publish."""

from __future__ import annotations

import errno
import json
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import structlog

from saigeedged import files, quantization
from saigeedged.adapters.joblog import JobLog
from saigeedged.compile import bundle, inputs, prepare, report, reuse, variants
from saigeedged.compile.backends import Context, cubie
from saigeedged.compile.inputs import PathPolicy, Prepared
from saigeedged.errors import GATE_REMEDIES, SaigeError
from saigeedged.jobs import Superseded
from saigeedged.manifest import Entry

if TYPE_CHECKING:
    from saigeedged.adapters.docker import Container
    from saigeedged.compile.ahead import HostSteps
    from saigeedged.config import Config


def plan_steps(entry: Entry) -> list[str]:
    """The step names this entry will run, in order (SPEC §8)."""
    head = ["validate"] + (["surgery"] if inputs.needs_surgery(entry) else []) + ["calibration"]
    return head + variants.backend_steps(entry) + ["bundle", "publish"]


@dataclass
class Job:
    """One run of an entry: where it works, logs and what it calls back."""

    job_id: str
    entry: Entry
    work_dir: Path
    log: JobLog
    config: Config
    policy: PathPolicy = field(default_factory=PathPolicy)
    on_step: Callable[[str, int, int], None] = lambda name, index, count: None
    on_progress: Callable[[dict[str, Any]], None] = lambda event: None
    on_inputs: Callable[[dict[str, Any]], None] = lambda facts: None  # onnx_sha256, calib_samples, cache,
    # quantization_report, accuracy: each once known
    container: Callable[[str], Container] | None = None
    deadline: float | None = None  # time.monotonic() limit for the whole job
    interrupted: Callable[[], str | None] = lambda: None  # "stop" | "cancel" once the job must end
    host: HostSteps | None = None  # validate, surgery, calibration done ahead (compile/ahead.py); None: run them now
    current: Callable[[], bool] = lambda: True  # the store still names this attempt (SPEC §15 fencing)
    on_prepared: Callable[[Prepared], None] = lambda prep: None  # host steps done: kept for a resume (attempt record)
    refused_to: Path | None = None  # where a bundle below the accuracy gate is kept; None: beside the claimed inputs


@dataclass
class Result:
    bundle: Path
    onnx_sha256: str
    calib_samples: int
    report: dict[str, Any] | None
    accuracy: dict[str, Any] | None = None  # SPEC §17 (None: no held-out image)


class _Steps:
    """Marks step starts: banner in the log, callback for the status file, job deadline check."""

    def __init__(self, job: Job, names: list[str] | None = None) -> None:
        self.job = job
        self.names = names if names is not None else plan_steps(job.entry)
        self.current = ""

    def __call__(self, name: str) -> None:
        job = self.job
        reason = job.interrupted()
        if reason is not None:
            raise SaigeError("CANCELLED", f"the job was interrupted before step {name} ({reason})", reason=reason)
        if job.deadline is not None and time.monotonic() > job.deadline:
            raise SaigeError("TIMEOUT", f"the job ran longer than limits.job_timeout_s before step {name}")
        self.current = name
        index = self.names.index(name) + 1
        job.log.begin(name, index, len(self.names))
        job.on_step(name, index, len(self.names))

    def skip(self, names: list[str]) -> None:
        """Steps this job will not run after all (a cache hit): the count and the indexes follow."""
        self.names = [n for n in self.names if n not in names]


def _warn(job: Job, warnings: list[str]) -> None:
    """Warnings about an entry that still compiles: a job log line and a `job.warning` journal event each."""
    for text in warnings:
        job.log.line(f"warning: {text}")
        structlog.get_logger().warning("job.warning", job_id=job.job_id, job_name=job.entry.stem, step="validate",
                                       message=text)


@dataclass
class Compiled:
    """A job past its last container step: what its report, bundle and publication need. A finishing stage may take
    it from here (service/finishing.py, issue 25), so that the container's slot takes the next job at once."""

    prep: Prepared
    made: reuse.Made
    steps: list[str]  # the step names this job runs (a cache hit skipped some)
    planned: report.Plan | None = None  # the report still to make in the child (None: none to make)
    sweep: variants.Sweep | None = None  # a variant sweep's compiles, their reports still to make (one published)

    @property
    def plans(self) -> list[report.Plan]:
        """The reports still to make (a sweep's: one a variant)."""
        if self.sweep is not None:
            return [c.planned for c in self.sweep.candidates if c.planned is not None]
        return [] if self.planned is None else [self.planned]


def run(job: Job, publish: Callable[[Path], None], created_at: str,
        handoff: Callable[[Compiled], bool] | None = None) -> Result | None:
    """Run every step; `publish(bundle_path)` moves the finished bundle where its readers look for it. After the last
    container step `handoff(compiled)` may take the job (True: None is returned, finish() goes on elsewhere)."""
    step = _Steps(job)
    with _outcome(job, step):
        compiled = _compile(job, step)
        job.log.end()  # the last container step's section, before anyone else may write the log
        if handoff is not None and handoff(compiled):
            return None
        return _finish(job, step, compiled, publish, created_at)


def finish(job: Job, compiled: Compiled, publish: Callable[[Path], None], created_at: str) -> Result:
    """The steps after the last container step of a job handed off by run(): report, bundle, gate, publish."""
    step = _Steps(job, compiled.steps)
    with _outcome(job, step):
        return _finish(job, step, compiled, publish, created_at)


@contextmanager
def _outcome(job: Job, step: _Steps) -> Iterator[None]:
    """A failure ends the step's log section and names the step; anything but a SaigeError is INTERNAL."""
    try:
        yield
    except SaigeError as exc:
        job.log.end("stopped with the daemon" if exc.stop else f"failed {exc.code}")
        exc.fields.setdefault("step", step.current)
        raise
    except Superseded:
        raise  # the attempt is over: nothing of it is written, not even its failure
    except Exception as exc:
        if isinstance(exc, OSError) and exc.errno in FULL:  # state_dir full: the job waits for room, not its fault
            raise SaigeError("INTERNAL", f"state_dir is full: {exc}", step=step.current, state_full=True) from exc
        job.log.end("failed INTERNAL")
        raise SaigeError("INTERNAL", f"{type(exc).__name__}: {exc}", step=step.current) from exc


def _context(job: Job, step: _Steps) -> Context:
    return Context(job.log, step, job.config, job.container, job.on_progress, job.deadline, job.interrupted, job.current)


def _compile(job: Job, step: _Steps) -> Compiled:
    """validate, surgery, calibration, the compiler's steps (or the cache), and the report's container part."""
    entry = job.entry
    ctx = _context(job, step)
    bounded = job.host or prepare.Bounded(job.config, job.interrupted, ctx.step_timeout)
    step("validate")
    prep = bounded.validate(entry, job.work_dir, job.policy, job.config.limits.max_onnx_bytes,
                            lambda digest: job.on_inputs({"onnx_sha256": digest}))
    _warn(job, cubie.precision_warnings(entry) + quantization.warnings(entry))
    if inputs.needs_surgery(entry):
        step("surgery")
        prep = bounded.surgery(prep)
        job.log.line(f"cut at {', '.join(prep.surgery or ())}: outputs {[list(s) for s in prep.info.output_shapes]}")
    step("calibration")
    bounded.calibrate(prep)
    job.on_inputs({"calib_samples": len(prep.chosen)})
    job.log.line(f"{len(prep.chosen)} calibration images ({entry.profile.sampler}, seed {entry.seed}) -> {prep.dataset}")
    if entry.target != "host":  # a container job's attempt outlives the daemon: a resume starts from here
        job.on_prepared(prep)
    if entry.variants:
        sweep = variants.compile_all(prep, ctx, job.job_id, lambda p, m: report.plan(p, m.art, ctx, m.key), step.skip)
        first = sweep.candidates[0]
        job.on_inputs({"cache": first.made.status()})  # the published variant's once the reports choose it (_finish)
        return Compiled(first.prep, first.made, step.names, sweep=sweep)
    made = reuse.compile(prep, ctx, job.job_id, step.skip)
    job.on_inputs({"cache": made.status()})
    return Compiled(prep, made, step.names, report.plan(prep, made.art, ctx, made.key))


def _finish(job: Job, step: _Steps, compiled: Compiled, publish: Callable[[Path], None], created_at: str) -> Result:
    prep, made, entry = compiled.prep, compiled.made, job.entry
    step("bundle")
    ctx = _context(job, step)
    measured, variant = None, None
    if compiled.sweep is not None:  # each variant's report, made here (off the container's path like a job's own)
        swept = variants.chosen(compiled.sweep, lambda c: _gated(
            job, c.prep, None if c.planned is None else report.made(c.prep, c.planned, ctx)))
        prep, made, measured, variant = swept.prep, swept.made, swept.measured, swept.variant
        job.log.line(f"variant {variant['index']}/{variant['of']} chosen: {variant['name']} (published if it passes the gate)")
        job.on_inputs({"cache": made.status()})
    elif compiled.planned is not None:
        measured = _gated(job, prep, report.made(prep, compiled.planned, ctx))
    art = made.art
    if art.report is not None:  # the host's quantization report (§6c), in the status file of a job the gate fails too
        job.on_inputs({"quantization_report": art.report})
    _announce(job, measured)
    dest = job.work_dir / f"{job.job_id}.saigeedge"
    texts = made.texts() | ({ACCURACY_MEMBER: json.dumps(measured, indent=1)} if measured else {})
    made_by = made.checkpoint(prep) | ({"variant": variant} if variant else {})
    bundle.write(dest, bundle.checkpoint(prep, art, job.job_id, created_at, made_by), art.members,
                 entry.password, texts, job.work_dir)
    if measured and not measured["gate"]["passed"]:
        raise _refused(job, dest, measured)
    step("publish")
    publish(dest)
    job.log.end()
    return Result(dest, prep.onnx_sha256, len(prep.chosen), art.report, measured)


ACCURACY_MEMBER = "accuracy.json"
FULL = (errno.ENOSPC, errno.EDQUOT)  # a full state_dir (work dir, job log): waited out, never the job's failure


def _gated(job: Job, prep: Prepared, measured: dict[str, Any] | None) -> dict[str, Any] | None:
    """The accuracy report with the gate's verdict (SPEC §17); None without a held-out image."""
    if measured is None:
        return None
    gate = report.thresholds(prep, job.config)
    failures = report.judge(measured, gate)
    measured["gate"] = {**gate, "passed": not failures, "failures": failures}
    return measured


def _announce(job: Job, measured: dict[str, Any] | None) -> None:
    """The report as a table in the job log, and to `on_inputs` (the status file's `accuracy`)."""
    if measured is None:
        job.log.line("accuracy: no held-out image (eval_samples 0, or calibration used every image): no report, no gate")
        return
    for line in report.table(measured):
        job.log.line(line)
    job.on_inputs({"accuracy": measured})


def _gated_place(job: Job, dest: Path) -> tuple[Path, str, str] | None:
    """Where a bundle below the gate is kept, as the error names it, and where writing it failed; None: nowhere."""
    if job.refused_to is not None:
        return job.refused_to, str(job.refused_to), f"to {job.refused_to.parent}"
    if job.policy.roots:
        return job.policy.roots[0] / dest.name, f"{dest.name} with the job's inputs under failed/", "beside the inputs"
    return None


def _refused(job: Job, dest: Path, measured: dict[str, Any]) -> SaigeError:
    """ACCURACY_GATE: the bundle is kept for inspection and never published (SPEC §17): at `job.refused_to`
    (`saigeedged compile`: failed/<job_id>/ beside its output), else beside the claimed inputs (the first root of a
    drop's path policy), which the service moves under <inbox>/.saigeedged/failed/<job_id>/."""
    place = _gated_place(job, dest)
    kept = "not kept (no claimed folder)"
    if place is not None:
        keep, shown, near = place
        # a copy read from the checked file itself (open_output): never a link a step swapped in after a check (the
        # inbox share is read), nor the work folder's inode, which the next job's steps could still write into
        try:
            if job.refused_to is not None:
                keep.parent.mkdir(parents=True, exist_ok=True)
            files.copy_file(dest, keep, nofollow=True)
            kept = f"kept as {shown}"
        except files.NotOutput:
            kept = "not kept (no longer a file of the work folder)"
        except OSError as exc:
            kept = f"not kept (writing it {near}: {exc.strerror})"
    failures = "; ".join(measured["gate"]["failures"])
    hint = None  # the daemon's: the default hint says where under the inbox the bundle is kept
    if job.refused_to is not None or not job.policy.roots:
        where = f" and the kept bundle's {ACCURACY_MEMBER}" if kept.startswith("kept") else ""
        hint = f"the compiled model is too far from the float ONNX (the report is in the job log{where}): " \
            f"{GATE_REMEDIES}"
    return SaigeError("ACCURACY_GATE", f"below the accuracy gate ({measured['method']}, {measured['images']} "
                      f"held-out images): {failures}; the bundle was {kept}", hint=hint, accuracy=measured)
