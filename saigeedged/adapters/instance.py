"""One daemon per state_dir: an flock on <state_dir>/daemon.lock held for the daemon's life (the kernel lets it go when
the process ends, however it ends), the holder's pid and start written in it for the refusal to name."""

from __future__ import annotations

import contextlib
import fcntl
import io
import os
from pathlib import Path
from typing import TextIO

from saigeedged import jobid

NAME = "daemon.lock"


class Taken(Exception):
    """Another process holds the state_dir; its words are who (the lock file's line)."""


def hold(state_dir: Path) -> TextIO:
    """The lock, held until the returned file is closed or the process ends; Taken when another daemon holds it.
    Two daemons on one state_dir both claim, re-attach and settle the same jobs (one failed the other's fresh claim)."""
    state_dir.mkdir(parents=True, exist_ok=True)
    try:
        fh = (state_dir / NAME).open("a+")
    except PermissionError:  # left by a `sudo saigeedged run`: flock needs no write access, only the pid line does
        fh = (state_dir / NAME).open("r")
    try:
        fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        fh.seek(0)
        holder = fh.read(200).strip() or "a process that has not written its pid yet"
        fh.close()
        raise Taken(holder) from None
    with contextlib.suppress(OSError, io.UnsupportedOperation):  # a full state_dir, a read-only file: no line
        fh.seek(0)
        fh.truncate()
        fh.write(f"pid {os.getpid()}, started {jobid.iso(jobid.utc_now())}\n")
        fh.flush()
    return fh
