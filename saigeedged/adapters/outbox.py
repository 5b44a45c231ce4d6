"""The only writer under the outbox: status files, bundles and job logs, each by files.atomic_write."""

from __future__ import annotations

import contextlib
import json
import os
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

from saigeedged import __version__, files
from saigeedged.adapters import noclobber, provenance
from saigeedged.errors import SaigeError
from saigeedged.guards import printable
from saigeedged.jobs import Job

STATUS_SCHEMA = 1


def _place(src: Path | None, data: bytes | None, dest: Path, exclusive: bool = False,
           commit: Callable[[], object] | None = None) -> bool:
    """Copy `src` (or write `data`) to `dest` by files.atomic_write; an OSError is PUBLISH_FAILED (retryable).

    `exclusive`: never replace an existing `dest` (False when it exists, the temp file removed). `commit`: see
    files.atomic_write (a copy only).
    """
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)  # inside the try: a sub-folder that cannot be made is retryable
        if src is not None:  # never a link a step swapped in
            return files.copy_file(src, dest, exclusive=exclusive, nofollow=True, commit=commit)
        return files.write_bytes(dest, data or b"", exclusive=exclusive)
    except OSError as exc:
        raise SaigeError("PUBLISH_FAILED", f"cannot write {dest}: {exc.strerror or exc}") from None


def place_file(src: Path, dest: Path) -> None:
    """Copy `src` to `dest` atomically (temp name beside it, fsync, rename): no reader sees a partial file."""
    _place(src, None, dest)


def place_data(data: bytes, dest: Path) -> None:
    """Write `data` to `dest` atomically (temp name beside it, fsync, rename)."""
    _place(None, data, dest)


def status_doc(job: Job) -> dict[str, Any]:
    """The status file of SPEC §8 (never the password, never a traceback).

    A job whose files retention removed (`pruned_at`) names no bundle or log: a later job may have published at its
    bundle's path, and a reader would fetch that model for this one.
    """
    pruned = job.pruned_at is not None
    return {
        "schema_version": STATUS_SCHEMA, "job_id": job.job_id, "request_id": job.request_id, "name": job.name,
        "state": job.state, "step": job.step, "step_index": job.step_index, "step_count": job.step_count,
        "target": job.target, "task": job.task, "attempt": job.attempt,
        "inputs": {"onnx": printable(Path(job.entry["onnx"]).name), "onnx_sha256": job.onnx_sha256, "manifest": job.manifest,
                   "calib_samples": job.calib_samples},
        "bundle": None if pruned else job.bundle, "log": None if pruned else f"logs/{job.job_id}.log",
        "pruned_at": job.pruned_at, "progress": job.progress,
        "quantization_report": job.report, "cache": job.cache, "accuracy": job.accuracy,
        "created_at": job.created_at, "started_at": job.started_at, "finished_at": job.finished_at,
        "updated_at": job.updated_at, "error": job.error, "host": socket.gethostname(), "version": __version__,
        "engine": job.engine, "attempts": job.attempts,
    }


class Outbox:
    """Writes under <outbox>: status/<job_id>.json, <subdir>/<output>, logs/<job_id>.log."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def status_path(self, job_id: str) -> Path:
        return self.root / "status" / f"{job_id}.json"

    def write_status(self, job: Job) -> None:
        data = json.dumps(status_doc(job), indent=1).encode() + b"\n"
        _place(None, data, self.status_path(job.job_id))

    def read_status(self, job_id: str) -> dict[str, Any] | None:
        try:
            doc: dict[str, Any] = json.loads(self.status_path(job_id).read_text())
            return doc
        except (OSError, ValueError):
            return None

    def publish_bundle(self, bundle: Path, rel: Path, job_id: str | None = None,
                       commit: Callable[[], object] | None = None) -> dict[str, Any]:
        """Place the bundle at <outbox>/<rel>; returns the status file's `bundle` object.

        With `job_id`, a file already at `rel` (another job's bundle, a re-drop's predecessor) is never replaced:
        this bundle then takes a name of its own, so every recorded digest stays true. `commit()`: called just before
        each rename onto a bundle's name (files.atomic_write): what it raises leaves nothing in the outbox.
        """
        from saigeedged.files import sha256_file

        digest, size = sha256_file(bundle), bundle.stat().st_size
        if job_id is not None and not _place(bundle, None, self.root / rel, exclusive=True, commit=commit):
            rel = noclobber.unique_name(rel, job_id)
            if not _place(bundle, None, self.root / rel, exclusive=True, commit=commit):
                raise SaigeError("PUBLISH_FAILED", f"{rel} exists already", exhausted=True,  # waiting will not help
                                 hint=f"move {rel} out of the outbox (this job's own name there), then `saigeedged "
                                 "retry JOB_ID`")
        elif job_id is None:
            _place(bundle, None, self.root / rel, commit=commit)
        return {"path": rel.as_posix(), "sha256": digest, "bytes": size}

    def unpublish(self, rel: Path, job_id: str) -> list[Path]:
        """Remove the bundles of `job_id` from <outbox>/<rel> and the name of its own it takes there (publish_bundle):
        a publication a crash cut between the rename and the job's end, which no status file names. A file there that
        is not this job's bundle is left alone. The paths removed, relative to the outbox; OSError when the share
        refuses."""
        removed = []
        for candidate in (rel, noclobber.unique_name(rel, job_id)):
            path = self.root / candidate
            if provenance.built_for(path) == job_id:
                path.unlink()
                removed.append(candidate)
                with contextlib.suppress(OSError):  # removed: a folder that refuses its fsync says nothing else
                    files.fsync_path(path.parent)
        return removed

    def fetch_log(self, job_id: str, local: Path) -> bool:
        """Copy <outbox>/logs/<job_id>.log to the host-local `local`; False when there is none. Only a regular file is
        read (anyone may write on the share: a link there would copy any file of the host into the job's log). OSError
        when the share refuses it."""
        if not os.path.lexists(self.root / "logs" / f"{job_id}.log"):
            return False
        local.parent.mkdir(parents=True, exist_ok=True)
        return files.copy_file(self.root / "logs" / f"{job_id}.log", local, nofollow=True)

    def move_log(self, local: Path, job_id: str) -> None:
        """Copy the host-local job log to <outbox>/logs/, then delete the local one."""
        if local.exists():
            _place(local, None, self.root / "logs" / f"{job_id}.log")
            local.unlink()
