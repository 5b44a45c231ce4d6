"""An attempt's record: what the daemon knows of one attempt beside its job row, kept in the store (SPEC §15), as
versioned JSON (pure: no I/O).

Nothing about an attempt lives in memory only or in a file the compiler container can write (the work root is
bind-mounted read-write into every local container): a planted file must not steer the daemon. The attempt's folder
holds only what its steps write.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

VERSION = 1  # of the record's JSON; a record of another version is unreadable (its attempt is requeued, step killed)


class UnreadableRecord(ValueError):
    """A record this daemon cannot read (damaged, or written by another version)."""


@dataclass
class AttemptRecord:
    """One attempt: the `take`-th time its job was taken (jobs.Attempt.take), its number, engine and work dir.

    `started`: a container step may have been launched (written before the launch); `crashes`: daemons that died
    under it; `detached`: the last daemon stopped on purpose and left its step running (not a crash); `reap`: it was
    given up on and its step is still to be killed on `engine`; `prepared`: its host steps' results (resume.to_doc);
    `steps`: each container step's exec id and the bytes of its log the job log has (detached.Book).
    """

    job_id: str
    take: int
    number: int
    engine: str
    target: str
    work: str = ""
    started: bool = False
    crashes: int = 0
    detached: bool = False
    reap: bool = False
    prepared: dict[str, Any] | None = None
    # by step number ("<variant folder>/<number>" for a variant's): {"exec": id, "seen": offset}
    steps: dict[str, dict[str, Any]] = field(default_factory=dict)

    def to_doc(self) -> dict[str, Any]:
        return {"version": VERSION, **dataclasses.asdict(self)}

    @classmethod
    def from_doc(cls, doc: Any) -> AttemptRecord:
        """The record of `doc`; UnreadableRecord when it is not one this version wrote."""
        if not isinstance(doc, dict) or doc.get("version") != VERSION:
            version = doc.get("version") if isinstance(doc, dict) else None
            raise UnreadableRecord(f"attempt record of version {version!r}, this saigeedged reads {VERSION}")
        names = {f.name: f.type for f in dataclasses.fields(cls)}
        try:
            record = cls(**{k: v for k, v in doc.items() if k in names})
        except TypeError as exc:
            raise UnreadableRecord(f"attempt record without {exc}") from None
        _check(record)
        return record


_TYPES = {"job_id": str, "take": int, "number": int, "engine": str, "target": str, "work": str, "started": bool,
          "crashes": int, "detached": bool, "reap": bool}


def _check(record: AttemptRecord) -> None:
    for name, kind in _TYPES.items():
        if not isinstance(getattr(record, name), kind):
            raise UnreadableRecord(f"attempt record field {name} is not a {kind.__name__}")
    if record.prepared is not None and not isinstance(record.prepared, dict):
        raise UnreadableRecord("attempt record field prepared is not a mapping")
    if not isinstance(record.steps, dict) or not all(isinstance(v, dict) for v in record.steps.values()):
        raise UnreadableRecord("attempt record field steps is not a mapping of mappings")
