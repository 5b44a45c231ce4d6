"""Final jobs as they appear in the queue, whoever ended them: the worker, or `saigeedged cancel` in a shell."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta

from saigeedged.adapters.store import Store
from saigeedged.jobid import utc_now
from saigeedged.jobs import Job

# An end is stamped before its row is saved, so a later look also reads back this far behind the newest end seen.
LOOK_BACK = timedelta(seconds=120)


def _key(job: Job) -> tuple[str, str]:
    return job.job_id, job.finished_at or ""


class Ends:
    """`fresh()` returns each end once: the first call every final job in the queue (or, after `skip()`, those of the
    look-back window only), later calls only new ends."""

    def __init__(self, store: Store, clock: Callable[[], datetime] = utc_now) -> None:
        self.store, self.clock = store, clock
        self.newest = ""  # the latest finished_at seen ("" before the first call)
        self._seen: set[tuple[str, str]] = set()  # ends inside the look-back window, already returned
        self.floor = ""  # ends before this were counted elsewhere (the metrics' kept summary)

    def since(self) -> str:
        """Where the next `fresh()` starts reading ("" = from the first end; never before `floor`)."""
        if not self.newest:
            return self.floor
        # not beyond now: an end stamped in the future (a clock set back since) must not hide every later end
        newest = min(datetime.fromisoformat(self.newest.replace("Z", "+00:00")), self.clock())
        return max(self.floor, (newest - LOOK_BACK).strftime("%Y-%m-%dT%H:%M:%S"))

    def skip(self) -> str:
        """Start from the newest end in the queue instead of the first: the ends before `since()` (returned) are
        never returned; those after it are, once (a caller that wants them counted reads them in SQL)."""
        self.newest = self.store.newest_end()
        return self.since()

    def fresh(self) -> list[Job]:
        since = self.since()
        # the look-back window is read again at every call (a burst: hundreds of ends): decode only the new ones
        seqs = [seq for job_id, end, seq in self.store.end_keys_since(since) if (job_id, end or "") not in self._seen]
        jobs = list(self.store.paged(seqs))
        self.newest = max([self.newest, *(job.finished_at or "" for job in jobs)])
        self._seen = {key for key in self._seen if key[1] >= since} | {_key(job) for job in jobs if job.finished_at}
        return jobs
