"""The cubie toolkit's simulator (SPEC §17): `pegasus inference --dtype quantized` on each held-out image in the
container, its `.tensor` text files (one float a line, `iter_0_<layer id>_out0_<shape>.tensor`) read back."""

from __future__ import annotations

import math
import re
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import yaml
from numpy.typing import NDArray

from saigeedged.compile import calibration
from saigeedged.compile.backends import cubie

if TYPE_CHECKING:
    from saigeedged.compile.backends import Context
    from saigeedged.compile.inputs import Prepared

TENSOR_RE = re.compile(r"^iter_0_(?P<layer>.+)_out0_(?P<shape>\d+(?:_\d+)*)\.tensor$")
NO_SIMULATOR = b"invalid choice: 'inference'"  # argparse's answer of a toolkit without the subcommand
SIM_DIR = "sim"


def inference_args(name: str, entry: Any, out_dir: str, meta: str) -> list[str]:
    """`pegasus inference` of the quantized model (argv as notes/pegasus.md gives it; hybrid: the .quantize.json)."""
    q = cubie.quantized_name(name, entry)
    model = f"{q}.quantize.json" if entry.hybrid_topn else f"{name}.json"
    return ["inference", "--model", model, "--model-data", f"{name}.data", "--dtype", "quantized",
            "--model-quantize", f"{q}.quantize", "--iterations", "1", "--device", "CPU", "--output-dir", out_dir,
            "--with-input-meta", meta]


def missing(prep: Prepared) -> str | None:
    """Why the simulator cannot run on this work dir (a cache hit skipped the pegasus steps), or None."""
    q = cubie.quantized_name(prep.name, prep.entry)
    need = [f"{prep.name}.json", f"{prep.name}.data", f"{q}.quantize", f"{prep.name}_inputmeta.yml"]
    absent = [n for n in need if not (prep.work_dir / n).is_file()]
    return f"{', '.join(absent)} not in the work dir (a cache hit)" if absent else None


def read_tensors(folder: Path, shapes: Sequence[Sequence[int]]) -> list[NDArray[np.float32]]:
    """The output .tensor files matched to the ONNX outputs by element count (name order among equals)."""
    matched = {p: TENSOR_RE.match(p.name) for p in folder.iterdir()}
    sizes = {p: math.prod(int(d) for d in m.group("shape").split("_")) for p, m in matched.items() if m is not None}
    files = sorted(sizes)
    found = []
    for shape in shapes:
        match = next((p for p in files if sizes[p] == math.prod(shape)), None)
        if match is None:
            raise ValueError(f"no .tensor file of {math.prod(shape)} values (output shape {list(shape)}) in {folder.name}")
        files.remove(match)
        found.append(np.loadtxt(match, dtype=np.float32, ndmin=1).reshape(shape))
    return found


def quantize_defaults(text: str) -> list[str]:
    """Tensors of a .quantize file left at default parameters (scale 1.0 and zero point 0, or int16 fl 300)."""
    data = yaml.safe_load(text) or {}
    left = []
    for name, row in (data.get("quantize_parameters") or {}).items():
        if not isinstance(row, dict):
            continue
        if (row.get("scale") == 1.0 and row.get("zero_point", 0) == 0) or row.get("fl") == 300:
            left.append(str(name))
    return left


def run(prep: Prepared, ctx: Context) -> tuple[list[Path] | None, str]:
    """Each held-out image through the simulator: (its output folder per image, note), or (None, why not) to emulate
    instead. The folders are read by the child (read_tensors): the daemon never holds a model's outputs."""
    why = missing(prep)
    if why is not None or ctx.container is None:
        return None, f"simulator not run: {why or 'no container'}"
    work = prep.work_dir
    shutil.rmtree(work / SIM_DIR, ignore_errors=True)
    staged = calibration.stage(prep.held_out, work, "eval", "eval_dataset.txt").read_text().splitlines()
    meta = yaml.safe_load((work / f"{prep.name}_inputmeta.yml").read_text())
    runner = cubie.Runner(ctx, ctx.container("cubie"), work)
    results = []
    for i, image in enumerate(staged):
        folder = work / SIM_DIR / f"{i:04d}"
        folder.mkdir(parents=True)
        (folder / "dataset.txt").write_text(image + "\n")
        meta["input_meta"]["databases"][0]["path"] = str((folder / "dataset.txt").resolve())
        (folder / "inputmeta.yml").write_text(yaml.safe_dump(meta, sort_keys=False))
        args = inference_args(prep.name, prep.entry, str(folder / "out"), str(folder / "inputmeta.yml"))
        code, output = runner.call(args)
        if code != 0:
            return None, ("the image has no `pegasus inference`" if NO_SIMULATOR in output
                          else f"`pegasus inference` exited {code} (see the job log)")
        if not any(TENSOR_RE.match(p.name) for p in (folder / "out").glob("*.tensor")):
            return None, f"`pegasus inference` wrote no iter_0_*.tensor file in {folder.name}/out"
        results.append(folder / "out")
    return results, "pegasus inference --dtype quantized (the toolkit's simulator)"
