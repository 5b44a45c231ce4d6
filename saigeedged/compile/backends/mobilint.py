"""The mobilint target (SPEC §6b): host-side .npy calibration tensors, qbcompiler parse + quantize, JSON progress."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from saigeedged.compile.backends import Artifact, Context
from saigeedged.compile.backends.steps import Lines, StepRunner
from saigeedged.errors import SaigeError
from saigeedged.files import write_bytes

if TYPE_CHECKING:
    from saigeedged.adapters.docker import Container
    from saigeedged.compile.inputs import Prepared
    from saigeedged.manifest import Entry

PROBE = "command -v qbcompiler || { python3 -m qbcompiler --help >/dev/null 2>&1 && echo 'python3 -m qbcompiler'; }"
VERSION_PROBE = "{ command -v qbcompiler >/dev/null && qbcompiler --version || python3 -m qbcompiler --version; } 2>&1 " \
                "| head -n 1"
ERROR_LINE = re.compile(r"ERROR \[([A-Z_]+)\]: (.*)")
VERSION = re.compile(r"(\d+\.\d+(?:\.\d+)?[0-9A-Za-z.+-]*)")
CPU_TAG = re.compile(r"(^|[-_.])cpu([-_.]|$)")  # mobilint/qbcompiler:1.3-cpu-ubuntu22.04
PARSER_WORKERS_ENV = "MBLT_HL_PARSER_NUM_WORK"


def steps(entry: Entry) -> list[str]:
    return ["parse", "quantize"]


def preset(entry: Entry) -> str:
    return entry.preset or entry.profile.mobilint_preset


def compile_device(setting: str, image: str) -> str:
    """Where qbcompiler computes (its `--device`): the mobilint.device setting, or for `auto` cpu when the image tag
    names a CPU image and gpu otherwise. notes/mobilint.md "Wave 3 facts": 1.3's config device defaults to gpu
    and whether the CPU image falls back on its own is unverified, so a CPU image is always told `--device cpu`."""
    if setting != "auto":
        return setting
    tag = image.split("@")[0].rsplit("/", 1)[-1].partition(":")[2]
    return "cpu" if CPU_TAG.search(tag) else "gpu"


def parser_workers(setting: int) -> int:
    """MBLT_HL_PARSER_NUM_WORK: limits.mobilint_parser_workers, or this host's CPUs minus one (at least 1).
    notes/mobilint.md "Wave 3 facts": its own default (allowed CPUs minus two) is not memory-aware."""
    return setting if setting > 0 else max(1, (os.cpu_count() or 2) - 1)


def parse_args(name: str, device: str, run_on: str | None = None) -> list[str]:
    argv = ["parse", "--model", f"{name}.onnx", "--backend", "onnx", "--target-device", device, "--output", f"{name}.mblt"]
    return argv + (["--device", run_on] if run_on else [])


def quantize_args(name: str, device: str, config_preset: str | None, run_on: str | None = None) -> list[str]:
    argv = ["quantize", "--mblt", f"{name}.mblt", "--calib-data-path", "calib.txt", "--target-device", device,
            "--output", f"{name}.mxq", *(["--device", run_on] if run_on else []),
            "--config-save-path", config_member(name)]
    return argv + (["--config-preset", config_preset] if config_preset else [])


def config_member(name: str) -> str:
    """The resolved compiler config quantize saves (--config-save-path), kept in the bundle."""
    return f"{name}_config.yaml"


def info_member(name: str) -> str:
    """The `info --mblt` JSON (the model's provenance), kept in the bundle."""
    return f"{name}_info.json"


def info_json(output: bytes) -> Any:
    """The JSON object `info --mblt` printed (its log lines, if any, around it are skipped); None without one."""
    text = output.decode(errors="replace")
    start, end = text.find("{"), text.rfind("}")
    for candidate in [text, text[start:end + 1] if 0 <= start < end else "", *reversed(text.splitlines())]:
        try:
            found = json.loads(candidate)
        except ValueError:
            continue
        if isinstance(found, dict):
            return found
    return None


def version(ctr: Container) -> str | None:
    """The qb Compiler version in this container's image (`qbcompiler --version`), probed once per start."""
    match = VERSION.search(ctr.entry_point("qbcompiler-version", VERSION_PROBE))
    return match.group(1) if match else None


def write_calibration(prep: Prepared, ctx: Context) -> Path:
    """Each chosen image as an HWC float32 .npy at input_size, preprocessed per the task profile (channels reversed
    for a model trained on BGR, SPEC §14); calib.txt lists them. Made in a child (numpy and the image decoder stay
    out of the daemon), bounded as the host target's steps are."""
    profile = prep.entry.profile
    args = (tuple(str(s.image) for s in prep.chosen), prep.input_size, profile.letterbox, profile.mean, profile.std,
            prep.entry.channels == "bgr", prep.work_dir)
    listing: Path = ctx.in_child(calibration_job, args, "calibration")
    return listing


def calibration_job(paths: Sequence[str], input_size: tuple[int, int], letterbox: bool, mean: tuple[float, ...],
                    std: tuple[float, ...], bgr: bool, work_dir: Path) -> Path:
    """write_calibration's work, in the child."""
    import numpy as np

    from saigeedged.compile import images

    folder = work_dir / "calib_npy"
    folder.mkdir(exist_ok=True)
    listed = []
    for i, image in enumerate(paths):
        hwc = images.load_rgb(Path(image), input_size, letterbox)
        if bgr:
            hwc = hwc[..., ::-1]
        path = folder / f"{i:04d}.npy"
        np.save(path, images.normalized(hwc, mean, std))
        listed.append(str(path.resolve()))
    listing = work_dir / "calib.txt"
    listing.write_text("\n".join(listed) + "\n")
    return listing


class Events:
    """Reads qbcompiler's output line by line: JSON events (QBCOMPILER_JSONL=1) and `ERROR [CODE]: message`."""

    def __init__(self, ctx: Context, step: str) -> None:
        self.ctx, self.step = ctx, step
        self.error: tuple[str, str] | None = None
        self.lines = Lines(self.line)

    def line(self, text: str) -> None:
        match = ERROR_LINE.search(text)
        if match and self.error is None:
            self.error = (match.group(1), match.group(2).strip())
            return
        try:
            event = json.loads(text)
        except ValueError:
            return
        if not isinstance(event, dict):
            return
        kind = event.get("type") or event.get("event")
        if kind == "error" and self.error is None:
            self.error = (str(event.get("code", "ERROR")), str(event.get("message", "")))
        elif kind in ("progress", "status"):
            self.ctx.progress({"step": self.step, **{k: v for k, v in event.items() if k != "type"}})


def _run(run: StepRunner, ctx: Context, step: str, args: list[str], output: Path) -> None:
    events = Events(ctx, step)
    code, said = run.call(args, events.lines.feed)
    events.lines.flush()
    if events.error is not None:
        raise SaigeError("STEP_FAILED", f"qbcompiler {step}: {events.error[0]}: {events.error[1]}", tool_code=events.error[0])
    if code != 0:
        raise run.failed(args, code, said)
    if not output.is_file() or output.stat().st_size == 0:
        raise SaigeError("STEP_FAILED", f"qbcompiler {step} exited 0 but wrote no {output.name}")


def entry_prefix(ctr: Container) -> list[str]:
    """qbcompiler's argv prefix in this container (probed once per start)."""
    found = ctr.entry_point("qbcompiler", PROBE)
    if not found:
        raise SaigeError("CONTAINER_FAILED", f"no qbcompiler in image {ctr.spec.image} ({ctr.probe_failure})",
                         hint="use the mobilint/qbcompiler image (qbcompiler on PATH or `python3 -m qbcompiler`)")
    return found.split()


def runner(ctx: Context, ctr: Container, work: Path) -> StepRunner:
    """parse/quantize calls: JSON-line events, and the parser's processes bounded to what this slot may use."""
    env = {"QBCOMPILER_JSONL": "1", PARSER_WORKERS_ENV: str(parser_workers(ctx.config.limits.mobilint_parser_workers))}
    return StepRunner(ctx, ctr, work, entry_prefix(ctr), "qbcompiler", env=env)


def provenance(ctx: Context, ctr: Container, work: Path, name: str) -> dict[str, Path]:
    """The saved compiler config and the `info --mblt` JSON as bundle members (notes/mobilint.md "Wave 3 facts":
    both say what made the .mxq); info runs without QBCOMPILER_JSONL so its stdout is the JSON itself."""
    saved = work / config_member(name)
    if not saved.is_file():
        raise SaigeError("STEP_FAILED", f"qbcompiler quantize exited 0 but saved no {saved.name} (--config-save-path)")
    info = StepRunner(ctx, ctr, work, entry_prefix(ctr), "qbcompiler")
    args = ["info", "--mblt", f"{name}.mblt"]
    code, output = info.call(args)
    if code != 0:
        raise info.failed(args, code, output)
    found = info_json(output)
    if found is None:
        raise SaigeError("STEP_FAILED", f"`qbcompiler info --mblt {name}.mblt` printed no JSON object")
    path = work / info_member(name)
    write_bytes(path, (json.dumps(found, indent=2, sort_keys=True) + "\n").encode())  # a link a step left
    # there is replaced, never written through
    return {saved.name: saved, path.name: path}


def compile(prep: Prepared, ctx: Context) -> Artifact:
    """Run parse and quantize; the bundle members are `<stem>.mxq`, the saved config and the info JSON (and
    `<stem>.mblt` with keep_mblt)."""
    assert ctx.container is not None and prep.entry.device is not None
    entry, work, name, device = prep.entry, prep.work_dir, prep.name, prep.entry.device
    run_on = compile_device(ctx.config.mobilint.device, ctx.config.mobilint.image)
    listing = write_calibration(prep, ctx)
    ctx.log.line(f"{len(prep.chosen)} calibration tensors (HWC float32 {list(prep.input_size)}) -> {listing}")
    ctx.step("parse")
    ctr = ctx.container("mobilint")
    run = runner(ctx, ctr, work)
    ctx.log.line(f"qbcompiler --device {run_on} (mobilint.device {ctx.config.mobilint.device}, image {ctr.spec.image}), "
                 f"{PARSER_WORKERS_ENV}={run.env[PARSER_WORKERS_ENV] if run.env else '?'}")
    _run(run, ctx, "parse", parse_args(name, device, run_on), work / f"{name}.mblt")
    ctx.step("quantize")
    _run(run, ctx, "quantize", quantize_args(name, device, preset(entry), run_on), work / f"{name}.mxq")
    members = {f"{name}.mxq": work / f"{name}.mxq", **provenance(ctx, ctr, work, name)}
    if entry.keep_mblt:
        members[f"{name}.mblt"] = work / f"{name}.mblt"
    quant: dict[str, Any] = {"preset": preset(entry), "n_samples": len(prep.chosen), "seed": entry.seed,
                             "calibration_method": entry.calibration_method, "compile_device": run_on}
    return Artifact(f"{name}.mxq", members, quant, platform={"device": device}, image=ctr.spec.image,
                    image_id=ctr.image_id)
