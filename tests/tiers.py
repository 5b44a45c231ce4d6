"""The suite's tiers and how scripts/test runs them: the linters and each lane in parallel with the others, the tiers
of a lane one after another, each tier a pytest run of its own (its output in .test-logs/<tier>.log); then the slowest
tests of all.

A tier is the tests of its markers that no earlier tier took, and the last tier takes the rest, so every test runs in
exactly one tier. Lanes share no state: the CPU-bound tiers (unit, docker: onnxruntime in the daemons' children) go
one after the other in one lane; the tiers that mostly wait on their own boxes (systemd: bootstrap, package builds,
apt in the box) and slurm (a cluster of node containers, mostly waiting on Slurm's failure detection) each have a lane
of their own.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).parent.parent
LOGS = ROOT / ".test-logs"
SLOWEST = 15


@dataclass(frozen=True)
class Tier:
    name: str
    markers: str | None  # a pytest -m expression; None: every test the tiers before it left
    args: tuple[str, ...] = ()  # e.g. pytest-xdist's workers: more than the cores where the tests mostly wait


# Order matters: a test with markers of two tiers runs in the first. The unit tests mostly wait (settle times,
# daemon start-ups: 2.4 min of CPU in 8 min serial), so they get more workers than the 2 cores; the docker tests
# each own their containers (names made unique per test); the two systemd modules each boot their own box, and the
# memory tests (minutes of big files, no box) run beside them on the worker the shorter systemd module leaves idle.
TIERS = (
    Tier("systemd", "systemd or memory", ("-n", "2", "--dist", "loadfile")),
    Tier("slurm", "slurm"),
    Tier("docker", "docker or journald", ("-n", "3", "--dist", "worksteal")),
    Tier("unit", None, ("-n", "4", "--dist", "worksteal")),
)
LANES = (("unit", "docker"), ("systemd",), ("slurm",))
VENV = ROOT / ".venv" / "bin"
LINTERS = ((str(VENV / "ruff"), "check", "saigeedged", "tests", "bench"), (str(VENV / "mypy"),),
           (str(ROOT / "scripts" / "lint-imports"),))  # the layers of .importlinter: imports go one way


def expression(tier: Tier) -> str:
    """The -m expression of `tier`: its own markers, less every earlier tier's."""
    earlier = [t.markers for t in TIERS[:TIERS.index(tier)] if t.markers]
    own = [f"({tier.markers})"] if tier.markers else []
    return " and ".join(own + [f"not ({m})" for m in earlier])


def run_tier(tier: Tier, results: dict[str, int]) -> None:
    log, junit = LOGS / f"{tier.name}.log", LOGS / f"{tier.name}.xml"
    argv = [sys.executable, "-m", "pytest", "-q", "-rfE", "-m", expression(tier), f"--junitxml={junit}", *tier.args]
    start = time.monotonic()
    with log.open("w") as out:
        code = subprocess.run(argv, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT).returncode
    results[tier.name] = code  # 5 (no test collected) fails like any other non-zero exit
    summary = log.read_text(errors="replace").strip().splitlines()[-1:] or ["(no output)"]
    print(f"[{tier.name}] exit {code} in {time.monotonic() - start:.0f} s: {summary[0]}", flush=True)


def lint(results: dict[str, int]) -> None:
    """Every linter, one after another, into .test-logs/lint.log; the first that fails ends it."""
    with (LOGS / "lint.log").open("w") as out:
        for argv in LINTERS:
            code = subprocess.run(argv, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT).returncode
            if code:
                break
    results["lint"] = code
    print(f"[lint] exit {code}", flush=True)


def run_lane(names: tuple[str, ...], results: dict[str, int]) -> None:
    for name in names:
        run_tier(next(t for t in TIERS if t.name == name), results)


def slowest(limit: int) -> list[tuple[float, str]]:
    """The slowest tests of every tier's JUnit report: (seconds, tier id)."""
    found = []
    for report in LOGS.glob("*.xml"):
        for case in ET.parse(report).iter("testcase"):
            found.append((float(case.get("time", 0)), f"{case.get('classname')}::{case.get('name')}"))
    return sorted(found, reverse=True)[:limit]


def counts() -> tuple[int, int, int]:
    """(passed, failed, skipped) over every tier's JUnit report (errors count as failed)."""
    passed = failed = skipped = 0
    for report in LOGS.glob("*.xml"):
        for suite in ET.parse(report).iter("testsuite"):
            tests, bad = int(suite.get("tests", 0)), int(suite.get("failures", 0)) + int(suite.get("errors", 0))
            skips = int(suite.get("skipped", 0))
            passed, failed, skipped = passed + tests - bad - skips, failed + bad, skipped + skips
    return passed, failed, skipped


def main() -> int:
    LOGS.mkdir(exist_ok=True)
    for old in LOGS.glob("*"):
        old.unlink()
    results: dict[str, int] = {}
    lanes = [threading.Thread(target=run_lane, args=(lane, results)) for lane in LANES]
    lanes.append(threading.Thread(target=lint, args=(results,)))
    for lane in lanes:
        lane.start()
    for lane in lanes:
        lane.join()
    failed = [name for name, code in results.items() if code != 0]
    for name in failed:
        print(f"\n===== {name}: the end of {LOGS / name}.log", flush=True)
        print("\n".join((LOGS / f"{name}.log").read_text(errors="replace").splitlines()[-60:]))
    print(f"\nslowest {SLOWEST}:")
    for seconds, test in slowest(SLOWEST):
        print(f"{seconds:8.2f}s {test}")
    passed, bad, skipped = counts()
    print(f"\n{passed} passed, {bad} failed" + (f", {skipped} skipped" if skipped else ""))  # all tiers together
    return 1 if failed or bad or not passed or len(results) != len(TIERS) + 1 else 0


if __name__ == "__main__":
    sys.exit(main())
