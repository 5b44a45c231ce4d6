"""Credentials for test engines: a CA with server and client certificates (openssl), an ssh key pair and an sshd."""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

# A system user allowed on the ssh engine's socket (dockerd --group); scripts/setup-host creates it.
SSH_USER = "saigeedged-ssh"
SSHD = "/usr/sbin/sshd"
DAYS = "2"


def run(*argv: str | Path) -> None:
    done = subprocess.run([str(a) for a in argv], capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(map(str, argv))} exited {done.returncode}: {done.stderr.strip()}")


@dataclass(frozen=True)
class TlsFiles:
    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path


def _signed(folder: Path, name: str, subject: str, ext: str) -> tuple[Path, Path]:
    """A P-256 key and a certificate signed by folder/ca.pem with the extensions `ext`."""
    key, csr, cert, extfile = (folder / f"{name}{s}" for s in ("-key.pem", ".csr", "-cert.pem", ".ext"))
    extfile.write_text(ext)
    run("openssl", "req", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
        "-keyout", key, "-out", csr, "-subj", subject)
    run("openssl", "x509", "-req", "-in", csr, "-CA", folder / "ca.pem", "-CAkey", folder / "ca-key.pem",
        "-CAcreateserial", "-out", cert, "-days", DAYS, "-extfile", extfile)
    return cert, key


def make_tls(folder: Path, addr: str) -> TlsFiles:
    """A throw-away CA, a server certificate for IP `addr` and a client certificate, all under `folder`."""
    folder.mkdir(parents=True, exist_ok=True)
    run("openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
        "-keyout", folder / "ca-key.pem", "-out", folder / "ca.pem", "-days", DAYS, "-subj", "/CN=saigeedged test CA",
        "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign")
    server = _signed(folder, "server", f"/CN={addr}",
                     f"subjectAltName=IP:{addr}\nextendedKeyUsage=serverAuth\nkeyUsage=digitalSignature\n")
    client = _signed(folder, "client", "/CN=saigeedged",
                     "extendedKeyUsage=clientAuth\nkeyUsage=digitalSignature\n")
    return TlsFiles(folder / "ca.pem", *server, *client)


@dataclass(frozen=True)
class SshFiles:
    """`home` is a HOME for the client side (.ssh/id_ed25519 and known_hosts, as paramiko reads them)."""

    home: Path
    config: Path
    log: Path

    @property
    def key(self) -> Path:
        return self.home / ".ssh" / "id_ed25519"


SSHD_CONFIG = """\
ListenAddress {addr}:22
HostKey {folder}/host_ed25519
PidFile {folder}/sshd.pid
AuthorizedKeysFile {folder}/authorized_keys
AllowUsers {user}
PermitRootLogin no
PasswordAuthentication no
KbdInteractiveAuthentication no
PubkeyAuthentication yes
UsePAM no
X11Forwarding no
AllowTcpForwarding no
AllowStreamLocalForwarding no
SetEnv DOCKER_HOST=unix://{socket}
"""


def make_ssh(folder: Path, addr: str, socket: Path) -> SshFiles:
    """Host and client keys, and an sshd config that listens on `addr` only and points DOCKER_HOST at `socket`.

    docker-py's ssh transport runs `docker system dial-stdio` on the remote side, so the session only
    needs the docker CLI and DOCKER_HOST; the user reaches the socket through dockerd's --group.
    """
    folder.mkdir(parents=True, exist_ok=True)
    home = folder / "client-home"
    (home / ".ssh").mkdir(parents=True, mode=0o700)
    files = SshFiles(home, folder / "sshd_config", folder / "sshd.log")
    run("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "saigeedged-test-host", "-f", folder / "host_ed25519")
    run("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "saigeedged-test-client", "-f", files.key)
    host_pub = (folder / "host_ed25519.pub").read_text().split()
    (home / ".ssh" / "known_hosts").write_text(f"{addr} {host_pub[0]} {host_pub[1]}\n")
    (folder / "authorized_keys").write_text(files.key.with_suffix(".pub").read_text())
    files.config.write_text(SSHD_CONFIG.format(addr=addr, folder=folder, user=SSH_USER, socket=socket))
    os.makedirs("/run/sshd", mode=0o755, exist_ok=True)  # sshd's privilege separation directory
    run(SSHD, "-t", "-f", files.config)
    return files
