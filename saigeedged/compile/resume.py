"""An attempt's host steps kept in its work dir, so the attempt resumed after a daemon restart (SPEC §15) goes on
with its container steps as they were: the calibration images are not staged again under a running quantize."""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import TYPE_CHECKING

from saigeedged import files
from saigeedged.compile.ahead import Replay
from saigeedged.compile.inputs import Prepared

if TYPE_CHECKING:
    from saigeedged.adapters.joblog import JobLog

NAME = ".steps/prepared.pickle"  # beside the steps' own files; written by the daemon only, in its own state_dir
DETACHED = ".steps/detached"  # the daemon stopped on purpose and left the attempt's step running
CRASHES = ".steps/crashes"  # how many daemons died under this attempt without a stop


def started(work: Path) -> bool:
    """Has this attempt started a container step (which may run on without the daemon)?"""
    return any((work / NAME).parent.glob("*.exec"))


def detach(work: Path) -> None:
    """The daemon stops and leaves this attempt's step running on purpose: the next start re-attaches, counting
    no crash."""
    (work / DETACHED).parent.mkdir(parents=True, exist_ok=True)
    (work / DETACHED).touch()


def interrupted(work: Path) -> int:
    """The last daemon ended: how many daemons died under this attempt, this one included (0: it stopped cleanly)."""
    marker = work / DETACHED
    if marker.exists():
        marker.unlink()
        return 0
    try:
        crashes = int((work / CRASHES).read_text() or 0) + 1
    except (FileNotFoundError, ValueError):
        crashes = 1
    if work.is_dir():
        (work / CRASHES).parent.mkdir(parents=True, exist_ok=True)
        (work / CRASHES).write_text(str(crashes))
    return crashes


def save(prep: Prepared, work: Path) -> None:
    """Keep what validate, surgery and calibration found, for a resume of this attempt."""
    (work / NAME).parent.mkdir(parents=True, exist_ok=True)
    files.write_bytes(work / NAME, pickle.dumps(prep))


def replay(work: Path, log: JobLog) -> Replay | None:
    """The host steps of the attempt in `work` as they ended before the restart; None when they did not end."""
    try:
        prep = pickle.loads((work / NAME).read_bytes())  # noqa: S301 - the daemon's own file, mode of state_dir
    except (OSError, pickle.UnpicklingError, EOFError, AttributeError):
        return None
    if not isinstance(prep, Prepared) or prep.dataset is None or not prep.dataset.is_file():
        return None
    return Replay(prep, log, "host steps done before the restart: kept as they were")
