"""`saigeedged run`: the daemon's entry point (journal set up, signals turned into flags, the service started)."""

from __future__ import annotations

import signal
import threading

from saigeedged.config import Config
from saigeedged.errors import SaigeError


def run(config: Config) -> int:
    if not config.named_dirs:
        raise SaigeError("MANIFEST_INVALID", "`run` needs a config that names `inbox` and `outbox`",
                         hint="saigeedged run -c /etc/saigeedged/saigeedged.yml")
    from saigeedged.adapters import journal
    from saigeedged.adapters.notify import Notifier
    from saigeedged.service import daemon, room

    journal.configure(config.log.format, config.log.level)
    stop = threading.Event()

    def on_signal(signum: int, frame: object) -> None:
        stop.set()  # only a flag: the main loop does the stopping, outside signal context

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGHUP, lambda signum, frame: None)  # until the service can rescan: never death
    notifier = Notifier()
    service = room.start_degraded(lambda: daemon.Daemon(config, stop, notifier), stop, notifier)
    if service is None:  # stopped while state_dir was full: nothing was started
        return 0
    signal.signal(signal.SIGHUP, lambda signum, frame: service.hang_up())  # not death: a rescan
    return service.run()
