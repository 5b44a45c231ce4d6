"""`saigeedged compile` and `validate`: the guide's compile.py, one manifest at a time, in the foreground."""

from __future__ import annotations

import shutil
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TextIO

from saigeedged import jobid, manifest, quantization
from saigeedged.adapters.docker import Containers
from saigeedged.adapters.joblog import JobLog
from saigeedged.adapters.outbox import place_file
from saigeedged.compile import calibration, inputs, pipeline, variants
from saigeedged.compile.backends import cubie
from saigeedged.config import Config
from saigeedged.errors import ENVIRONMENT_CODES, INPUT_CODES, SaigeError
from saigeedged.manifest import Entry


def select(config: Config, path: Path, only: Sequence[str]) -> list[Entry]:
    """The manifest's entries, filtered by `--only` (a task or an entry's name)."""
    entries = manifest.load(path, config.defaults.as_dict())
    if only:
        entries = [e for e in entries if e.task in only or e.stem in only or e.stem.split(".")[-1] in only]
        if not entries:
            raise SaigeError("MANIFEST_INVALID", f"{path.name}: no entry matches --only {' '.join(only)}")
    return entries


def output_path(entry: Entry) -> Path:
    """`output:` as a path (absolute, or relative to the current directory); default ./<stem>.<target>.saigeedge."""
    return Path(entry.output_name).expanduser().absolute()


def refused_path(dest: Path, job_id: str) -> Path:
    """Where a bundle below the accuracy gate is kept (SPEC §17: under failed/<job_id>/, never published): beside the
    output it would have replaced, under its name, as the daemon keeps one beside the inputs it failed with."""
    return dest.parent / "failed" / job_id / dest.name


def describe(config: Config, entry: Entry, out: TextIO) -> None:
    """Check the entry like a compile would (no compiler) and print the resolved profile and paths."""
    with tempfile.TemporaryDirectory(prefix="saige-validate-") as tmp:
        prep = inputs.validate(entry, Path(tmp), inputs.PathPolicy(), config.limits.max_onnx_bytes)
        if inputs.needs_surgery(entry):
            inputs.surgery(prep)
        chosen = calibration.choose(prep.calib, entry.n_samples, entry.seed, entry.profile.sampler)
        held = calibration.evaluation(prep.calib, chosen, entry.eval_samples, entry.seed, entry.profile.sampler)
    profile = entry.profile
    print(f"{entry.stem}: task {entry.task} -> {profile.bundle_task}, target {entry.target}", file=out)
    print(f"  onnx        {entry.onnx}  (sha256 {prep.onnx_sha256[:12]}...)", file=out)
    print(f"  calib       {entry.calib}  ({len(prep.calib.samples)} images, {len(chosen)} chosen, "
          f"{profile.sampler}, seed {entry.seed})", file=out)
    print(f"  input_size  {list(prep.input_size)}  normalize {'imagenet' if profile.normalize else 'div255'}", file=out)
    print(f"  channels    {entry.channels} (the board and the bundle take RGB)", file=out)
    print(f"  outputs     {[list(s) for s in prep.info.output_shapes]}" +
          (f"  (cut at {', '.join(prep.surgery)})" if prep.surgery else ""), file=out)
    print(f"  steps       {' '.join(pipeline.plan_steps(entry))}", file=out)
    print(f"  output      {output_path(entry)}", file=out)
    print(f"  accuracy    {len(held)} held-out images of {entry.eval_samples} asked" if held else
          "  warning     no accuracy report and no gate: " + ("eval_samples is 0" if not entry.eval_samples else
                                                             f"calibration uses every one of the {len(prep.calib.samples)} "
                                                             f"images (n_samples {entry.n_samples}): add images to "
                                                             "the calibration file or lower n_samples"), file=out)
    for line in variant_lines(entry, bool(held)):
        print(line, file=out)
    for text in cubie.precision_warnings(entry) + quantization.warnings(entry) + _outside(config, prep.calib):
        print(f"  warning     {text}", file=out)


def _outside(config: Config, calib: calibration.CalibSet) -> list[str]:
    """What a daemon with this config refuses in the drop (SPEC §5: PATH_NOT_ALLOWED): its calibration file or an image
    it lists outside the inbox and allowed_roots (`saigeedged compile` takes them; the ONNX goes with the drop)."""
    if not config.named_dirs:
        return []
    policy = inputs.PathPolicy((config.inbox, *config.allowed_roots))
    for path in (calib.source, *(sample.image for sample in calib.samples)):
        try:
            policy.check(path)
        except SaigeError as exc:
            return [f"a daemon with this config refuses the drop (PATH_NOT_ALLOWED): {exc.message}; add its folder to "
                    "allowed_roots, or put the files in the inbox"]
    return []


