"""Watchdog wiring: inotify events only wake the scanner; network filesystems are polled."""

from __future__ import annotations

import os
import threading
from pathlib import Path

from watchdog.events import FileSystemEvent, FileSystemEventHandler
from watchdog.observers import Observer

from saigeedged.files import OWN_DIR

NETWORK_FS = frozenset({"nfs", "nfs4", "cifs", "smb3", "smbfs", "fuse.sshfs", "9p", "ceph", "glusterfs", "fuse.glusterfs"})


def filesystem_type(path: Path, mounts: str | None = None) -> str:
    """The type of the filesystem holding `path`, from the mount table (longest matching mount point)."""
    if mounts is None:
        try:
            mounts = Path("/proc/self/mounts").read_text()
        except OSError:
            return "unknown"
    real = os.path.realpath(path)
    best, kind = "", "unknown"
    for line in mounts.splitlines():
        parts = line.split()
        if len(parts) < 3:
            continue
        point = parts[1].replace("\\040", " ")
        inside = real == point or real.startswith(point.rstrip("/") + "/")
        if inside and len(point) >= len(best):
            best, kind = point, parts[2]
    return kind


def use_polling(mode: str, inbox: Path, mounts: str | None = None) -> bool:
    """poll: always; events: never; auto: on network filesystems, where inotify misses other clients' writes."""
    if mode == "auto":
        return filesystem_type(inbox, mounts) in NETWORK_FS
    return mode == "poll"


class _Wake(FileSystemEventHandler):
    """Sets the event and nothing else: an exception here would kill watchdog's dispatcher thread.

    Changes inside the daemon's own folder (`.saigeedged/`: claimed/, failed/) never wake it: they are its own
    claims, and each would cost a scan of the inbox (thousands in a burst).
    """

    def __init__(self, event: threading.Event, own: str) -> None:
        self.event, self.own = event, own

    def on_any_event(self, event: FileSystemEvent) -> None:
        if event.event_type == "opened" or event.event_type == "closed_no_write":
            return
        where = event.dest_path or event.src_path  # a move into claimed/ is our claim
        path = where.decode(errors="replace") if isinstance(where, bytes) else where
        if path != self.own and not path.startswith(self.own + os.sep):
            self.event.set()


class Watcher:
    """inotify on the inbox tree; `alive()` is false when the observer thread died."""

    def __init__(self, inbox: Path, wake: threading.Event) -> None:
        self._observer = Observer()
        self._observer.schedule(_Wake(wake, str(inbox / OWN_DIR)), str(inbox), recursive=True)
        self._observer.daemon = True

    def start(self) -> None:
        self._observer.start()

    def alive(self) -> bool:
        return bool(self._observer.is_alive())

    def stop(self, timeout: float = 5) -> None:
        self._observer.stop()
        self._observer.join(timeout=timeout)
