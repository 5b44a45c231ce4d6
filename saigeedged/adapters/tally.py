"""The metrics' counts of ended jobs up to a point in time, kept in the job database so a restart adds only the ends
since the last summary instead of reading the whole history again."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from saigeedged import accuracytable
from saigeedged.adapters.store import Store

NAME = "metrics"


@dataclass
class Tally:
    """Counts of the jobs that ended before `before` (a UTC ISO string; "" = none counted yet)."""

    before: str = ""
    jobs: dict[str, int] = field(default_factory=dict)  # "target|state|code" -> jobs
    hits: int = 0
    buckets: dict[str, list[int]] = field(default_factory=dict)  # target -> jobs per run-time bucket
    seconds: dict[str, float] = field(default_factory=dict)  # target -> sum of run times
    last_success: dict[str, str] = field(default_factory=dict)  # target -> latest end of a success
    attempts: dict[str, int] = field(default_factory=dict)  # "engine|code" -> attempts
    # "target|task" -> [end, worst cosine] of the last measured job (the accuracy gauge after a restart); None in a
    # summary written before it was kept: filled once from the ends it counted (`fill_accuracy`)
    accuracy: dict[str, list[Any]] | None = None

    @classmethod
    def load(cls, store: Store) -> Tally:
        doc = store.tally(NAME) or {}
        try:
            tally = cls(**doc)
        except TypeError:  # written by another version: counted again from the rows
            return cls(accuracy={})
        return tally

    def fill_accuracy(self, store: Store) -> bool:
        """A summary kept before it held the accuracy: read it once from the ends it counted; True when it did."""
        if self.accuracy is not None:
            return False
        self._measured(store, "", self.before)
        return True

    def save(self, store: Store) -> None:
        store.set_tally(NAME, self.__dict__)

    def add(self, store: Store, before: str, bounds: tuple[float, ...]) -> None:
        """Count the jobs that ended in [self.before, before) and move the mark to `before`."""
        groups = store.ended_groups(self.before, before, bounds)
        for target, state, code, hit, bucket, jobs, seconds, latest in groups:
            key = f"{target}|{state}|{code}"
            self.jobs[key] = self.jobs.get(key, 0) + jobs
            self.hits += jobs if hit else 0
            if bucket is not None:
                counts = self.buckets.setdefault(target, [0] * len(bounds))
                counts[bucket] += jobs
                self.seconds[target] = self.seconds.get(target, 0.0) + seconds
            if state == "succeeded" and latest > self.last_success.get(target, ""):
                self.last_success[target] = latest
        for engine, code, attempts in store.ended_attempts(self.before, before):
            key = f"{engine}|{code}"
            self.attempts[key] = self.attempts.get(key, 0) + attempts
        self._measured(store, self.before, before)
        self.before = before

    def _measured(self, store: Store, after: str, before: str) -> None:
        """The last measured job per target and task among those that ended in [after, before)."""
        self.accuracy = self.accuracy or {}
        for target, task, end, report in store.last_measured(after, before):
            worst, key = accuracytable.worst_cosine(report), f"{target}|{task}"
            if worst is not None and end >= self.accuracy.get(key, [""])[0]:
                self.accuracy[key] = [end, worst]
