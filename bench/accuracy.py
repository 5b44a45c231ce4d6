"""The accuracy report's cost (SPEC §17, issue 25), measured from real jobs (not a test): YOLOX-nano-shaped detectors
at 320, 416 and 640 and a MobileNetV3-Small-shaped classifier (tests/realmodels.py), host (the INT8 model itself) and
mobilint (the emulation, on the stand-in qbcompiler image), `saigeedged compile` with the default 16 held-out images.
Per row, the median of `--runs`: the compile (the steps before `bundle`), the report (what accuracy.json's `cost`
says the report child took) against max(0.25 x compile, 10 s), and the child's peak RSS.

    .venv/bin/python bench/accuracy.py [--runs 3] [--targets host,mobilint] [--models det320,det416,det640,mbv3]
        [--prlimit 6000000000]   # every job under that address-space limit too

The CPU may be shared: the load average is printed next to the figures (the ratios are what matter).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import yaml

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE.parent / "tests"))
from factory import manifest, random_labels, valjson  # noqa: E402
from realmodels import mobilenet_v3, yolox_nano  # noqa: E402

STANDIN = os.environ.get("SAIGEEDGED_STANDIN_MOBILINT", "saigeedged-standin/qbcompiler:test")
STEP = re.compile(r"^----- (?P<step>\w+): ok in (?P<s>[0-9.]+)s$", re.M)
BEFORE_BUNDLE = {"host": ("wrap", "quantize", "report"), "mobilint": ("parse", "quantize")}


def _model(root: Path, name: str) -> tuple[Path, str]:
    if name == "mbv3":
        return mobilenet_v3(root / "m.onnx", 3), "mlc"
    return yolox_nano(root / "m.onnx", int(name.removeprefix("det"))), "detection"


def one(root: Path, target: str, model: str, prlimit: str | None) -> dict[str, float]:
    """One job: its compile seconds, report seconds and the report child's peak RSS (MiB)."""
    root.mkdir(parents=True)
    container = f"saige-bench-{os.getpid()}-{root.name}"
    config = root / "saigeedged.yml"
    config.write_text(yaml.safe_dump({"state_dir": str(root / "state"), "inbox": str(root / "in"),
                                      "outbox": str(root / "out"),
                                      "mobilint": {"image": STANDIN, "container": container}}))
    calib = valjson(root / "data", random_labels(48, 3))
    onnx, task = _model(root, model)
    extra = {"device": "aries-rb"} if target == "mobilint" else {}
    mf = manifest(root / "m.yml", task=task, num_classes=3, calib=str(calib), target=target, n_samples=16, cache=False,
                  onnx=str(onnx), output=str(root / "m.saigeedge"), **extra)
    prefix = ["prlimit", f"--as={prlimit}"] if prlimit else []
    try:
        done = subprocess.run([*prefix, sys.executable, "-m", "saigeedged", "compile", str(mf), "-c", str(config)],
                              capture_output=True, text=True, check=False)
    finally:
        subprocess.run(["docker", "rm", "-f", container], capture_output=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"{target} {model} failed:\n{done.stdout}\n{done.stderr}")
    steps = {m["step"]: float(m["s"]) for m in STEP.finditer(next((root / "state" / "logs").iterdir()).read_text())}
    with zipfile.ZipFile(root / "m.saigeedge") as zf:
        # a report made before issue 25 has no `cost`: its bundle step then (the report and the zip), RSS unknown
        cost = json.loads(zf.read("accuracy.json")).get("cost") or {"seconds": steps["bundle"], "peak_rss_bytes": 0}
    return {"compile": sum(steps.get(s, 0.0) for s in BEFORE_BUNDLE[target]), "report": cost["seconds"],
            "rss": cost["peak_rss_bytes"] / 2**20}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--targets", default="host,mobilint")
    parser.add_argument("--models", default="det320,det416,det640,mbv3")
    parser.add_argument("--prlimit", default=None, help="run every job under prlimit --as=BYTES")
    args = parser.parse_args()
    print(f"load average before: {' '.join(f'{x:.1f}' for x in os.getloadavg())}, prlimit --as={args.prlimit}")
    print("| model | target | compile s | report s | bound s | report / compile | child peak RSS MiB |")
    print("|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for target in args.targets.split(","):
            for model in args.models.split(","):
                runs = [one(Path(tmp) / f"{target}-{model}-{i}", target, model, args.prlimit) for i in range(args.runs)]
                med = {k: statistics.median(r[k] for r in runs) for k in ("compile", "report", "rss")}
                bound = max(0.25 * med["compile"], 10.0)
                verdict = "" if med["report"] <= bound else " (over)"
                print(f"| {model} | {target} | {med['compile']:.1f} | {med['report']:.1f}{verdict} | {bound:.1f} | "
                      f"{med['report'] / med['compile']:.2f} | {med['rss']:.0f} |", flush=True)
    print(f"load average after: {' '.join(f'{x:.1f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
