"""A dockerd that hangs mid-stream: a small real HTTP server on a unix socket that answers what a client needs to
reach a running container, then sends the headers of an `exec start` and nothing after (a hung engine, issue 26).

Only the calls the daemon makes before the stall are answered (ping, version, container inspect, exec create and
inspect); `stalled` is set once a client waits on a stalled stream, `release()` closes those streams. `refuse_exec`
makes `exec create` answer an error instead, as dockerd does for a container that stopped meanwhile.
"""

from __future__ import annotations

import json
import socketserver
import threading
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

API_VERSION = "1.41"


def container_doc(name: str, work_root: Path) -> dict[str, Any]:
    """What `GET /containers/<name>/json` answers: a running container of ours with the work root mounted."""
    return {"Id": "c0ffee" * 10 + "abcd", "Name": f"/{name}", "Image": "sha256:" + "0" * 64,
            "State": {"Status": "running", "Running": True},
            "Config": {"Labels": {"io.saigeedge.managed": "1"}, "Image": "standin"},
            "Mounts": [{"Type": "bind", "Source": str(work_root), "Destination": str(work_root)}]}


class StallingDocker(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True

    def __init__(self, path: Path, container: dict[str, Any]) -> None:
        path.unlink(missing_ok=True)
        self.container = container
        self.stalled = threading.Event()
        self.released = threading.Event()
        self.exec_starts = 0
        self.refuse_exec: tuple[int, str] | None = None  # (status, message) an `exec create` is answered with instead
        super().__init__(str(path), _Handler)
        self.path = path
        threading.Thread(target=self.serve_forever, name="stalldocker", daemon=True).start()

    @property
    def url(self) -> str:
        return f"unix://{self.path}"

    def release(self) -> None:
        """End the stalled streams (their connections close) and stop serving."""
        self.released.set()
        self.shutdown()
        self.server_close()


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: StallingDocker

    def log_message(self, *args: Any) -> None:
        pass

    def _json(self, doc: Any, status: int = 200) -> None:
        body = json.dumps(doc).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _body(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        if length:
            self.rfile.read(length)

    def do_HEAD(self) -> None:  # noqa: N802 - http.server's naming
        self.do_GET()

    def do_GET(self) -> None:  # noqa: N802
        path = self.path.split("?")[0]
        if path.endswith("/_ping"):
            body = b"OK"
            self.send_response(200)
            self.send_header("Content-Type", "text/plain")
            self.send_header("Api-Version", API_VERSION)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        elif path.endswith("/version"):
            self._json({"ApiVersion": API_VERSION, "Version": "24.0.0", "MinAPIVersion": "1.12"})
        elif "/containers/" in path and path.endswith("/json"):
            self._json(self.server.container)
        elif "/exec/" in path and path.endswith("/json"):
            self._json({"Running": True, "ExitCode": None, "Pid": 1})
        else:
            self._json({"message": f"not in this fake: {path}"}, 404)

    def do_POST(self) -> None:  # noqa: N802
        self._body()
        path = self.path.split("?")[0]
        if "/containers/" in path and path.endswith("/exec") and self.server.refuse_exec is not None:
            status, message = self.server.refuse_exec
            self._json({"message": message}, status)
        elif "/containers/" in path and path.endswith("/exec"):
            self._json({"Id": "e" * 64}, 201)
        elif "/exec/" in path and path.endswith("/start"):
            self.server.exec_starts += 1
            self.send_response(101, "UPGRADED")
            self.send_header("Content-Type", "application/vnd.docker.raw-stream")
            self.send_header("Connection", "Upgrade")
            self.send_header("Upgrade", "tcp")
            self.end_headers()
            self.wfile.flush()
            self.server.stalled.set()
            self.server.released.wait()  # the headers, then nothing: a hung dockerd
            self.close_connection = True
        else:
            self._json({"message": f"not in this fake: {path}"}, 404)
