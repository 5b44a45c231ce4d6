"""The commands on the daemon's own state (`status`, `retry`, `cancel`, `prune`) act as the daemon's user.

Run as root they would make root's files where the daemon writes (a `.saigeedged` folder of the inbox, a job log, a
database's -wal), which the daemon then cannot write, and their checks of the daemon's folders (ownfolders) would take
the service's own folders for a dropper's and move them aside. Run as another user they cannot read the queue nor the
cache, which only the service's user may: one line says so, never a traceback.
"""

from __future__ import annotations

import contextlib
import grp
import os
import pwd
import subprocess
from collections.abc import Iterator
from pathlib import Path

from saigeedged.errors import SaigeError

UNIT = "saigeedged.service"  # the package's unit (debian/)
SYSTEMCTL_TIMEOUT_S = 5.0


def become(state_dir: Path) -> None:
    """As root, take the uid, gid and groups of `state_dir`'s owner (the service's user: the package's tmpfiles.d and
    INSTALL.md's `install -d -o saigeedged` make it so), the groups its unit adds included (unit_groups); a no-op for
    any other user, or a state dir root owns."""
    if os.geteuid() != 0:
        return
    try:
        uid = os.stat(state_dir).st_uid
    except OSError:
        return  # no state dir yet: the command says what is missing itself
    if uid == 0:
        return
    try:
        user = pwd.getpwuid(uid)
        gid, groups = user.pw_gid, os.getgrouplist(user.pw_name, user.pw_gid) + unit_groups(user.pw_name)
    except KeyError:  # a uid without a passwd entry (a share's): its own group only
        gid = os.stat(state_dir).st_gid
        groups = [gid]
    os.setgroups(sorted(set(groups)))
    os.setgid(gid)
    os.setuid(uid)


def unit_groups(user: str, unit: str = UNIT) -> list[int]:
    """The groups the service's unit gives `user` beyond /etc/group (`SupplementaryGroups=`, a drop-in's: a share's
    group, say), as systemd has the unit loaded; none when the unit runs as another user or systemd does not answer."""
    try:
        shown = subprocess.run(["systemctl", "show", unit, "--property=User", "--property=SupplementaryGroups"],
                               capture_output=True, text=True, timeout=SYSTEMCTL_TIMEOUT_S, check=False).stdout
    except (OSError, subprocess.TimeoutExpired):
        return []
    props = dict(line.split("=", 1) for line in shown.splitlines() if "=" in line)
    if props.get("User") != user:
        return []
    gids = []
    for name in props.get("SupplementaryGroups", "").split():
        with contextlib.suppress(KeyError):
            gids.append(grp.getgrnam(name).gr_gid)
    return gids


def refused(path: Path | str, why: str | None) -> SaigeError:
    """The error of a command that may not open `path` of the daemon's state (its job database, its cache)."""
    return SaigeError("INPUT_NOT_FOUND", f"cannot open {path}: {why}",
                      hint="the daemon's queue and cache are the service's user's only (they hold manifests' passwords "
                      "and the compiled models): run the command as root or as that user (`sudo -u saigeedged "
                      "saigeedged status`); the status files under <outbox>/status/ are readable by everyone")


@contextlib.contextmanager
def handing_over(folder: Path, skip: Path) -> Iterator[None]:
    """Run as root, what a command made under the daemon's folders (`saigeedged compile`: its job log, a cache entry,
    the cache folder itself when the daemon had not made it yet) is given to their owner when it ends: root's, the
    daemon could not write there (its cache kept nothing more, silently) nor evict or clean it. The command itself
    stays root's (it reads the operator's inputs and writes the bundle where the manifest says). Not under `skip`, the
    work root: the container's steps write there, as root when the image runs them so."""
    try:
        yield
    finally:
        with contextlib.suppress(OSError):
            st = os.stat(folder)
            if os.geteuid() == 0 and st.st_uid != 0:
                _give(folder, st.st_uid, st.st_gid, skip)


def _give(folder: Path, uid: int, gid: int, skip: Path) -> None:
    """Every file and folder under `folder` but `skip` (never through a link) that is root's becomes `uid`:`gid`'s."""
    for base, dirs, names in os.walk(folder):
        dirs[:] = [d for d in dirs if os.path.join(base, d) != str(skip)]
        for name in [*dirs, *names]:
            path = os.path.join(base, name)
            with contextlib.suppress(OSError):  # gone meanwhile: the daemon's own cleanup
                if os.lstat(path).st_uid == 0:
                    os.lchown(path, uid, gid)
