"""A job's accuracy phase (SPEC §17): how each target's compiled model is run, the gate, the report's log table."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import resource
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from saigeedged.accuracytable import nulled
from saigeedged.accuracytable import table as table
from saigeedged.compile import emulated, simulate
from saigeedged.compile.backends import cubie
from saigeedged.errors import SaigeError
from saigeedged.profiles import mean_scale

if TYPE_CHECKING:
    from saigeedged.compile import evaluate
    from saigeedged.compile.backends import Artifact, Context
    from saigeedged.compile.inputs import Prepared
    from saigeedged.config import Config
    from saigeedged.manifest import Entry

FLOAT_QTYPES = ("float16", "qbfloat16")  # a board run in float: the emulation is the float model itself
# how much lower the report child's CPU priority is than the daemon's (nice): the report runs beside the next compile
# (the finishing stage), and a compile that waits for a core a report holds is the serial resource held up (host
# target: onnxruntime's two quantize threads each wait for the slower; bench/burst.py --target host, 10 drops: 43.6 ->
# 40.1 s). A report still gets the cores the compile leaves idle, and about a tenth of a busy one.
REPORT_NICE = 10


def spec(prep: Prepared, compiled: Path, method: str, wrapped: Path, notes: tuple[str, ...] = ()) -> evaluate.Spec:
    from saigeedged.compile import evaluate  # the child's (onnx, numpy): preloaded by its fork server, never the daemon's

    entry = prep.entry
    return evaluate.Spec(wrapped, compiled, method, prep.info.input_name, tuple(str(s.image) for s in prep.held_out),
                         tuple((s.boxes, s.labels) for s in prep.held_out), prep.input_size, entry.profile.letterbox,
                         entry.task, entry.num_classes, float(entry.profile.postprocess.get("conf_threshold", 0.25)),
                         notes, sum(s.dropped for s in prep.held_out))


def _wrap(prep: Prepared, wrapped: Path) -> None:
    from saigeedged.compile.backends import host

    mean, scale = mean_scale(prep.entry.profile)
    wrapped.unlink(missing_ok=True)  # after the container's steps: a link a step left there is not written through
    host.wrap_job(prep.model, wrapped, prep.info.input_name, prep.input_size, mean, scale, prep.entry.channels == "bgr")


def host_job(prep: Prepared, compiled: Path, wrapped: Path) -> dict[str, Any]:
    """In the child: the float model wrapped like the bundle's, then both on the held-out images; `method` names
    what the host compiled (int16 for `qtype: int16`, as checkpoint.yaml's `activations: uint16` says)."""
    from saigeedged.compile import evaluate

    _wrap(prep, wrapped)
    return evaluate.run(spec(prep, compiled, "int16" if prep.entry.qtype == "int16" else "int8", wrapped))


def emulated_job(prep: Prepared, emulation: Path, wrapped: Path, kept: Path | None = None) -> dict[str, Any]:
    """In the child: the board's quantization reproduced with onnxruntime (QDQ, asymmetric per tensor, the manifest's
    algorithm like §6c, int16 for qtype int16), then both on the held-out images. `kept`: where this compile's
    emulated model is kept (emulated.py): taken from there when it was made before, else made and kept."""
    from saigeedged.compile import evaluate
    from saigeedged.compile.backends import host

    entry = given(prep.entry)
    _wrap(prep, wrapped)
    if entry.qtype in FLOAT_QTYPES:
        return evaluate.run(spec(prep, wrapped, "emulated", wrapped, (f"qtype {entry.qtype}: emulated in float32",)))
    bits = 16 if entry.qtype == "int16" else 8
    notes: tuple[str, ...] = (emulation_note(entry, bits),)
    if emulated.take(kept, emulation):
        notes += ("the emulated model of this compile made before (no new quantization)",)
    else:
        calib = host.Calib(tuple(str(s.image) for s in prep.chosen), prep.input_size, entry.profile.letterbox)
        emulation.unlink(missing_ok=True)  # likewise
        host.quantize(wrapped, emulation, prep.info.input_name, calib.stream(), entry.calibration_method, bits)
        emulated.keep(emulation, kept)
    if entry.hybrid_topn:  # (given: only where the target's compiler takes hybrid layers, cubie)
        notes += (f"hybrid_topn {entry.hybrid_topn}: the tensors promoted to {entry.hybrid_dtype} on the board (the job "
                  "log's `hybrid` line, checkpoint.yaml's hybrid_layers) are not emulated: quantized here like the rest",)
    return evaluate.run(spec(prep, emulation, "emulated", wrapped, notes))


def given(entry: Entry) -> Entry:
    """The entry as the target's compiler gets it (quantization.compiled_as), but the manifest's calibration method,
    which SPEC §17 has the emulation follow: on mobilint a `qtype: float16` (never given to qbcompiler, whose .mxq is
    int8) was emulated as the float model itself, a cosine of 1 that passed any gate."""
    from saigeedged import quantization

    settings = dict(quantization.compiled_as(entry.target, entry))
    settings["calibration_method"] = entry.calibration_method
    return dataclasses.replace(entry, **settings)


def emulation_note(entry: Entry, bits: int) -> str:
    """What the emulation runs, then the board's setting it stands in for, as the manifest names it (a
    dynamic_fixed_point int16 is emulated as uint16 asymmetric: the reader sees both), and the calibration: `ema` is
    MinMax with a moving average (host.METHODS), not plain MinMax."""
    from saigeedged.compile.backends import host

    calib, moving = host.METHODS[entry.calibration_method]
    return (f"onnxruntime QDQ uint{bits} asymmetric per tensor (emulating {entry.quantizer} {entry.qtype}), "
            f"{calib}{' moving average' if moving else ''} ({entry.calibration_method})")


def simulated_job(prep: Prepared, wrapped: Path, folder: Path, defaults: list[str], note: str,
                  emulation: Plan) -> dict[str, Any]:
    """In the child: the float model wrapped like the board's input against what the simulator wrote; `emulation`:
    the plan that emulates this compile instead, for a simulator output this reader cannot read."""
    from saigeedged.compile import evaluate

    try:
        tensors = [simulate.read_tensors(folder, prep.info.output_shapes, i) for i in range(len(prep.held_out))]
    except (OSError, ValueError) as exc:  # a simulator output this reader does not know: the emulation instead
        result: dict[str, Any] = emulation.job(*emulation.args)
        result["notes"].append(f"`pegasus inference` output unreadable ({exc})")
        return result
    _wrap(prep, wrapped)
    return evaluate.run_given(spec(prep, wrapped, "simulator", wrapped, (note,)), tensors, defaults)


def _simulated(prep: Prepared, ctx: Context, wrapped: Path, emulation: Plan) -> tuple[Any, tuple[Any, ...]] | str:
    """cubie: the child job comparing the simulator's outputs, or why the simulator was not used."""
    folder, note = simulate.run(prep, ctx)
    if folder is None:
        return note
    q = cubie.quantized_name(prep.name, prep.entry)
    defaults = simulate.quantize_defaults((prep.work_dir / f"{q}.quantize").read_text())
    return simulated_job, (prep, wrapped, folder, defaults, note, emulation)


def costed(job: Any, args: tuple[Any, ...]) -> dict[str, Any]:
    """In the child: the report with what it cost (`cost`: seconds, the child's peak RSS, its nice value), so an
    operator and bench/accuracy.py see it beside the numbers. First of all it yields the CPU to compiles (REPORT_NICE):
    every thread it starts after this inherits that priority."""
    nice = os.nice(REPORT_NICE)
    started = time.monotonic()
    result: dict[str, Any] = job(*args)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux gives KiB
    result["cost"] = {"seconds": round(time.monotonic() - started, 2), "peak_rss_bytes": peak, "nice": nice}
    return result


@dataclass(frozen=True)
class Plan:
    """How a compile's report is made: the child's job and arguments (the container's part, cubie's simulator, done),
    and why the simulator was not used when it was not. `simulator`: cubie's simulator call is still to make (made()
    makes it first, the job and arguments the emulation's until it answers)."""

    job: Any
    args: tuple[Any, ...]
    fallback: str | None = None
    simulator: bool = False


def plan(prep: Prepared, art: Artifact, ctx: Context, key: str | None = None) -> Plan | None:
    """What the child will run, None: no held-out image (`eval_samples: 0`, or every image calibrated), no report.
    Cubie's container part (`pegasus inference`, when the image has it) is left to made() where the container can be
    reached without the job's worker (Container.beside): the finishing stage makes it beside the next job's steps.
    `key`: the compile's cache key, under which an emulated model is kept (not with the cache off: `cache: false` or
    cache.max_bytes 0)."""
    if not prep.held_out:
        return None
    if prep.entry.target == "host":
        return Plan(host_job, (prep, art.members[art.model_member], _wrapped(prep)))
    bits = 16 if given(prep.entry).qtype == "int16" else 8
    reuse = prep.entry.cache and ctx.config.cache.max_bytes > 0  # `cache: false` asks for a compile from scratch
    kept = emulated.path(ctx.config.state_dir, key if reuse else None, prep.entry.calibration_method, bits)
    emulation = Plan(emulated_job, (prep, prep.work_dir / f"{prep.name}.emulated.onnx", _wrapped(prep), kept))
    if prep.entry.target != "cubie":
        return emulation
    if ctx.container is not None and simulate.missing(prep) is None \
            and ctx.container("cubie").beside() is not None:
        return Plan(emulation.job, emulation.args, simulator=True)
    return _simulator(prep, ctx, emulation)


def _wrapped(prep: Prepared) -> Path:
    return prep.work_dir / f"{prep.name}.eval-float.onnx"


def _simulator(prep: Prepared, ctx: Context, emulation: Plan) -> Plan:
    """Cubie's simulator call now, and the child's job on what it wrote; the emulation, saying why, without it."""
    simulated = _simulated(prep, ctx, _wrapped(prep), emulation)
    if isinstance(simulated, str):
        return Plan(emulation.job, emulation.args, simulated)
    return Plan(*simulated)


OVER = ("CONTAINER_LOST", "TIMEOUT")  # a simulator call that ended so is over: nothing of it runs on
HELD = ("CANCELLED", "DOCKER_UNAVAILABLE")  # the job's own end (a cancel, a stop), or its engine away: the call may run on


def _simulator_late(prep: Prepared, ctx: Context, emulation: Plan) -> Plan:
    """The simulator call a plan left for made(). The compile is done: a call that failed for want of its container
    (gone, stopped, or recreated on another image for the next job: it is never made there), of time, or by an
    answer of the engine that it refused leaves the report emulated, saying why (the call killed first unless it is
    over). A cancel, a stop or an engine that does not answer (the call may run on: the job is held for it) end the
    job as in any step."""
    try:
        return _simulator(prep, ctx, Plan(emulation.job, emulation.args))
    except SaigeError as exc:
        if exc.code in HELD:
            raise
        if exc.code not in OVER and ctx.container is not None:
            with contextlib.suppress(Exception):  # best effort: what still answers is asked to end it
                ctx.container("cubie").interrupt(prep.work_dir, "cancel", later=True)
        return Plan(emulation.job, emulation.args, f"`pegasus inference` did not answer ({exc.code}: {exc.message})")


def made(prep: Prepared, planned: Plan, ctx: Context) -> dict[str, Any]:
    """The report itself: the simulator call a plan left (a finishing stage makes it beside the next job's container
    steps), then the bounded child, host work only (a finishing stage runs it off the container's path)."""
    if planned.simulator:
        planned = _simulator_late(prep, ctx, planned)
    result: dict[str, Any] = ctx.in_background(costed, (planned.job, planned.args), "accuracy")
    unmeasured = nulled(result)
    if unmeasured:  # JSON has no NaN: the status file, the store's doc and accuracy.json carry null, and the gate fails
        result["non_finite"] = unmeasured
        result["notes"].append(f"not a finite number (NaN or inf), shown as null: {', '.join(unmeasured[:SHOWN])}"
                               + (f" and {len(unmeasured) - SHOWN} more" if len(unmeasured) > SHOWN else ""))
    if planned.fallback:
        result["notes"].append(planned.fallback)
    held = len(prep.held_out)
    if held < prep.entry.eval_samples:
        result["notes"].append(f"{held} held-out images ({prep.entry.eval_samples} asked): the calibration file has no more")
    return result


SHOWN = 5  # non-finite values named in a note or a gate failure


def thresholds(prep: Prepared, config: Config) -> dict[str, float]:
    """The gate: the config's `accuracy:` with the manifest's values over it."""
    gate = {"min_cosine": config.accuracy.min_cosine, "max_map_drop": config.accuracy.max_map_drop}
    gate.update(prep.entry.accuracy or {})
    return gate


def judge(result: dict[str, Any], gate: dict[str, float]) -> list[str]:
    """Why the report is below the gate (empty: it passes). The mean over the held-out images of every output's
    cosine, for detection also of the decoded scores' correlation (a box channel in pixels hides collapsed scores in
    its output's cosine), and the mAP drop where labels allowed one.

    The mean, not the worst image: on a handful of held-out images the worst one is noise (bench/gate.py: ordinary
    uint8 models' worst image goes down to 0.88, their means stay >= 0.96, while a head whose scores share one scale
    with pixel boxes has a mean score correlation <= 0.93, <= 0.90 at 100x). The worst image stays in the report."""
    unmeasured = result.get("non_finite") or []
    failures = [f"not a finite number (NaN or inf on the held-out images): {', '.join(unmeasured[:SHOWN])}"] \
        if unmeasured else []
    failures += [f"{name} mean cosine {_below(row['cosine_mean'], gate['min_cosine'])} < {gate['min_cosine']}"
                 for name, row in result["outputs"].items()
                 if row["cosine_mean"] is not None and row["cosine_mean"] < gate["min_cosine"]]
    task = result.get("task") or {}
    score = task.get("score_cosine_mean")
    if score is not None and score < gate["min_cosine"]:
        failures.append(f"decoded scores mean cosine {_below(score, gate['min_cosine'])} < {gate['min_cosine']}")
    if task.get("drop") is not None and task["drop"] > gate["max_map_drop"]:
        failures.append(f"{task['metric']} drop {task['drop']:.4f} > {gate['max_map_drop']}")
    return failures


def _below(value: float, bound: float) -> str:
    """A figure below its bound, with the digits that show it is (0.99999 against 1 read "1.0000 < 1")."""
    digits = 4
    while digits < 8 and round(value, digits) >= bound:
        digits += 1
    return f"{value:.{digits}f}"
