"""Whose bundle a file in the outbox is: the job its checkpoint.yaml names (`build.job_id`, SPEC §7), a field only
saigeedged writes (guards.PROVENANCE) and that stays readable in an encrypted bundle."""

from __future__ import annotations

import zipfile
from pathlib import Path

from saigeedged import safeyaml

CHECKPOINT = "checkpoint.yaml"


def built_for(path: Path) -> str | None:
    """The job_id the bundle at `path` was built for; None when it is no bundle of ours (missing, a link, not a zip,
    no readable checkpoint, a checkpoint too big to be ours). Reads the zip's directory and one small member."""
    try:
        if not path.is_file() or path.is_symlink():
            return None
        with zipfile.ZipFile(path) as bundle:
            info = bundle.getinfo(CHECKPOINT)
            if info.file_size > safeyaml.MAX_BYTES:
                return None
            doc = safeyaml.loads(bundle.read(info))
    except Exception:  # noqa: BLE001 - any file on the share (damaged: zlib.error, lzma.LZMAError, EOFError; encrypted,
        return None  # unknown members, poison YAML) is simply not one we can tell is ours
    build = doc.get("build") if isinstance(doc, dict) else None
    job_id = build.get("job_id") if isinstance(build, dict) else None
    return job_id if isinstance(job_id, str) else None
