"""`python -m saigeedged.demo`: the daemon on ./demo/inbox compiling a generated detector for the host CPU."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import yaml

from saigeedged.cli import examples


def prepare(root: Path) -> tuple[Path, Path, Path]:
    """Write the example detector, its calibration set, a manifest and a daemon config under `root`."""
    for sub in ("inbox", "outbox", "state"):
        shutil.rmtree(root / sub, ignore_errors=True)
    (root / "data").mkdir(parents=True, exist_ok=True)
    model = examples.yolox(root / "ppe_detector.onnx", num_classes=3, size=(128, 128))
    calib = examples.valjson(root / "data", examples.random_labels(24, 3, seed=7),
                             names=["helmet", "head", "person"], relative=True)
    manifest = root / "ppe_detector.yml"
    manifest.write_text(yaml.safe_dump({"task": "detection", "num_classes": 3, "calib": str(calib.resolve()),
                                        "target": "host", "n_samples": 16}, sort_keys=False))
    config = root / "saigeedged.yml"
    config.write_text(yaml.safe_dump({"inbox": "inbox", "outbox": "outbox", "state_dir": "state",
                                      "allowed_roots": ["data"], "watch": {"settle_s": 0.5},
                                      "defaults": {"target": "host"}, "log": {"format": "json"}}))
    return model, manifest, config


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--dir", type=Path, default=Path("demo"), help="where to put the demo (default ./demo)")
    args = parser.parse_args(argv)
    root = args.dir.resolve()
    model, manifest, config = prepare(root)
    print(f"demo: example detector {model}\n      calibration {root / 'data' / 'val.json'} (24 images)")
    log = (root / "daemon.log").open("wb")
    daemon = subprocess.Popen([sys.executable, "-m", "saigeedged", "run", "-c", str(config)], stderr=log,
                              stdout=subprocess.DEVNULL)
    print(f"demo: daemon started (pid {daemon.pid}) on {root / 'inbox'}, events in {root / 'daemon.log'}")
    try:
        submit = subprocess.run([sys.executable, "-m", "saigeedged", "submit", str(model), str(manifest),
                                 "--wait", "--timeout", "300", "-c", str(config)], capture_output=True, text=True)
    finally:
        daemon.send_signal(signal.SIGTERM)
        daemon.wait(60)
    print(submit.stdout.strip() or submit.stderr.strip())
    lines = submit.stdout.splitlines()
    if not lines or not Path(lines[0]).is_file():
        return 1
    status = json.loads(Path(lines[0]).read_text())
    report(status, root)
    return 0 if status["state"] == "succeeded" and submit.returncode == 0 else 1


def report(status: dict[str, object], root: Path) -> None:
    print(f"\nstatus   {status['state']}  ({status['job_id']}, {status['step_count']} steps, attempt {status['attempt']})")
    bundle = status.get("bundle")
    if isinstance(bundle, dict):
        print(f"bundle   {root / 'outbox' / bundle['path']}  ({bundle['bytes']} bytes, sha256 {bundle['sha256'][:16]}...)")
    print(f"log      {root / 'outbox' / str(status['log'])}")
    rep = status.get("quantization_report")
    if isinstance(rep, dict):
        print(f"\nquantization report (float vs INT8 on {rep['images']} calibration images, flag below {rep['threshold']})")
        for name, row in rep["outputs"].items():
            flag = "  FLAGGED" if row["flagged"] else ""
            print(f"  {name:<28} cosine {row['cosine']:.4f}  max abs error {row['max_abs_error']:.4g}{flag}")
    if isinstance(bundle, dict):
        accuracy(root / "outbox" / bundle["path"])
    error = status.get("error")
    if error:
        print(f"\nerror    {error}")



def accuracy(path: Path) -> None:
    """The bundle's accuracy report (SPEC §17), as the job log prints it."""
    import zipfile

    from saigeedged import accuracytable

    with zipfile.ZipFile(path) as zf:
        if "accuracy.json" not in zf.namelist():
            return
        result = json.loads(zf.read("accuracy.json"))
    print()
    print("\n".join(accuracytable.table(result)))


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    raise SystemExit(main())
