"""A Docker engine that can go away: a unix-socket relay in front of the real /var/run/docker.sock.

Pointing a daemon's DOCKER_HOST at the relay lets a test take the engine away (connections refused, open
streams cut) and bring it back, as a dockerd restart does from the client's side, without stopping the
engine the rest of the suite uses.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from pathlib import Path

ENGINE = "/var/run/docker.sock"


class EngineProxy:
    def __init__(self, path: Path) -> None:
        self.path = path
        self._listener: socket.socket | None = None
        self._open: list[socket.socket] = []
        self._lock = threading.Lock()
        self._flowing = threading.Event()  # cleared by hang(): connections stay open but nothing is relayed
        self._flowing.set()
        self.held = threading.Event()  # set once a client's request waits on the hung engine

    @property
    def docker_host(self) -> str:
        return f"unix://{self.path}"

    def up(self) -> None:
        """Accept connections and relay them to the engine."""
        self.path.unlink(missing_ok=True)
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(str(self.path))
        listener.listen(64)
        self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def down(self) -> None:
        """Refuse new connections and cut every open one (streams included), like a stopped engine."""
        with self._lock:  # a connection accepted from now on is cut by _accept itself
            listener, self._listener = self._listener, None
            conns, self._open = self._open, []
        if listener is not None:
            with contextlib.suppress(OSError):
                listener.shutdown(socket.SHUT_RDWR)  # wakes the accept() under way (a close alone does not)
            listener.close()
        self.path.unlink(missing_ok=True)
        for conn in conns:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
            conn.close()

    def hang(self) -> None:
        """Keep every connection open but relay nothing, like an engine too busy to answer (a ReadTimeout)."""
        self.held.clear()
        self._flowing.clear()

    def resume(self) -> None:
        self._flowing.set()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return  # closed by down()
            engine = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            engine.connect(ENGINE)
            with self._lock:
                if self._listener is not listener:  # down() ran while this one was being connected: it would
                    client.close()  # otherwise be relayed for as long as it lasts (a wait() under way: minutes)
                    engine.close()
                    return
                self._open += [client, engine]
            threading.Thread(target=self._pipe, args=(client, engine, True), daemon=True).start()
            threading.Thread(target=self._pipe, args=(engine, client), daemon=True).start()

    def _pipe(self, src: socket.socket, dst: socket.socket, from_client: bool = False) -> None:
        try:
            while data := src.recv(65536):
                if from_client and not self._flowing.is_set():
                    self.held.set()
                self._flowing.wait()
                dst.sendall(data)
            dst.shutdown(socket.SHUT_WR)
        except OSError:
            pass
