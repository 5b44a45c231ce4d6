"""A webhook endpoint on 127.0.0.1 for the notification tests: records each POST, can hold its replies back."""

from __future__ import annotations

import json
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


def free_port() -> int:
    """A port nothing listens on right now (the tests start their servers on it later)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class Receiver:
    """`with Receiver(port) as r:` serves until the block ends; `hold_s` delays every reply (released by `release`)."""

    def __init__(self, port: int = 0, hold_s: float = 0.0) -> None:
        self.posts: list[dict[str, Any]] = []  # {"path", "headers", "body" (parsed JSON)}
        self.answered: list[str] = []  # job ids (or texts) whose reply has been sent
        self.arrived = threading.Condition()
        self.gate = threading.Event()
        if not hold_s:
            self.gate.set()
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
                data = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                body = json.loads(data)
                with owner.arrived:
                    owner.posts.append({"path": self.path, "headers": dict(self.headers), "body": body})
                    owner.arrived.notify_all()
                owner.gate.wait(hold_s)  # a slow endpoint: the sender must not make anyone else wait for this
                self.send_response(200)
                self.end_headers()
                owner.answered.append(str(body.get("job_id", body.get("text"))))

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}/hook"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> Receiver:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()
        self.server.shutdown()
        self.server.server_close()

    def release(self) -> None:
        self.gate.set()

    def wait_posts(self, count: int, timeout: float) -> list[dict[str, Any]]:
        with self.arrived:
            if not self.arrived.wait_for(lambda: len(self.posts) >= count, timeout):
                raise AssertionError(f"{len(self.posts)} POSTs in {timeout}s, expected {count}")
            return list(self.posts)
