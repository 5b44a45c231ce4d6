"""A booted systemd 252 (a bare Debian bookworm with docker.io) in a container of the host's engine, driven with
`docker exec`; and the Debian package that installs saigeedged in it."""

from __future__ import annotations

import fcntl
import functools
import json
import shutil
import subprocess
import tempfile
import time
import tomllib
import uuid
from pathlib import Path
from typing import Any

HERE = Path(__file__).parent
ROOT = HERE.parent.parent
DOCKER_SOCKET = Path("/var/run/docker.sock")
VERSION = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]


LOCK_WAIT_S = 1200  # the longest a test waits for another process's build of the box image (prebuild's, mostly)
PREBUILD_LOG = ROOT / "dist" / "prebuild.log"


def _take(lock: Any, what: str) -> None:
    """An exclusive flock on `lock`, waited for at most LOCK_WAIT_S; a timeout says who builds and where it logs."""
    deadline = time.monotonic() + LOCK_WAIT_S
    while True:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() > deadline:
                tail = PREBUILD_LOG.read_text(errors="replace")[-2000:] if PREBUILD_LOG.exists() else "(no log)"
                raise AssertionError(f"waited {LOCK_WAIT_S} s for another process's build of {what} "
                                     f"(tests/systemdbox/prebuild's log, {PREBUILD_LOG}):\n{tail}") from None
            time.sleep(1)


def image() -> str:
    """The box image's tag: built by ./build on first use, then reused while its inputs are unchanged (test processes
    that ask together wait for the first one's build instead of bootstrapping it twice)."""
    with open("/tmp/saigeedged-systemdbox.lock", "w") as lock:
        _take(lock, "the box image")
        run = subprocess.run([str(HERE / "build")], capture_output=True, text=True, timeout=1200)
    assert run.returncode == 0, run.stderr[-4000:]
    return run.stdout.strip().splitlines()[-1]


CAPS = ("CHOWN DAC_OVERRIDE DAC_READ_SEARCH FOWNER FSETID KILL SETGID SETUID SETPCAP LINUX_IMMUTABLE NET_BIND_SERVICE "
        "NET_BROADCAST NET_ADMIN NET_RAW IPC_LOCK IPC_OWNER SYS_MODULE SYS_RAWIO SYS_CHROOT SYS_PTRACE SYS_PACCT "
        "SYS_ADMIN SYS_BOOT SYS_NICE SYS_RESOURCE SYS_TIME SYS_TTY_CONFIG MKNOD LEASE AUDIT_WRITE AUDIT_CONTROL SETFCAP "
        "MAC_OVERRIDE MAC_ADMIN SYSLOG WAKE_ALARM BLOCK_SUSPEND AUDIT_READ PERFMON BPF CHECKPOINT_RESTORE").split()


def missing_caps() -> list[str]:
    """Capabilities (by number) that this machine's bounding set lacks: --privileged fails on them (SYS_RESOURCE here)."""
    line = next(x for x in Path("/proc/self/status").read_text().splitlines() if x.startswith("CapBnd:"))
    bounding = int(line.split()[1], 16)
    return [name for bit, name in enumerate(CAPS) if not bounding >> bit & 1]


UPGRADE = "+test2"  # test_package's newer build is <version>+test2 (tests/systemdbox/prebuild builds it ahead too)


@functools.cache
def package(version: str | None = None) -> Path:
    """scripts/package's .deb of this worktree (with a version override, if given): built once for this commit and
    these files, whichever test process asks first (the others wait for it and reuse it)."""
    argv = [str(ROOT / "scripts" / "package"), "--if-changed", *(["--version", version] if version else [])]
    run = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=2400)
    assert run.returncode == 0, run.stderr[-4000:]
    return ROOT / run.stdout.strip().splitlines()[-1]


PREVIOUS = "2f35d79"  # the last release of schema 2 (its attempts kept their facts in their work dirs, issue 26)


def previous_package() -> Path:
    """The .deb of the release PREVIOUS, version <its version>~schema2 (older than any build of this checkout): built
    once into this worktree's dist/ from a detached worktree of that commit, with that commit's own scripts/package."""
    deb = ROOT / "dist" / f"saigeedged_{VERSION}~schema2_amd64.deb"
    (ROOT / "dist").mkdir(exist_ok=True)
    with open(ROOT / "dist" / ".previous.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # test processes that ask together: one builds, the others reuse it
        if deb.exists():
            return deb
        found = subprocess.run(["git", "-C", str(ROOT), "cat-file", "-e", f"{PREVIOUS}^{{commit}}"], capture_output=True)
        assert found.returncode == 0, f"commit {PREVIOUS} is not in this clone's history (git fetch --unshallow)"
        tree = Path(tempfile.mkdtemp(prefix="saigeedged-previous-"))
        try:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(tree / "src"), PREVIOUS],
                           check=True, capture_output=True, timeout=120)
            run = subprocess.run([str(tree / "src" / "scripts" / "package"), "--version", f"{VERSION}~schema2"],
                                 cwd=tree / "src", capture_output=True, text=True, timeout=2400)
            assert run.returncode == 0, run.stderr[-4000:]
            part = deb.with_name(deb.name + ".part")  # a run killed mid-copy leaves no .deb a later run would reuse
            shutil.copyfile(tree / "src" / run.stdout.strip().splitlines()[-1], part)
            part.replace(deb)
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree / "src")],
                           capture_output=True, timeout=120)
            shutil.rmtree(tree, ignore_errors=True)
    return deb


