"""Which missing compiler images the journal warns about: only those of targets the config's `defaults.target` or a
queued or running job asks for, and each (engine, target, image) once, remembered in state_dir across restarts, so a
host that compiles only for `host` logs nothing and a restart does not repeat a warning already given."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterable
from pathlib import Path

from saigeedged import files

RECORD = "missing-images.json"  # in state_dir: the ["engine", "target", "image"] already warned about


class MissingImages:
    """Decides, per engine, which of its missing images are worth a warning now; `forget` when one is loaded."""

    def __init__(self, state_dir: Path, asked: Callable[[], set[str]]) -> None:
        """`asked()`: the targets the config or the queue asks for now."""
        self.path = state_dir / RECORD
        self.asked = asked
        self.warned = self._load()
        self._lock = threading.Lock()  # the monitor looks at each engine from a thread of its own

    def _load(self) -> set[tuple[str, str, str]]:
        try:
            rows = json.loads(self.path.read_text())
            return {(str(e), str(t), str(i)) for e, t, i in rows}
        except (OSError, ValueError, TypeError):  # none yet, or unreadable: warning again is the safe side
            return set()

    def _save(self) -> None:
        try:
            files.write_bytes(self.path, json.dumps(sorted(self.warned)).encode())
        except OSError:  # a full state_dir: the warning comes again at the next start, nothing worse
            pass

    def to_warn(self, engine: str, missing: Iterable[tuple[str, str]]) -> list[tuple[str, str]]:
        """Of the (target, image) pairs `engine` lacks, those asked for and not warned about yet; now they are."""
        missing = list(missing)
        asked = self.asked() if missing else set()
        with self._lock:
            new = [(t, i) for t, i in missing if t in asked and (engine, t, i) not in self.warned]
            if new:
                self.warned |= {(engine, t, i) for t, i in new}
                self._save()
        return new

    def forget(self, engine: str, present: Iterable[tuple[str, str]]) -> None:
        """These images are on `engine` now: if one goes missing again, that is worth a warning again."""
        with self._lock:
            gone = {(engine, t, i) for t, i in present} & self.warned
            if gone:
                self.warned -= gone
                self._save()
