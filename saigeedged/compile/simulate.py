"""The cubie toolkit's simulator (SPEC §17): one `pegasus inference --dtype quantized` over every held-out image in
the container (one toolkit start-up, batch 1, an iteration per image), its `.tensor` text files (one float a line,
`iter_<i>_<layer id>_out0_<shape>.tensor` for image i) read back."""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from saigeedged import files
from saigeedged.compile import calibration
from saigeedged.compile.backends import cubie

if TYPE_CHECKING:
    import numpy as np
    from numpy.typing import NDArray

    from saigeedged.compile.backends import Context
    from saigeedged.compile.inputs import Prepared

TENSOR_RE = re.compile(r"^iter_(?P<iteration>\d+)_(?P<layer>.+)_out0_(?P<shape>\d+(?:_\d+)*)\.tensor$")
NO_SIMULATOR = b"invalid choice: 'inference'"  # argparse's answer of a toolkit without the subcommand
SIM_DIR = "sim"
# the call's step number, apart from the compile's (1, 2, ... in order): a re-attach finds this call whether its replay
# ran the compile's steps or took them from the cache (kept before the stop), and never takes a compile step's exit code
# for it (or it for the import's, when the first run was the cache hit)
STEP = 1000


def inference_args(name: str, entry: Any, out_dir: str, meta: str, iterations: int) -> list[str]:
    """`pegasus inference` of the quantized model over `iterations` images of the inputmeta's dataset (argv as
    notes/pegasus.md gives it; hybrid: the .quantize.json)."""
    q = cubie.quantized_name(name, entry)
    model = f"{q}.quantize.json" if entry.hybrid_topn else f"{name}.json"
    return ["inference", "--model", model, "--model-data", f"{name}.data", "--dtype", "quantized",
            "--model-quantize", f"{q}.quantize", "--iterations", str(iterations), "--device", "CPU", "--output-dir", out_dir,
            "--with-input-meta", meta]


def missing(prep: Prepared) -> str | None:
    """Why the simulator cannot run on this work dir (a cache hit skipped the pegasus steps), or None."""
    q = cubie.quantized_name(prep.name, prep.entry)
    need = [f"{prep.name}.json", f"{prep.name}.data", f"{q}.quantize", f"{prep.name}_inputmeta.yml"]
    absent = [n for n in need if not (prep.work_dir / n).is_file()]
    return f"{', '.join(absent)} not in the work dir (a cache hit)" if absent else None


def read_tensors(folder: Path, shapes: Sequence[Sequence[int]], iteration: int) -> list[NDArray[np.float32]]:
    """One iteration's output .tensor files matched to the ONNX outputs by element count (name order among equals)."""
    import numpy as np  # here, not at the top: the daemon imports this module but reads tensors only in a child

    matched = {p: TENSOR_RE.match(p.name) for p in folder.iterdir()}
    sizes = {p: math.prod(int(d) for d in m.group("shape").split("_")) for p, m in matched.items()
             if m is not None and int(m.group("iteration")) == iteration}
    files = sorted(sizes)
    found = []
    for shape in shapes:
        match = next((p for p in files if sizes[p] == math.prod(shape)), None)
        if match is None:
            raise ValueError(f"no iter_{iteration} .tensor file of {math.prod(shape)} values (output shape {list(shape)}) "
                             f"in {folder.name}")
        files.remove(match)
        # loadtxt's C parser: the same float32 values as np.fromfile(sep="\n"), at a fifth of its time (0.34 s of a
        # 640 report's 16 images)
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


def run(prep: Prepared, ctx: Context) -> tuple[Path | None, str]:
    """Every held-out image through the simulator in one call: (its output folder, note), or (None, why not) to
    emulate instead. The folder is read by the child (read_tensors): the daemon never holds a model's outputs."""
    why = missing(prep)
    if why is not None or ctx.container is None:
        return None, f"simulator not run: {why or 'no container'}"
    work = prep.work_dir
    staged = work / SIM_DIR / "inputmeta.yml"
    if not staged.is_file():  # else staged by this attempt before a restart: its call may run on it, never rewritten
        _stage(prep, staged)
    out = work / SIM_DIR / "out"
    args = inference_args(prep.name, prep.entry, str(out), str(staged), len(prep.held_out))
    code, output = cubie.Runner(ctx, ctx.container("cubie"), work).call(args, number=STEP)
    if code != 0:
        return None, ("the image has no `pegasus inference`" if NO_SIMULATOR in output
                      else f"`pegasus inference` exited {code} (see the job log)")
    done = {int(m.group("iteration")) for p in out.glob("*.tensor") if (m := TENSOR_RE.match(p.name))}
    if done != set(range(len(prep.held_out))):
        return None, f"`pegasus inference` wrote .tensor files for {len(done)} of {len(prep.held_out)} images in {SIM_DIR}/out"
    return out, "pegasus inference --dtype quantized (the toolkit's simulator)"


def _stage(prep: Prepared, staged: Path) -> None:
    """The held-out images and their dataset for the simulator, and its inputmeta (`staged`, written last, whole)."""
    staged.parent.mkdir(exist_ok=True)
    dataset = calibration.stage(prep.held_out, prep.work_dir, "eval", "eval_dataset.txt")
    meta = yaml.safe_load((prep.work_dir / f"{prep.name}_inputmeta.yml").read_text())
    meta["input_meta"]["databases"][0]["path"] = str(dataset.resolve())
    files.write_bytes(staged, yaml.safe_dump(meta, sort_keys=False).encode())
