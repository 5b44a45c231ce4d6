"""Detached steps, measured from outside (not a test; SPEC §15):

- per step: one `true` step run by Container.run_step (started detached, followed through its .steps/ files) against
  the same `timeout ... true` as one streamed exec (create, stream, inspect: how steps ran before);
- re-attach: a daemon restarted (SIGTERM, then start) during a 20 s quantize: from the SIGTERM to the old daemon's
  exit, and to the new daemon's first job-log line (the re-attach banner), and to its `job.reattached` event.

    .venv/bin/python bench/reattach.py [--steps 30] [--runs 3]      # figures as JSON on stdout
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).parent.parent / "tests"))
sys.path.insert(0, str(Path(__file__).parent))
from harness import Daemon, drop, wait_for  # noqa: E402

from bench import STANDIN, config, inputs  # noqa: E402
from saigeedged import config as configmod  # noqa: E402
from saigeedged.adapters.docker import Containers  # noqa: E402
from saigeedged.adapters.docker.execs import KILL_AFTER, TIMEOUT_BIN  # noqa: E402


def per_step(steps: int) -> dict[str, float]:
    """Median seconds of one step: detached and followed, against one streamed exec of the same argv."""
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        name = f"saige-bench-steps-{os.getpid()}"
        cfg = configmod.load(config(root, cubie={"image": STANDIN, "container": name}))
        containers = Containers(cfg)
        ctr = containers.get("cubie")
        work = cfg.work_root / "bench"
        work.mkdir(parents=True)
        api = containers.api().api
        try:
            detached, streamed = [], []
            for _ in range(steps):
                t0 = time.monotonic()
                ctr.run_step(["true"], work, 60, lambda chunk: None)
                detached.append(time.monotonic() - t0)
                t0 = time.monotonic()
                ctr.ensure()  # as the old run_step did before each step
                exec_id = api.exec_create(name, [TIMEOUT_BIN, f"--kill-after={KILL_AFTER}", "60s", "true"],
                                          workdir=str(work))["Id"]
                for _chunk in api.exec_start(exec_id, stream=True, demux=True):
                    pass
                while api.exec_inspect(exec_id)["Running"]:
                    time.sleep(0.005)
                streamed.append(time.monotonic() - t0)
        finally:
            containers.release()
            containers.api().containers.get(name).remove(force=True)
    return {"step_detached_s": round(statistics.median(detached), 4),
            "step_streamed_s": round(statistics.median(streamed), 4)}


def _one_reattach(run: int) -> tuple[float, float, float, float]:
    """One restart mid-quantize: seconds to the old daemon's exit, the new one's READY=1, its first log line, its
    event."""
    import docker

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        onnx, manifest = inputs(root)
        name = f"saige-bench-reattach-{os.getpid()}-{run}"
        cfg = config(root, cubie={"image": STANDIN, "container": name}, defaults={"target": "cubie"},
                     watch={"settle_s": 0.2})
        d = Daemon(cfg).start()
        try:
            drop(d.inbox, f"det_sleep20_{run}", onnx, manifest)
            job = d.wait_job(f"det_sleep20_{run}", ("running",))
            d.wait_state(job["job_id"], ("running",), step="quantize", timeout=120)
            log = Path(yaml.safe_load(cfg.read_text())["state_dir"]) / "logs" / f"{job['job_id']}.log"
            wait_for(lambda: "pegasus.py quantize" in log.read_text(), 30, "quantize under way")
            t0 = time.monotonic()
            d.signal(signal.SIGTERM)
            d.proc.wait(30)  # type: ignore[union-attr]
            exited = time.monotonic() - t0
            seen = len(d.messages)
            d.start()
            d.expect("READY=1", 60, after=seen)  # the new daemon's (start() is satisfied by the old one's)
            ready = time.monotonic() - t0
            wait_for(lambda: "re-attached in step" in log.read_text(), 60, "the job log going on")
            line = time.monotonic() - t0
            wait_for(lambda: d.events("job.reattached"), 60, "job.reattached")
            return exited, ready, line, time.monotonic() - t0
        finally:
            d.stop()
            try:
                docker.from_env().containers.get(name).remove(force=True)
            except Exception:  # never made
                pass


def reattach(runs: int) -> dict[str, float]:
    """Median seconds from the SIGTERM of a daemon mid-quantize to the new daemon's first job-log line and event."""
    exits, readies, lines, events = zip(*(_one_reattach(run) for run in range(runs)), strict=True)
    return {"stop_exit_s": round(statistics.median(exits), 3), "restart_ready_s": round(statistics.median(readies), 3),
            "reattach_next_log_line_s": round(statistics.median(lines), 3),
            "reattach_event_s": round(statistics.median(events), 3)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--runs", type=int, default=3, help="restarts (0: the per-step figures only)")
    args = parser.parse_args()
    figures: dict[str, Any] = {**per_step(args.steps), **(reattach(args.runs) if args.runs else {})}
    print(json.dumps(figures, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
