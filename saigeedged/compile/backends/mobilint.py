"""The mobilint target (SPEC §6b): host-side .npy calibration tensors, qbcompiler parse + quantize, JSON progress."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from saigeedged.compile import images
from saigeedged.compile.backends import Artifact, Context
from saigeedged.compile.backends.steps import Lines, StepRunner
from saigeedged.errors import SaigeError

if TYPE_CHECKING:
    from saigeedged.adapters.docker import Container
    from saigeedged.compile.inputs import Prepared
    from saigeedged.manifest import Entry

PROBE = "command -v qbcompiler || { python3 -m qbcompiler --help >/dev/null 2>&1 && echo 'python3 -m qbcompiler'; }"
ERROR_LINE = re.compile(r"ERROR \[([A-Z_]+)\]: (.*)")


def steps(entry: Entry) -> list[str]:
    return ["parse", "quantize"]


def preset(entry: Entry) -> str:
    return entry.preset or entry.profile.mobilint_preset


def parse_args(name: str, device: str) -> list[str]:
    return ["parse", "--model", f"{name}.onnx", "--backend", "onnx", "--target-device", device, "--output", f"{name}.mblt"]


def quantize_args(name: str, device: str, config_preset: str | None) -> list[str]:
    argv = ["quantize", "--mblt", f"{name}.mblt", "--calib-data-path", "calib.txt", "--target-device", device,
            "--output", f"{name}.mxq"]
    return argv + (["--config-preset", config_preset] if config_preset else [])


def write_calibration(prep: Prepared) -> Path:
    """Each chosen image as an HWC float32 .npy at input_size, preprocessed per the task profile (channels reversed
    for a model trained on BGR, SPEC §14); calib.txt lists them."""
    profile = prep.entry.profile
    folder = prep.work_dir / "calib_npy"
    folder.mkdir(exist_ok=True)
    paths = []
    for i, sample in enumerate(prep.chosen):
        hwc = images.load_rgb(sample.image, prep.input_size, profile.letterbox)
        if prep.entry.channels == "bgr":
            hwc = hwc[..., ::-1]
        path = folder / f"{i:04d}.npy"
        np.save(path, images.normalized(hwc, profile.mean, profile.std))
        paths.append(str(path.resolve()))
    listing = prep.work_dir / "calib.txt"
    listing.write_text("\n".join(paths) + "\n")
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
    code, _ = run.call(args, events.lines.feed)
    events.lines.flush()
    if events.error is not None:
        raise SaigeError("STEP_FAILED", f"qbcompiler {step}: {events.error[0]}: {events.error[1]}", tool_code=events.error[0])
    if code != 0:
        raise run.failed(args, code)
    if not output.is_file() or output.stat().st_size == 0:
        raise SaigeError("STEP_FAILED", f"qbcompiler {step} exited 0 but wrote no {output.name}")


def runner(ctx: Context, ctr: Container, work: Path) -> StepRunner:
    found = ctr.entry_point("qbcompiler", PROBE)
    if not found:
        raise SaigeError("CONTAINER_FAILED", f"no qbcompiler in image {ctr.spec.image} ({ctr.probe_failure})",
                         hint="use the mobilint/qbcompiler image (qbcompiler on PATH or `python3 -m qbcompiler`)")
    return StepRunner(ctx, ctr, work, found.split(), "qbcompiler", env={"QBCOMPILER_JSONL": "1"})


def compile(prep: Prepared, ctx: Context) -> Artifact:
    """Run parse and quantize; the bundle member is `<stem>.mxq` (and `<stem>.mblt` with keep_mblt)."""
    assert ctx.container is not None and prep.entry.device is not None
    entry, work, name, device = prep.entry, prep.work_dir, prep.name, prep.entry.device
    listing = write_calibration(prep)
    ctx.log.line(f"{len(prep.chosen)} calibration tensors (HWC float32 {list(prep.input_size)}) -> {listing}")
    ctx.step("parse")
    ctr = ctx.container("mobilint")
    run = runner(ctx, ctr, work)
    _run(run, ctx, "parse", parse_args(name, device), work / f"{name}.mblt")
    ctx.step("quantize")
    _run(run, ctx, "quantize", quantize_args(name, device, preset(entry)), work / f"{name}.mxq")
    members = {f"{name}.mxq": work / f"{name}.mxq"}
    if entry.keep_mblt:
        members[f"{name}.mblt"] = work / f"{name}.mblt"
    quant: dict[str, Any] = {"preset": preset(entry), "n_samples": len(prep.chosen), "seed": entry.seed,
                             "calibration_method": entry.calibration_method}
    return Artifact(f"{name}.mxq", members, quant, platform={"device": device}, image=ctr.spec.image,
                    image_id=ctr.image_id)