class Box:
    """One booted box. Paths under `shared` are bind-mounted at the same path, like the host's docker socket."""

    def __init__(self, tag: str, shared: Path, mounts: dict[Path, str] | None = None) -> None:
        """`mounts`: more host paths, bind-mounted at the box path given for each."""
        self.name = f"saigeedged-systemdbox-{uuid.uuid4().hex[:8]}"
        self.shared = shared
        drop = [f"--cap-drop={c}" for c in missing_caps()]
        binds = [arg for src, dest in (mounts or {}).items() for arg in ("-v", f"{src}:{dest}")]
        subprocess.run(["docker", "run", "-d", "--name", self.name, "--hostname", "saigeedged-box", "--network", "none",
                        "--cap-add=ALL", *drop, "--security-opt", "seccomp=unconfined", "--security-opt",
                        "apparmor=unconfined", "--security-opt", "systempaths=unconfined", "--cgroupns=host",
                        "-v", "/sys/fs/cgroup:/sys/fs/cgroup:rw", "--tmpfs", "/run", "--tmpfs", "/run/lock",
                        "-v", f"{DOCKER_SOCKET}:/run/docker.sock", "-v", f"{shared}:{shared}", *binds, tag],
                       check=True, capture_output=True, timeout=120)

    def sh(self, script: str, check: bool = True, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        """Run a bash script as root in the box."""
        run = subprocess.run(["docker", "exec", "-i", self.name, "bash", "-c", script], capture_output=True, text=True,
                             timeout=timeout)
        assert not check or run.returncode == 0, \
            f"{script}\n--- exit {run.returncode}\n{run.stdout[-3000:]}\n{run.stderr[-3000:]}"
        return run

    def boot(self) -> str:
        """Wait for systemd to finish booting; its state (running, or degraded when an unneeded unit failed)."""
        # until PID 1 listens on its bus, systemctl answers nothing: ask again until it does
        script = "for _ in $(seq 600); do s=$(systemctl is-system-running --wait 2>/dev/null) && break; " \
                 "case $s in degraded|maintenance|stopping) break;; esac; sleep 0.1; done; echo $s"
        return self.sh(script, timeout=120).stdout.strip()

    def host_setup(self) -> None:
        """The box's docker group is the one owning the (host's) engine socket, as docker.io makes it on a real host;
        and a resolvable host name, which `--network none` leaves out of /etc/hosts."""
        gid = DOCKER_SOCKET.stat().st_gid
        self.sh(f"groupmod -o -g {gid} docker")
        self.sh("grep -q saigeedged-box /etc/hosts || echo '127.0.1.1 saigeedged-box' >> /etc/hosts")

    def apt_install(self, deb: Path) -> float:
        """`apt install ./<deb>` as an operator or an unattended upgrade runs it (offline: the dependencies wait in apt's
        cache); its seconds."""
        copy = self.shared / deb.name
        shutil.copyfile(deb, copy)
        start = time.monotonic()
        # --force-confold: as an unattended upgrade runs it, an operator's edited config is kept without a prompt
        self.sh(f"cd {self.shared} && DEBIAN_FRONTEND=noninteractive apt-get install -y -q "
                f"-o Dpkg::Options::=--force-confold ./{deb.name}", timeout=600)
        return time.monotonic() - start

    def show(self, *props: str) -> dict[str, str]:
        out = self.sh(f"systemctl show saigeedged -p {','.join(props)}").stdout
        return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)

    def journal(self, *matches: str) -> list[dict[str, Any]]:
        """The unit's journal entries (JSON), optionally narrowed by FIELD=value matches."""
        out = self.sh(f"journalctl -u saigeedged --no-pager -o json {' '.join(matches)}").stdout
        return [json.loads(line) for line in out.splitlines() if line.strip()]

    def messages(self) -> list[str]:
        """Every journal line about the unit: the daemon's and systemd's own (start, stop, SIGKILL...)."""
        out = self.sh("journalctl --no-pager -o cat _SYSTEMD_UNIT=saigeedged.service + UNIT=saigeedged.service").stdout
        return out.splitlines()

    def remove(self) -> None:
        subprocess.run(["docker", "rm", "-f", self.name], capture_output=True, timeout=120)
