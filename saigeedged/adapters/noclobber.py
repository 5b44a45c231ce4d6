"""Publishing without replacing another job's file: a name is taken by a hard link, which fails if it exists."""

from __future__ import annotations

import errno
import os
from pathlib import Path

NO_LINKS = frozenset({errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EMLINK})  # shares without hard links


def take(tmp: Path, dest: Path) -> bool:
    """Move the finished `tmp` to `dest` unless `dest` exists (False then, `tmp` left for the caller)."""
    try:
        os.link(tmp, dest)
    except FileExistsError:
        return False
    except OSError as exc:
        if exc.errno not in NO_LINKS:
            raise
        if os.path.lexists(dest):  # without links the check and the rename are two calls: the best a share allows
            return False
        os.replace(tmp, dest)
        return True
    os.unlink(tmp)
    return True


def unique_name(rel: Path, job_id: str) -> Path:
    """`det.host.saigeedge` of job `det-20261130T031500Z-a1b2c3` -> `det.host.20261130T031500Z-a1b2c3.saigeedge`."""
    suffix = "-".join(job_id.rsplit("-", 2)[1:]) or job_id
    stem = rel.name[: -len(".saigeedge")] if rel.name.endswith(".saigeedge") else rel.name
    return rel.with_name(f"{stem}.{suffix}.saigeedge")
