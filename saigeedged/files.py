"""File helpers light enough for the short-lived commands (`submit` imports neither onnx nor docker): digest, fsync."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path


def sha256_file(path: Path) -> str:
    with path.open("rb") as fh:
        return hashlib.file_digest(fh, "sha256").hexdigest()


def fsync_path(path: Path) -> None:
    """fsync a file or a folder (a folder: so a rename in it survives a crash)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
