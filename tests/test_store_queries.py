"""The queue's read-only queries answered from jobs_queued_target give what a read of every queued row gives."""

from __future__ import annotations

from collections import Counter
from itertools import combinations
from pathlib import Path

from saigeedged.adapters.store import Store
from saigeedged.jobs import RUNNING, Job

TARGETS = ("cubie", "mobilint", "host")


def queued(job_id: str, target: str, priority: int) -> Job:
    return Job(job_id=job_id, name=job_id, target=target, task="mlc", entry={"onnx": "a.onnx", "target": target},
               subdir="", claim_dir=f"/c/{job_id}", manifest="m.yml", priority=priority, created_at="x")


def test_next_queued_with_skipped_targets_and_counts_by_target(tmp_path: Path) -> None:
    """For every set of skipped targets, next_queued is the highest-priority, first-claimed job of the others
    (priorities mixed across targets), and count_by_target counts the queue, also once its head runs."""
    store = Store(tmp_path / "q.db")
    jobs = [queued(f"j{i}", TARGETS[i * 7 % 3], (i * 5) % 4) for i in range(30)]
    for job in jobs:
        store.add(job)
    for taken in range(3):
        waiting = jobs[taken:]
        for n in range(3):
            for skip in combinations(TARGETS, n):
                rest = [j for j in waiting if j.target not in skip]
                want = min(rest, key=lambda j: (-j.priority, jobs.index(j))).job_id if rest else None
                got = store.next_queued(skip)
                assert (got.job_id if got else None) == want, skip
        assert store.count_by_target("queued") == Counter(j.target for j in waiting)
        head = store.get(jobs[taken].job_id)
        assert head is not None
        head.state = RUNNING
        store.save(head)  # out of the queue, and out of the index
    assert store.next_queued(TARGETS) is None
