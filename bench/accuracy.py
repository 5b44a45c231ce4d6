"""The accuracy report's cost (SPEC §17), measured from the job log (not a test): the `bundle` step (where the report
is made) of the same compile with `eval_samples: 16` and `eval_samples: 0`, for host (its INT8 model) and mobilint
(the emulation, on the stand-in qbcompiler image when it is loaded), next to the whole compile.

    .venv/bin/python bench/accuracy.py [--runs 3] [--size 128]
"""

from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).parent.parent / "tests"))
from factory import manifest, random_labels, valjson, yolox  # noqa: E402

from saigeedged.cli import main as cli  # noqa: E402

STANDIN = "saigeedged-standin/qbcompiler:test"


def _one(root: Path, target: str, eval_samples: int, size: int) -> tuple[float, float]:
    """(seconds of the bundle step, seconds of the whole compile) of one job."""
    root.mkdir(parents=True)
    config = root / "saigeedged.yml"
    config.write_text(yaml.safe_dump({"state_dir": str(root / "state"), "inbox": str(root / "in"),
                                      "outbox": str(root / "out"), "mobilint": {"image": STANDIN,
                                                                                "container": f"saige-bench-{root.name}"}}))
    calib = valjson(root / "data", random_labels(48, 3))
    extra = {"device": "aries-rb"} if target == "mobilint" else {}
    mf = manifest(root / "det.yml", task="detection", num_classes=3, calib=str(calib), target=target, n_samples=16,
                  eval_samples=eval_samples, cache=False, onnx=str(yolox(root / "det.onnx", size=(size, size))),
                  output=str(root / "det.saigeedge"), **extra)
    start = time.monotonic()
    try:
        if cli.main(["compile", str(mf), "-c", str(config)]) != 0:
            raise SystemExit(f"{target} compile failed")
    finally:
        if target == "mobilint":  # one container per run (a container belongs to its state dir)
            subprocess.run(["docker", "rm", "-f", f"saige-bench-{root.name}"], capture_output=True, check=False)
    whole = time.monotonic() - start
    log = next((root / "state" / "logs").iterdir()).read_text()
    found = re.search(r"----- bundle: ok in ([0-9.]+)s", log)
    assert found is not None
    return float(found.group(1)), whole


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--size", type=int, default=128, help="detector input size (square)")
    parser.add_argument("--targets", default="host,mobilint")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        for target in args.targets.split(","):
            rows = {n: [_one(Path(tmp) / f"{target}-{n}-{i}", target, n, args.size) for i in range(args.runs)]
                    for n in (16, 0)}
            with_report = statistics.median(b for b, _ in rows[16])
            without = statistics.median(b for b, _ in rows[0])
            whole = statistics.median(w for _, w in rows[16])
            print(f"{target:<9} report of 16 held-out images: {with_report - without:.2f} s "
                  f"(bundle step {with_report:.2f} s vs {without:.2f} s without), whole compile {whole:.2f} s")


if __name__ == "__main__":
    main()
