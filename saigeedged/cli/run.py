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
    from saigeedged.adapters import journal, signals
    from saigeedged.adapters.notify import Notifier
    from saigeedged.service import daemon, room

    journal.configure(config.log.format, config.log.level)
    stop = threading.Event()
    started: list[daemon.Daemon] = []  # the service once it runs: a SIGHUP before then does nothing

    def stopping() -> None:
        stop.set()
        for service in started:
            service.wake.set()  # the main loop stops now, not at its next poll

    def rescan() -> None:
        for service in started:
            service.hang_up()  # not death: a rescan

    signals.Relay({signal.SIGTERM: stopping, signal.SIGINT: stopping, signal.SIGHUP: rescan})
    notifier = Notifier()
    service = room.start_degraded(lambda: daemon.Daemon(config, stop, notifier), stop, notifier)
    if service is None:  # stopped while state_dir was full: nothing was started
        return 0
    started.append(service)
    return service.run()
