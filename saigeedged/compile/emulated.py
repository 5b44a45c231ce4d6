"""The emulation's quantized model kept per compile (SPEC §17): a board job's report re-quantizes the float model on
the host (report.emulated_job); a cache hit or a variant with the same compile key, or a redone report, takes the
model made before instead of quantizing again. Kept in the cache's folder (<state_dir>/cache/.emulated/, which
`saigeedged cache clear` empties too, outside cache.max_bytes) named by a digest of the compile key, the emulation's
settings and onnxruntime's version; the newest KEEP files stay."""

from __future__ import annotations

import contextlib
import hashlib
import importlib.metadata
import os
import shutil
from pathlib import Path

from saigeedged.adapters import cache

KEEP = 64


def path(state_dir: Path, key: str | None, method: str, bits: int) -> Path | None:
    """Where the emulated model of this compile is kept (None: no compile key, nothing is kept)."""
    if not key:
        return None
    version = importlib.metadata.version("onnxruntime")
    digest = hashlib.sha256(f"{key}\n{method}\n{bits}\n{version}".encode()).hexdigest()[:32]
    return state_dir / "cache" / cache.EMULATED / f"{digest}.onnx"


def take(kept: Path | None, dest: Path) -> bool:
    """The kept model copied to dest; False when none is kept. A copy, never a hard link: dest lies in the job's work
    folder, which the next job's steps share (the container's work root), and a write through a link would change the
    kept model every later report of this compile takes."""
    if kept is None or not kept.is_file():
        return False
    with contextlib.suppress(FileNotFoundError):
        dest.unlink()
    try:
        shutil.copyfile(kept, dest)
    except FileNotFoundError:  # evicted meanwhile
        return False
    return True


def keep(made: Path, kept: Path | None) -> None:
    """The model just made kept for the next report of this compile (atomically; a full disk only costs a
    re-quantization later), the oldest beyond KEEP removed."""
    if kept is None:
        return
    try:
        kept.parent.parent.mkdir(mode=cache.MODE, parents=True, exist_ok=True)  # the plain model of an encrypted
        kept.parent.mkdir(mode=cache.MODE, exist_ok=True)  # bundle: the daemon's user only, like the cache
        tmp = kept.with_name(f".{kept.name}.{os.getpid()}.tmp")
        shutil.copyfile(made, tmp)
        os.replace(tmp, kept)
        files = sorted(kept.parent.glob("*.onnx"), key=lambda p: p.stat().st_mtime)
        for old in files[:-KEEP]:
            old.unlink(missing_ok=True)
    except OSError:
        return
