"""The inbox (SPEC §3): scan for drops, the settle rule, the sha256 shortcut, orphans, claim by rename."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from saigeedged import manifest
from saigeedged.errors import SaigeError
from saigeedged.external import external_data
from saigeedged.files import sha256_file
from saigeedged.guards import printable
from saigeedged.manifest import Entry

IGNORED_SUFFIXES = (".tmp", ".part", ".partial", ".crdownload", ".swp", "~")
MANIFEST_SUFFIXES = (".yml", ".yaml")
TAKEN_HINT = ("drop the model again under a name of its own for this manifest (its `onnx:` naming that file), or list both "
              "settings in one manifest's `models:`")
MAX_DEPTH = 32  # inbox sub-folder levels scanned; deeper drops are never seen (and a deep tree costs nothing)

Signature = tuple[int, int, int]  # size, mtime_ns, inode


def ignored(name: str) -> bool:
    """Hidden files and temporary names of writers are never looked at."""
    return name.startswith(".") or name.endswith(IGNORED_SUFFIXES)


def walk(root: Path, symlinks: list[Path] | None = None,
         deep: list[Path] | None = None) -> Iterator[tuple[Path, os.stat_result]]:
    """Every regular, non-ignored file under root with its lstat; symlinks are never followed (only listed).

    Iterative, and folders deeper than MAX_DEPTH are not entered (they are listed in `deep`): a hostile tree must
    not exhaust the stack.
    """
    pending = [(root, 0)]
    while pending:
        folder, depth = pending.pop()
        for item in _entries(folder):
            if ignored(item.name):
                continue
            if item.is_symlink():
                if symlinks is not None:
                    symlinks.append(Path(item.path))
            elif item.is_dir(follow_symlinks=False):
                if depth < MAX_DEPTH:
                    pending.append((Path(item.path), depth + 1))
                elif deep is not None:
                    deep.append(Path(item.path))
            elif item.is_file(follow_symlinks=False):
                yield Path(item.path), item.stat(follow_symlinks=False)


def _entries(folder: Path) -> list[os.DirEntry[str]]:
    try:
        return list(os.scandir(folder))
    except OSError:  # vanished or unreadable: the next scan looks again
        return []


def signature(st: os.stat_result) -> Signature:
    return st.st_size, st.st_mtime_ns, st.st_ino


@dataclass
class Drop:
    """A manifest ready to claim: its entries and the inbox files that move with it."""

    manifest: Path
    entries: list[Entry]
    files: list[Path]


@dataclass
class Rejected:
    """A manifest that will never compile: it fails as a job with this error."""

    manifest: Path
    error: SaigeError
    files: list[Path]


@dataclass
class _Seen:
    sig: Signature
    since: float


@dataclass
class Scanner:
    """Remembers what it saw; `scan(now)` returns drops that are complete and manifests that failed."""

    inbox: Path
    settle_s: float
    orphan_timeout_s: float
    defaults: dict[str, Any]
    _seen: dict[Path, _Seen] = field(default_factory=dict)
    _first: dict[Path, float] = field(default_factory=dict)
    _digests: dict[tuple[Path, Signature], str] = field(default_factory=dict)
    _symlinks: set[Path] = field(default_factory=set)
    _parsed: dict[Path, tuple[Signature, list[Entry] | SaigeError]] = field(default_factory=dict)
    # a manifest (as it was then) whose ONNX went with another manifest's claim: {its ONNX: that manifest}
    _taken: dict[Path, tuple[Signature, dict[Path, Path]]] = field(default_factory=dict)
    # pairs of drops sharing a file whose second one the last scan held back (_one_claim_per_file), as their files were
    _held: set[tuple[Path, Path, tuple[tuple[Path, Signature | None], ...]]] = field(default_factory=set)
    max_digest_bytes: int = 8 << 30  # limits.max_onnx_bytes: the scan (the main loop) never reads a larger ONNX
    # Manifests parsed per scan: a burst of thousands of drops is claimed a batch at a time (the next scan comes at
    # once, see next_due) instead of after every manifest of the burst has been parsed.
    parse_budget: int = 100
    next_due: float | None = None
    new_symlinks: list[Path] = field(default_factory=list)  # seen for the first time in the last scan
    too_deep: list[Path] = field(default_factory=list)  # folders below MAX_DEPTH, not scanned (last scan)

    def _stable(self, path: Path, sig: Signature, now: float) -> bool:
        seen = self._seen.get(path)
        if seen is None or seen.sig != sig:
            self._seen[path] = _Seen(sig, now)
            self._due(now + self.settle_s)
            return self.settle_s <= 0
        if now - seen.since >= self.settle_s:
            return True
        self._due(seen.since + self.settle_s)
        return False

    def _due(self, when: float) -> None:
        self.next_due = when if self.next_due is None else min(self.next_due, when)

    def _digest(self, path: Path, sig: Signature) -> str:
        key = (path, sig)
        if key not in self._digests:
            self._digests[key] = sha256_file(path)
        return self._digests[key]

    def scan(self, now: float) -> list[Drop | Rejected]:
        """One pass over the inbox. `now` is time.monotonic(); next_due says when a pending drop needs a look."""
        self.next_due = None
        links: list[Path] = []
        self.too_deep = []
        files = {p: signature(st) for p, st in walk(self.inbox, links, self.too_deep)}
        self.new_symlinks = [p for p in links if p not in self._symlinks]
        self._symlinks = set(links)
        found: list[Drop | Rejected] = []
        budget, unparsed = self.parse_budget, False
        for path in sorted(files):
            if path.suffix in MANIFEST_SUFFIXES:
                fresh = self._parsed.get(path, (None,))[0] != files[path]
                if fresh and budget <= 0:
                    self._due(now)  # parsed by the next scan, which the loop runs right after claiming these
                    unparsed = True
                    continue
                budget -= fresh
                result = self._guarded(path, files, now)
                if result is not None:
                    found.append(result)
        found = self._one_claim_per_file(self._leave_named(found, files, unparsed), files, now)
        live = set(files)
        self._taken = {p: t for p, t in self._taken.items() if p in live}
        self._seen = {p: s for p, s in self._seen.items() if p in live}
        self._first = {p: t for p, t in self._first.items() if p in live}
        self._digests = {k: v for k, v in self._digests.items() if k[0] in live}
        self._parsed = {p: v for p, v in self._parsed.items() if p in live}
        return found

    def _load(self, path: Path, sig: Signature) -> list[Entry] | SaigeError:
        """The manifest's entries (or its error), parsed again only when the file changed."""
        cached = self._parsed.get(path)
        if cached is None or cached[0] != sig:
            try:
                result: list[Entry] | SaigeError = manifest.load(path, self.defaults, drop=True)
            except SaigeError as exc:
                result = exc
            self._parsed[path] = (sig, result)
        return self._parsed[path][1]

    def _guarded(self, path: Path, files: dict[Path, Signature], now: float) -> Drop | Rejected | None:
        """_consider, where anything unforeseen (a name too long for the filesystem, ...) rejects this manifest only."""
        try:
            return self._consider(path, files, now)
        except FileNotFoundError:
            return None  # a file went away during the scan: the next scan sees the inbox as it is then
        except Exception as exc:  # a guard: one manifest must never stop the scan of the others
            reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else type(exc).__name__
            error = SaigeError("MANIFEST_INVALID", f"{printable(path.name)}: cannot be considered ({reason})",
                               hint="rename the drop: short names of letters, digits, `.`, `_` and `-` are safe")
            return Rejected(path, error, [path])

    def _consider(self, path: Path, files: dict[Path, Signature], now: float) -> Drop | Rejected | None:
        first = self._first.setdefault(path, now)
        stable = self._stable(path, files[path], now)
        entries = self._load(path, files[path])
        if isinstance(entries, SaigeError):
            sibling = self._sibling(path, files, now)  # looked at every scan: its settle clock runs with the manifest's
            return Rejected(path, entries, [path, *sibling]) if stable else None
        waiting = [e for e in entries if not self._complete(e, files, now)]
        if not waiting:
            onnx = sorted({e.onnx for e in entries if e.onnx in files})
            return Drop(path, entries, [path] + onnx + external_data(onnx, files))
        # an ONNX that is there and has no digest to match is only settling (SPEC §3: orphan_timeout_s is for an ONNX
        # that never appears or never matches): it is waited for, whatever orphan_timeout_s is against settle_s
        missing = [e for e in waiting if e.onnx not in files or self._digest_checked(e, files)]
        if not missing:
            return None
        lost = self._lost(path, files, missing)
        if lost is None and now - first < self.orphan_timeout_s:
            self._due(first + self.orphan_timeout_s)
            return None
        entry = lost[0] if lost else missing[0]
        # a single model's failed job is named as the manifest names it, and carries its request id (`submit`)
        own = {"drop_name": entry.stem, "request_id": entry.request_id} if len(entries) == 1 else {}
        if lost:
            error = SaigeError("INPUT_NOT_FOUND", f"{entry.onnx.name} named by {path.name} went with {lost[1].name}, "
                               "another manifest that names it (claimed with it): an ONNX goes with one manifest",
                               hint=TAKEN_HINT, **own)
        elif entry.onnx in files:
            error = SaigeError("INPUT_INCOMPLETE", f"{entry.onnx.name} does not match the manifest's sha256 after "
                               f"{self.orphan_timeout_s:.0f}s", **own)
        else:
            error = SaigeError("INPUT_NOT_FOUND", f"{entry.onnx.name} named by {path.name} did not appear within "
                               f"{self.orphan_timeout_s:.0f}s (orphan_timeout_s)", **own)
        return Rejected(path, error, [path] + [e.onnx for e in entries if e.onnx in files])

    def _lost(self, path: Path, files: dict[Path, Signature], missing: list[Entry]) -> tuple[Entry, Path] | None:
        """The first missing entry whose ONNX another manifest's claim took while this manifest (unchanged since) was
        in the inbox, with that manifest: it can never appear for this one (a new file of that name would be new)."""
        marked = self._taken.get(path)
        if marked is None or marked[0] != files[path]:
            return None
        return next(((e, marked[1][e.onnx]) for e in missing if e.onnx not in files and e.onnx in marked[1]), None)

    def _one_claim_per_file(self, found: list[Drop | Rejected], files: dict[Path, Signature],
                            now: float) -> list[Drop | Rejected]:
        """Of drops ready in one scan that share a file (yy.yml and yy.yaml, both naming yy.onnx), the first is
        claimed; the others wait for the next scan, at once, which finds the file taken. Once only for a pair as its
        files are: held back again, the first's claim failed (a folder the daemon cannot rename in), and the next
        scan comes at its interval (or a change in the inbox), not at once again: that would walk the inbox every
        few milliseconds, saying the failed claim each time, for as long as it fails."""
        holders: dict[Path, Drop] = {}
        held: set[tuple[Path, Path, tuple[tuple[Path, Signature | None], ...]]] = set()
        kept: list[Drop | Rejected] = []
        for result in found:
            if isinstance(result, Drop):
                holder = next((holders[f] for f in result.files if f in holders), None)
                if holder is not None:
                    both = sorted({*holder.files, *result.files})
                    pair = (holder.manifest, result.manifest, tuple((p, files.get(p)) for p in both))
                    if pair not in self._held:
                        self._due(now)
                    held.add(pair)
                    continue
                holders.update(dict.fromkeys(result.files, result))
            kept.append(result)
        self._held = held
        return kept

    def _sibling(self, manifest: Path, files: dict[Path, Signature], now: float) -> list[Path]:
        """The settled `<stem>.onnx` beside a manifest that does not parse: the rest of its drop (SPEC §3), which goes
        to failed/ with it instead of staying in the inbox for good. One still being written is left: it may be a new
        drop's."""
        onnx = manifest.with_suffix(".onnx")
        if onnx not in files or not self._stable(onnx, files[onnx], now):
            return []
        return [onnx, *external_data([onnx], files)]  # its weights too: they are no use in the inbox without it

    def _leave_named(self, found: list[Drop | Rejected], files: dict[Path, Signature],
                     unparsed: bool) -> list[Drop | Rejected]:
        """A rejected manifest never takes to failed/ an ONNX (or its external data) that another manifest in the inbox
        names: it is that drop's (a broken a.yml beside a b.yml whose `onnx:` is a.onnx). While manifests are left
        unparsed this scan (parse_budget), a rejection that would take an ONNX waits for the next scan, which comes at
        once: one of them may name it."""
        if not any(isinstance(r, Rejected) and len(r.files) > 1 for r in found):
            return found  # most scans: no manifest's ONNX to look up, every parsed manifest left unread
        named: dict[Path, set[Path]] = {}
        for m, (_, parsed) in self._parsed.items():
            for entry in parsed if m in files and isinstance(parsed, list) else []:
                named.setdefault(entry.onnx, set()).add(m)
        kept: list[Drop | Rejected] = []
        for result in found:
            if isinstance(result, Rejected) and len(result.files) > 1:
                if unparsed:
                    continue
                others = sorted(onnx for onnx, by in named.items() if by - {result.manifest} and onnx in files)
                spare = {*others, *external_data(others, files)}
                result.files = [f for f in result.files if f == result.manifest or f not in spare]
            kept.append(result)
        return kept

    def _digest_checked(self, entry: Entry, files: dict[Path, Signature]) -> bool:
        """Is the entry's ONNX (in the inbox) complete when its digest matches `sha256:`, not when it has settled?"""
        return bool(entry.sha256) and files[entry.onnx][0] <= self.max_digest_bytes

    def _complete(self, entry: Entry, files: dict[Path, Signature], now: float) -> bool:
        """Settled manifest + ONNX, or an ONNX whose digest matches `sha256:` (no wait)."""
        onnx = entry.onnx
        if not onnx.is_relative_to(self.inbox):
            return onnx.is_file()  # in an allowed root: not ours to watch
        if onnx not in files:
            return False
        if entry.sha256 and self._digest_checked(entry, files):  # larger than max_digest_bytes: refused by validate
            return self._digest(onnx, files[onnx]).lower() == entry.sha256.lower()  # (never read here)
        settled = [self._stable(p, files[p], now) for p in (entry.manifest, onnx)]  # both clocks start now
        return all(settled)

    def forget(self, paths: list[Path]) -> None:
        """After a claim (or a rejection) moved `paths`: a later file of these names is new. Each other manifest parsed
        meanwhile that names one of them has lost it to the manifest among them (_lost)."""
        taker = next((p for p in paths if p.suffix in MANIFEST_SUFFIXES), None)
        if taker is not None:
            self._mark_taken(taker, set(paths))
        for p in paths:
            self._seen.pop(p, None)
            self._first.pop(p, None)
            self._parsed.pop(p, None)

    def _mark_taken(self, taker: Path, gone: set[Path]) -> None:
        for other, (sig, parsed) in self._parsed.items():
            lost = {e.onnx: taker for e in parsed if e.onnx in gone} if isinstance(parsed, list) else {}
            if lost and other not in gone:
                before = self._taken.get(other)
                self._taken[other] = (sig, {**(before[1] if before and before[0] == sig else {}), **lost})


def claim(files: list[Path], base: Path, dest: Path, root: Path | None = None) -> dict[Path, Path]:
    """Rename each file into `dest`, keeping its path relative to `base` (the manifest's folder).

    A file elsewhere in the inbox `root` (`onnx: ../shared/x.onnx`) keeps its path relative to the inbox under
    `dest/.inbox/`, so two such inputs of the same name never land on each other.

    All or nothing: if one rename fails (a file deleted or replaced under us), those already moved go back
    where they were and `dest` is removed again, so the next scan sees the drop as the user left it.
    """
    moved: dict[Path, Path] = {}
    dest.mkdir(parents=True, exist_ok=True)
    try:
        for path in files:
            rel = _claimed_name(path, base, root)
            target = dest / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            os.rename(path, target)
            moved[path] = target
    except OSError:
        for path, target in moved.items():
            os.rename(target, path)
        shutil.rmtree(dest, ignore_errors=True)
        raise
    return moved


def _claimed_name(path: Path, base: Path, root: Path | None) -> Path:
    if path.is_relative_to(base):
        return path.relative_to(base)
    if root is not None and path.is_relative_to(root):
        return Path(".inbox") / path.relative_to(root)
    return Path(path.name)
