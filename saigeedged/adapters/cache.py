"""The compile cache under <state_dir>/cache/ (SPEC §12): the only module that writes there.

One folder per compile key holding the compiled artifacts (never bundles) and meta.json. An entry is built
under a temporary name and renamed into place, so a crash never leaves a half entry under a key's name; a hit
re-checks every file's digest anyway. Least recently used entries go first when the cache outgrows max_bytes.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from saigeedged.config import Config
from saigeedged.errors import SaigeError
from saigeedged.files import fsync_path, open_output, sha256_file

META = "meta.json"
TMP_PREFIX = ".tmp-"
EMULATED = ".emulated"  # the emulated models of board reports (compile/emulated.py): not entries, cleared with them
LOCK_POLL_S = 0.1  # flock has no timeout: a waiter polls so that a stop or cancel can end the wait
MODE = 0o700  # the daemon's user only: an entry is the plain compiled model even when its bundle is encrypted


@dataclass(frozen=True)
class Cached:
    """One complete entry: its key, folder, meta.json, size and last use (for LRU)."""

    key: str
    path: Path
    meta: dict[str, Any]
    size: int
    used: float


def _sound(meta: dict[str, Any], key: str) -> bool:
    """meta.json of the entry for `key` (a folder copied under another key's name is not), its files plain names."""
    files = meta.get("files")
    return (meta.get("key") == key and isinstance(files, dict)
            and all(isinstance(n, str) and n not in ("", ".", "..", META) and "/" not in n for n in files))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class Cache:
    """Entries by key: get() a verified hit into a work dir, put() a finished compile, evict to max_bytes."""

    def __init__(self, root: Path, max_bytes: int) -> None:
        self.root, self.max_bytes = root, max_bytes

    @property
    def enabled(self) -> bool:
        return self.max_bytes > 0

    def _read(self, folder: Path) -> Cached | None:
        try:
            meta = json.loads((folder / META).read_text())
            used = (folder / META).stat().st_mtime
        except (OSError, ValueError):
            return None
        size = sum(int(f["bytes"]) for f in meta.get("files", {}).values())
        return Cached(folder.name, folder, meta, size, used)

    def entries(self) -> list[Cached]:
        """Complete entries, least recently used first (temporary and partly deleted folders are not entries)."""
        if not self.root.is_dir():
            return []
        found = [self._read(p) for p in self.root.iterdir() if p.is_dir() and not p.name.startswith(".")]
        return sorted((c for c in found if c is not None), key=lambda c: (c.used, c.key))

    def get(self, key: str, dest: Path) -> dict[str, Any] | None:
        """Link (or copy) the entry's files into `dest` and check their digests; its meta.json, or None on a miss."""
        entry = self._read(self.root / key)
        if entry is None or not _sound(entry.meta, key):
            return None
        dest.mkdir(parents=True, exist_ok=True)
        try:
            for name, facts in entry.meta["files"].items():
                target = dest / name
                target.unlink(missing_ok=True)
                try:
                    os.link(entry.path / name, target)
                except OSError:
                    shutil.copyfile(entry.path / name, target)
                if sha256_file(target) != facts["sha256"]:
                    return None  # a damaged entry is a miss; the next success replaces it
        except (OSError, KeyError):
            return None  # evicted meanwhile
        with contextlib.suppress(OSError):  # evicted right after its files were linked: they are this job's now
            os.utime(entry.path / META)  # its last use, for LRU
        return entry.meta

    def put(self, key: str, files: Mapping[str, Path], meta: dict[str, Any], root: Path | None = None) -> bool:
        """Store `files` (name -> path, each a regular file under `root`, the attempt's folder, by default its own
        folder: files.open_output) under `key` atomically; False when it cannot be kept (too big, disabled)."""
        size = sum(p.stat().st_size for p in files.values())
        if not self.enabled or size > self.max_bytes:
            return False
        self.root.mkdir(mode=MODE, parents=True, exist_ok=True)
        self.root.chmod(MODE)  # also a cache made before this mode was set
        self.sweep()
        tmp = self.root / f"{TMP_PREFIX}{key}-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        try:
            facts = {}
            for name, src in files.items():
                with open_output(src, root) as fin, (tmp / name).open("wb") as fout:
                    shutil.copyfileobj(fin, fout, 1 << 20)
                fsync_path(tmp / name)
                facts[name] = {"sha256": sha256_file(tmp / name), "bytes": (tmp / name).stat().st_size}
            (tmp / META).write_text(json.dumps({**meta, "key": key, "files": facts}, indent=1))
            fsync_path(tmp / META)
            fsync_path(tmp)
            self._replace(tmp, self.root / key)
            fsync_path(self.root)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        self.evict(keep=key)
        return True

    def _replace(self, tmp: Path, final: Path) -> None:
        """Rename `tmp` to `final`; an older entry of the same key (damaged, or a race) is moved aside first."""
        if final.exists():
            self._discard(final)
        try:
            os.rename(tmp, final)
        except OSError:  # another process stored the same key meanwhile: its entry is as good
            pass

    def _discard(self, folder: Path) -> None:
        """Rename out of sight, then delete: a half-deleted entry is never read as an entry."""
        gone = folder.with_name(f"{TMP_PREFIX}gone-{folder.name}-{time.monotonic_ns()}-{os.getpid()}")
        try:
            os.rename(folder, gone)
        except OSError:
            return
        shutil.rmtree(gone, ignore_errors=True)

    def evict(self, keep: str | None = None) -> list[str]:
        """Delete least recently used entries until the cache fits max_bytes; returns their keys."""
        entries = self.entries()
        total = sum(e.size for e in entries)
        evicted = []
        for entry in entries:
            if total <= self.max_bytes:
                break
            if entry.key == keep:
                continue
            self._discard(entry.path)
            total -= entry.size
            evicted.append(entry.key)
        return evicted

    def sweep(self) -> None:
        """Remove temporary folders of writers that died (a crash mid-put): they are never entries anyway."""
        if not self.root.is_dir():
            return
        for path in self.root.glob(f"{TMP_PREFIX}*"):
            pid = path.name.rsplit("-", 1)[-1]
            if path.is_dir() and not (pid.isdigit() and _alive(int(pid))):
                shutil.rmtree(path, ignore_errors=True)

    def clear(self) -> int:
        """Delete every entry; returns how many there were."""
        entries = self.entries()
        for entry in entries:
            self._discard(entry.path)
        shutil.rmtree(self.root / EMULATED, ignore_errors=True)
        self.sweep()
        return len(entries)

    @contextlib.contextmanager
    def locked(self, key: str, interrupted: Callable[[], str | None] = lambda: None) -> Iterator[None]:
        """Hold the key's own lock across processes around a get or a put of that key (never around a compile: a
        compile stuck on a lost engine must not hold back the attempt that replaces it)."""
        self.root.mkdir(mode=MODE, parents=True, exist_ok=True)
        folder = self.root / ".locks"
        folder.mkdir(parents=True, exist_ok=True)
        with (folder / key).open("a") as fh:  # never deleted: unlinking a lock file races with its next user
            while True:
                try:
                    fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    reason = interrupted()
                    if reason is not None:
                        raise SaigeError("CANCELLED", f"stopped while waiting for the same compile ({reason})",
                                         reason=reason) from None
                    time.sleep(LOCK_POLL_S)
            try:
                yield
            finally:
                fcntl.flock(fh, fcntl.LOCK_UN)


def for_config(config: Config) -> Cache:
    return Cache(config.state_dir / "cache", config.cache.max_bytes)


def command(config: Config, action: str, out: TextIO) -> int:
    """`saigeedged cache ls` (least recently used first) and `saigeedged cache clear`."""
    store = for_config(config)
    if action == "clear":
        count = store.clear()
        print(f"cleared {count} entr{'y' if count == 1 else 'ies'} from {store.root}", file=out)
        return 0
    entries = store.entries()
    print(f"{'KEY':<16} {'BYTES':>12} {'LAST USED':<20} {'TARGET':<8} {'MODEL':<28} SOURCE JOB", file=out)
    for entry in entries:
        used = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(entry.used))
        meta = entry.meta
        print(f"{entry.key[:16]:<16} {entry.size:>12} {used:<20} {meta.get('target', '?'):<8} "
              f"{meta.get('model', '?'):<28} {meta.get('source_job_id', '?')}", file=out)
    total = sum(e.size for e in entries)
    print(f"{len(entries)} entr{'y' if len(entries) == 1 else 'ies'}, {total} of {store.max_bytes} bytes "
          f"(cache.max_bytes) in {store.root}", file=out)
    return 0