def variant_lines(entry: Entry, compared: bool) -> list[str]:
    """What a sweep will do (SPEC §17): each variant and what it changes; without a held-out image only the first
    is compiled (compile/variants.py), which is said as a warning."""
    rows = entry.variants or []
    if not rows:
        return []
    plan = "each compiled and evaluated, the best that passes the gate published" if compared else "only the first compiled"
    lines = [f"  variants    {len(rows)}: {plan}"]
    twins = variants.folded(entry) if compared else {}
    for i, overrides in enumerate(rows):
        changes = ", ".join(f"{k} {v}" for k, v in overrides.items() if k != "name") or "nothing (the entry as written)"
        same = f" ({variants.same_as(entry, twins[i])})" if i in twins else ""
        lines.append(f"    {i + 1}. {variants.label(i, overrides)}: {changes}{same}")
    return lines + ([] if compared else [f"  warning     variants: {variants.UNCOMPARED}"])


def validate(config: Config, path: Path, out: TextIO | None = None) -> int:
    out = out or sys.stdout
    for entry in manifest.load(path, config.defaults.as_dict()):
        describe(config, entry, out)
    print(f"{path.name}: valid", file=out)
    return 0


def _compile_one(config: Config, entry: Entry, containers: Containers, out: TextIO) -> Path:
    now = jobid.utc_now()
    job_id = jobid.new(entry.stem, now)
    work = config.work_root / job_id
    dest = output_path(entry)
    log = JobLog(config.state_dir / "logs" / f"{job_id}.log")

    def publish(bundle: Path) -> None:
        place_file(bundle, dest)

    def on_step(name: str, index: int, count: int) -> None:
        print(f"  [{index}/{count}] {entry.stem}: {name}", file=out, flush=True)

    def on_inputs(facts: dict[str, Any]) -> None:
        cache = facts.get("cache") or {}
        if cache.get("hit"):
            print(f"  cache hit {cache['key'][:16]}: compiled by job {cache['source_job_id']}, compiler steps skipped",
                  file=out, flush=True)

    job = pipeline.Job(job_id, entry, work, log, config, on_step=on_step, on_inputs=on_inputs, container=containers.get,
                       deadline=time.monotonic() + config.limits.job_timeout_s, refused_to=refused_path(dest, job_id))
    try:
        pipeline.run(job, publish, jobid.iso(now))
    except SaigeError as exc:
        exc.fields["log"] = str(log.path)
        raise
    finally:
        log.close()
        containers.release()
        if config.keep_work and work.exists():
            keep = dest.parent / f"cubie_work_{entry.stem}"
            shutil.rmtree(keep, ignore_errors=True)
            shutil.move(str(work), keep)
        shutil.rmtree(work, ignore_errors=True)
    return dest


def compile_manifest(config: Config, path: Path, only: Sequence[str], dry_run: bool, out: TextIO | None = None) -> int:
    """Exit 2 at the first invalid entry, 3 when the host is not ready; compiler failures are collected (exit 1)."""
    out = out or sys.stdout
    entries = select(config, path, only)
    if dry_run:
        for entry in entries:
            describe(config, entry, out)
        print(f"dry run: {len(entries)} entr{'y' if len(entries) == 1 else 'ies'} valid, nothing compiled", file=out)
        return 0
    summary: list[str] = []
    failed = 0

    def on_wait() -> None:
        print("  waiting for the container lock (another compile or the daemon)", file=out, flush=True)

    containers = Containers(config, on_wait=on_wait)  # one client and one entry-point probe for all entries
    for entry in entries:
        start = time.monotonic()
        try:
            dest = _compile_one(config, entry, containers, out)
            summary.append(f"OK    {entry.stem}: {dest} ({time.monotonic() - start:.1f}s)")
        except SaigeError as exc:
            if exc.code in INPUT_CODES or exc.code in ENVIRONMENT_CODES:
                for line in summary:
                    print(line, file=out)
                raise
            failed += 1
            summary.append(f"FAIL  {entry.stem}: {exc.code}: {exc.message}\n      hint: {exc.hint}"
                           f"\n      log: {exc.fields.get('log', '-')}")
    for line in summary:
        print(line, file=out)
    return 1 if failed else 0
