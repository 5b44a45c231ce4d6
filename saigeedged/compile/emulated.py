"""The emulation's quantized model kept per compile (SPEC §17): a board job's report re-quantizes the float model on
the host (report.emulated_job); a cache hit or a variant with the same compile key, or a redone report, takes the
model made before instead of quantizing again. Kept in the cache's folder (<state_dir>/cache/.emulated/, which
`saigeedged cache clear` empties too, outside cache.max_bytes) named by a digest of the compile key, the emulation's
settings and onnxruntime's version, then by the sha256 of the model's bytes, which a take checks like a cache entry's
files (a damaged model is removed and made again, never run); the newest KEEP files stay."""

from __future__ import annotations

import contextlib
import hashlib
import importlib.metadata
import os
import shutil
from pathlib import Path

from saigeedged.adapters import cache
from saigeedged.files import sha256_file

KEEP = 64


def path(state_dir: Path, key: str | None, method: str, bits: int) -> Path | None:
    """Where the emulated model of this compile is kept (None: no compile key, nothing is kept): the file is this
    path's name followed by `.<sha256 of its bytes>.onnx`, so a kept model names the content it must have, and
    replacing it is one rename."""
    if not key:
        return None
    version = importlib.metadata.version("onnxruntime")
    digest = hashlib.sha256(f"{key}\n{method}\n{bits}\n{version}".encode()).hexdigest()[:32]
    return state_dir / "cache" / cache.EMULATED / digest


def _kept(slot: Path) -> list[Path]:
    """The models kept under `slot` (one, but for two reports of a compile keeping at once)."""
    return list(slot.parent.glob(f"{slot.name}.*.onnx"))


def take(slot: Path | None, dest: Path) -> bool:
    """The kept model copied to dest; False when none is kept whose bytes are those its name says (one that is not, a
    disk's damage or a hand's, is removed: the report makes and keeps a new one). A copy, never a hard link: dest
    lies in the job's work folder, which the next job's steps share (the container's work root), and a write through a
    link would change the kept model every later report of this compile takes. The copy is what is checked: it is
    what the report runs."""
    if slot is None:
        return False
    for kept in _kept(slot):
        with contextlib.suppress(FileNotFoundError):
            dest.unlink()
        try:
            shutil.copyfile(kept, dest)
            if sha256_file(dest) == kept.name.removeprefix(f"{slot.name}.").removesuffix(".onnx"):
                return True
        except FileNotFoundError:  # evicted meanwhile
            continue
        except OSError:  # unreadable (EIO, a folder in its place): made again, like one whose bytes changed
            pass
        with contextlib.suppress(OSError):
            kept.unlink()
    with contextlib.suppress(FileNotFoundError):
        dest.unlink()
    return False


def keep(made: Path, slot: Path | None) -> None:
    """The model just made kept for the next report of this compile (atomically; a full disk only costs a
    re-quantization later), the oldest beyond KEEP removed."""
    if slot is None:
        return
    try:
        slot.parent.parent.mkdir(mode=cache.MODE, parents=True, exist_ok=True)  # the plain model of an encrypted
        slot.parent.mkdir(mode=cache.MODE, exist_ok=True)  # bundle: the daemon's user only, like the cache
        kept = slot.with_name(f"{slot.name}.{sha256_file(made)}.onnx")
        tmp = slot.with_name(f".{kept.name}.{os.getpid()}.tmp")
        shutil.copyfile(made, tmp)
        os.replace(tmp, kept)
        for other in _kept(slot):  # another report's of this compile
            if other != kept:
                other.unlink(missing_ok=True)
        files = sorted(slot.parent.glob("*.onnx"), key=lambda p: p.stat().st_mtime)
        for old in files[:-KEEP]:
            old.unlink(missing_ok=True)
    except OSError:
        return
