"""Claims that survive a crash: a record in each claimed folder says where its files came from and which rows
the claim makes, so a folder under claimed/ without rows (a kill mid-claim, a row that could not be written, a
lost database) becomes its jobs again, goes back to the inbox, or ends as a failed job; never silently lost.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from saigeedged.files import write_bytes
from saigeedged.jobs import Job

RECORD = ".saigeedged-claim.json"  # hidden: the scanner never looks at it and bundles never include it


def write_record(claim_dir: Path, base: Path, files: list[Path], jobs: list[Job] | None = None) -> None:
    """Before the renames: where the files come from; after them, the jobs too (temp name + rename)."""
    claim_dir.mkdir(parents=True, exist_ok=True)
    doc: dict[str, Any] = {"base": str(base), "files": [str(p) for p in files],
                           "jobs": [j.to_doc() for j in jobs] if jobs is not None else None}
    write_bytes(claim_dir / RECORD, json.dumps(doc).encode(), tmp=claim_dir / f"{RECORD}.tmp")


def read_record(claim_dir: Path) -> dict[str, Any] | None:
    try:
        doc: dict[str, Any] = json.loads((claim_dir / RECORD).read_text())
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None


def undo(claim_dir: Path, record: dict[str, Any]) -> None:
    """Move what an unfinished claim moved back where it was and remove the folder: the next scan sees the drop."""
    base = Path(record["base"])
    for name in record["files"]:
        src = Path(name)
        if src.exists():
            continue
        rel = src.relative_to(base) if src.is_relative_to(base) else Path(src.name)
        moved = claim_dir / rel
        if not moved.is_file():
            moved = next((p for p in claim_dir.rglob(src.name) if p.is_file()), moved)
        if moved.is_file():
            src.parent.mkdir(parents=True, exist_ok=True)
            os.rename(moved, src)
    shutil.rmtree(claim_dir)


def contents(claim_dir: Path) -> list[Path]:
    """The files of a claimed folder, the record aside."""
    return [p for p in claim_dir.rglob("*") if p.is_file() and p.name not in (RECORD, f"{RECORD}.tmp")]


@dataclass
class Orphan:
    """A folder under claimed/ that no row points at, and what its record says."""

    folder: Path
    record: dict[str, Any] | None

    @property
    def jobs(self) -> list[Job]:
        docs = (self.record or {}).get("jobs") or []
        return [Job.from_doc(doc) for doc in docs]

    @property
    def complete(self) -> bool:
        """Were all its files moved in and its rows written down (so re-adding the rows finishes the claim)?"""
        if not self.record or not self.record.get("jobs"):
            return False
        return all(not Path(f).exists() for f in self.record["files"])


@dataclass
class Seen:
    """What the last looks at claimed/ found: folders already settled are not read again, and claimed/ is not even
    listed while its mtime stays (and is old enough that a folder made in the same clock tick cannot hide)."""

    settled: set[str] = field(default_factory=set)
    unsettled: set[str] = field(default_factory=set)  # orphans returned last time: looked at again at each call
    mtime_ns: int | None = None


FRESH_NS = 2_000_000_000  # an mtime this recent may hide a later change in the same tick: claimed/ is listed again


def orphans(claimed: Path, settled: Callable[[Orphan], bool], seen: Seen | None = None) -> list[Orphan]:
    """Folders under `claimed` that `settled` says lack rows; with `seen`, only folders not seen settled before."""
    seen = seen if seen is not None else Seen()
    try:
        mtime = os.stat(claimed).st_mtime_ns
        if mtime == seen.mtime_ns and time.time_ns() - mtime > FRESH_NS:
            names = seen.settled | seen.unsettled  # nothing came or went
        else:
            names = {p.name for p in os.scandir(claimed) if p.is_dir() and not p.name.startswith(".")}
            seen.mtime_ns = mtime
    except OSError:
        return []
    seen.settled &= names
    found = []
    for name in sorted(names - seen.settled):
        orphan = Orphan(claimed / name, read_record(claimed / name))
        if settled(orphan):
            seen.settled.add(name)
        else:
            found.append(orphan)
    seen.unsettled = {o.folder.name for o in found}
    return found
