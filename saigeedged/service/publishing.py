"""Publishing a built bundle while the outbox refuses it: the same bundle is tried again with a growing backoff.

A full or read-only share is not the job's fault and recompiling does not help, so the worker keeps the bundle
and waits for the share (up to limits.publish_patience_s) instead of requeueing the job.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from saigeedged.errors import SaigeError

BACKOFF_S = (1.0, 2.0, 5.0, 10.0, 30.0, 60.0)  # between tries; the last one repeats
SLICE_S = 0.2  # how often a wait looks for a stop or cancel


def publish_patiently(place: Callable[[], dict[str, Any]], patience_s: float,
                      interrupted: Callable[[], str | None],
                      on_refused: Callable[[SaigeError, float], None],
                      clock: Callable[[], float] = time.monotonic) -> dict[str, Any]:
    """`place()` until the outbox takes the bundle; PUBLISH_FAILED (exhausted=True) once patience_s has passed."""
    give_up = clock() + patience_s
    tries = 0
    while True:
        try:
            return place()
        except SaigeError as exc:
            if exc.code != "PUBLISH_FAILED" or exc.fields.get("exhausted"):
                raise
            wait_s = BACKOFF_S[min(tries, len(BACKOFF_S) - 1)]
            if clock() + wait_s > give_up:
                raise SaigeError("PUBLISH_FAILED", f"{exc.message} (the outbox refused the bundle for "
                                 f"{patience_s:.0f}s, limits.publish_patience_s)", exhausted=True) from None
            on_refused(exc, wait_s)
        _wait(clock() + wait_s, interrupted, clock)
        tries += 1


def _wait(until: float, interrupted: Callable[[], str | None], clock: Callable[[], float]) -> None:
    while (left := until - clock()) > 0:
        reason = interrupted()
        if reason is not None:
            raise SaigeError("CANCELLED", f"stopped while waiting for the outbox ({reason})", reason=reason)
        time.sleep(min(SLICE_S, left))
