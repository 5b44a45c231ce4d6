"""A burst of cache-off cubie (or host) drops of a YOLOX-nano-shaped detector through the daemon (issue 25, not a test): the
time from the drops to the last job's end with the report on (the default 16 held-out images) and with
`eval_samples: 0`, and their ratio. Each run has its own state dir, container and daemon (under `prlimit --as` when
asked); the stand-in ACUITY image is SAIGEEDGED_STANDIN_ACUITY (default saigeedged-standin/acuity:test).

    .venv/bin/python bench/burst.py [--drops 30] [--size 640] [--prlimit 6000000000]

The stand-in compiler does no work: each job's container steps take a fraction of a second, so with the report on
the burst is bounded by the reports (made one at a time by the finishing stage), not by the container.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).parent.parent / "tests"))
from factory import random_labels, valjson  # noqa: E402
from harness import Daemon  # noqa: E402
from realmodels import yolox_nano  # noqa: E402

STANDIN = os.environ.get("SAIGEEDGED_STANDIN_ACUITY", "saigeedged-standin/acuity:test")


def burst(root: Path, drops: int, size: int, eval_samples: int, prlimit: str | None, target: str = "cubie") -> dict[str, Any]:
    """Seconds from the drops to the last job's end, and the jobs' states."""
    root.mkdir(parents=True)
    container = f"saige-burst-{os.getpid()}-{root.name}"
    config = root / "saigeedged.yml"
    config.write_text(yaml.safe_dump({
        "inbox": str(root / "inbox"), "outbox": str(root / "outbox"), "state_dir": str(root / "state"),
        "allowed_roots": [str(root / "data")], "log": {"format": "json"}, "watch": {"settle_s": 0.5},
        "cubie": {"image": STANDIN, "container": container}, "defaults": {"target": target}}))
    onnx = yolox_nano(root / "det.onnx", size)
    calib = valjson(root / "data", random_labels(48, 3))
    manifest = {"task": "detection", "num_classes": 3, "calib": str(calib), "n_samples": 16, "cache": False,
                "eval_samples": eval_samples}
    staging = root / "staging"
    staging.mkdir()
    for i in range(drops):  # made beside the inbox, moved in at once
        shutil.copyfile(onnx, staging / f"b{i:03d}.onnx")
        (staging / f"b{i:03d}.yml").write_text(yaml.safe_dump(manifest))
    d = Daemon(config)
    d.prefix = ["prlimit", f"--as={prlimit}"] if prlimit else []
    d.start()
    try:
        start = time.monotonic()
        for path in sorted(staging.iterdir(), key=lambda p: p.suffix != ".onnx"):
            path.rename(d.inbox / path.name)
        while True:
            docs = [json.loads(p.read_text()) for p in (d.outbox / "status").glob("b*.json")]
            if len(docs) == drops and all(doc["state"] in ("succeeded", "failed") for doc in docs):
                break
            time.sleep(0.5)
        return {"seconds": time.monotonic() - start, "states": sorted({doc["state"] for doc in docs}),
                "errors": sorted({doc["error"]["code"] for doc in docs if doc["error"]})}
    finally:
        d.stop()
        d.close()
        subprocess.run(["docker", "rm", "-f", container], capture_output=True, check=False)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--drops", type=int, default=30)
    parser.add_argument("--size", type=int, default=640)
    parser.add_argument("--prlimit", default=None)
    parser.add_argument("--target", default="cubie", choices=("cubie", "host"))
    args = parser.parse_args()
    print(f"load average before: {' '.join(f'{x:.1f}' for x in os.getloadavg())}", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        off = burst(Path(tmp) / "off", args.drops, args.size, 0, args.prlimit, args.target)
        print(f"eval_samples 0: {off}", flush=True)
        on = burst(Path(tmp) / "on", args.drops, args.size, 16, args.prlimit, args.target)
        print(f"report on (16): {on}", flush=True)
    print(f"{args.drops} drops of a {args.size} detector: report on {on['seconds']:.1f} s, eval_samples 0 "
          f"{off['seconds']:.1f} s, ratio {on['seconds'] / off['seconds']:.2f}; load average after: "
          f"{' '.join(f'{x:.1f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
