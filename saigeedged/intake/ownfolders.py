"""The daemon's own folders in the inbox (`.saigeedged/claimed`, `failed`): real folders of the service, never links.

Droppers can write the inbox, so they could replace one of these with a symlink and have the daemon move drops
into any folder it can write. Each is checked right before use: anything that is not a plain folder owned by the
service (or root) is moved aside (renaming a link never follows it) and a fresh folder made, writable by the
service only.
"""

from __future__ import annotations

import os
import stat
import time
from pathlib import Path

import structlog

log = structlog.get_logger()
MODE = 0o755  # readable by the teams (their failed inputs), writable by the service only


def _ours(path: Path) -> bool:
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return True  # made below
    return stat.S_ISDIR(st.st_mode) and st.st_uid in (os.geteuid(), 0)  # root made it: trusted, left as it is


def ensure(folder: Path, top: Path) -> Path:
    """Make every folder from `top` (exclusive) down to `folder` a real folder of ours; returns `folder`."""
    parts = folder.relative_to(top).parts
    current = top
    for part in parts:
        current = current / part
        if not _ours(current):
            aside = current.with_name(f"{part}.not-ours-{time.time_ns()}")
            os.rename(current, aside)
            log.warning("folder.replaced", path=str(current), moved_to=str(aside),
                        message="not a folder of the service (a symlink?): moved aside, never followed")
        try:
            os.mkdir(current, MODE)
        except FileExistsError:
            pass
        st = os.lstat(current)
        if st.st_uid == os.geteuid() and stat.S_IMODE(st.st_mode) & 0o022:
            os.chmod(current, MODE)
    return folder


def move(folder: Path, dest: Path, top: Path) -> None:
    """Move a claimed folder to `dest` (e.g. under failed/), its parent checked by ensure first."""
    ensure(dest.parent, top)
    folder.rename(dest)
