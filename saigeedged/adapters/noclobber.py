"""Publishing without replacing another job's file: the other name a bundle takes when its own is taken.

Taking a name without replacing is files.take (files.atomic_write with exclusive=True).
"""

from __future__ import annotations

from pathlib import Path


def unique_name(rel: Path, job_id: str) -> Path:
    """`det.host.saigeedge` of job `det-20261130T031500Z-a1b2c3` -> `det.host.20261130T031500Z-a1b2c3.saigeedge`."""
    suffix = "-".join(job_id.rsplit("-", 2)[1:]) or job_id
    stem = rel.name[: -len(".saigeedge")] if rel.name.endswith(".saigeedge") else rel.name
    return rel.with_name(f"{stem}.{suffix}.saigeedge")
