"""Prometheus metrics (SPEC §13): /metrics scraped over HTTP and the textfile, parsed with prometheus_client."""

from __future__ import annotations

import socket
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from harness import drop, wait_for
from prometheus_client.parser import text_string_to_metric_families
from receiver import free_port
from test_daemon_docker import cubie_daemon, in_quantize  # noqa: F401 (a fixture)

from saigeedged import __version__
from saigeedged.adapters.metrics import parse_listen, seconds
from saigeedged.cli import main as cli
from saigeedged.errors import SaigeError

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]
ENDS = {("host", "succeeded", ""): 1.0, ("host", "failed", "CALIB_INVALID"): 1.0, ("host", "cancelled", "CANCELLED"): None,
        ("cubie", "cancelled", "CANCELLED"): 2.0}


def samples(text: str) -> Samples:
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def scrape(port: int) -> Samples:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as reply:
        return samples(reply.read().decode())


def value(found: Samples, name: str, **labels: str) -> float | None:
    return found.get((name, frozenset(labels.items())))


def ends(found: Samples) -> dict[tuple[str, str, str], float | None]:
    return {k: value(found, "saigeedged_jobs_total", target=k[0], state=k[1], error_code=k[2]) for k in ENDS}


@pytest.mark.docker
def test_counts_after_mixed_jobs_and_a_restart(cubie_daemon: Any, docker_client: Any, tmp_path: Path,  # noqa: F811
                                               det_inputs: dict[str, Any]) -> None:
    """/metrics and the textfile count ends by target, state and code, time jobs and steps; a restart keeps the counts."""
    port, textfile = free_port(), tmp_path / "saigeedged.prom"
    d = cubie_daemon(metrics={"listen": f"127.0.0.1:{port}", "textfile": str(textfile)})
    host = {**det_inputs["manifest"], "target": "host"}
    drop(d.inbox, "good", det_inputs["onnx"], host)
    good = d.wait_job("good")
    drop(d.inbox, "bad", det_inputs["onnx"], {**host, "num_classes": 7})
    d.wait_job("bad")
    running = in_quantize(d, docker_client, tmp_path, "hang", det_inputs["manifest"])
    drop(d.inbox, "waiting", det_inputs["onnx"], det_inputs["manifest"])  # a cubie job: queued behind the hang
    queued = d.wait_job("waiting", ("queued",))
    assert value(scrape(port), "saigeedged_queue_depth", target="cubie") == 1
    assert cli.main(["cancel", queued["job_id"], "-c", str(d.config)]) == 0  # an end the daemon did not write itself
    assert cli.main(["cancel", running["job_id"], "-c", str(d.config)]) == 0
    d.wait_state(running["job_id"], ("cancelled",))
    live = scrape(port)
    assert ends(live) == ENDS
    assert value(live, "saigeedged_queue_depth", target="cubie") == 0
    assert value(live, "saigeedged_job_duration_seconds_count", target="host") == 2  # the queued one never ran
    assert value(live, "saigeedged_job_duration_seconds_count", target="cubie") == 1
    assert value(live, "saigeedged_step_duration_seconds_count", target="host", step="quantize") == 1
    assert value(live, "saigeedged_step_duration_seconds_count", target="cubie", step="import") == 1
    assert value(live, "saigeedged_last_success_timestamp_seconds", target="host") == seconds(good["finished_at"])
    assert value(live, "saigeedged_engine_up", engine="local") == 1
    assert value(live, "saigeedged_build_info", version=__version__) == 1
    assert value(live, "saigeedged_cache_hits_total") == 0
    wait_for(lambda: textfile.exists() and ends(samples(textfile.read_text())) == ENDS, 30, "the textfile")
    assert d.stop() == 0
    d.start()
    again = wait_for(lambda: _try_scrape(port), 30, "/metrics after the restart")
    assert ends(again) == ENDS  # rebuilt from the queue's rows
    assert value(again, "saigeedged_job_duration_seconds_count", target="host") == 2
    assert value(again, "saigeedged_last_success_timestamp_seconds", target="host") == seconds(good["finished_at"])


def _try_scrape(port: int) -> Samples | None:
    try:
        return scrape(port)
    except OSError:
        return None


def test_metrics_are_off_by_default_and_bind_loopback(daemon: Any) -> None:
    """Without `metrics.listen` nothing listens; a bare port binds 127.0.0.1 only; a bad address is refused."""
    d = daemon()
    assert not d.events("metrics.listening")
    assert parse_listen("9464") == ("127.0.0.1", 9464) and parse_listen("[::1]:9") == ("::1", 9)
    for bad in ("localhost", "127.0.0.1:http", "127.0.0.1:70000"):
        with pytest.raises(SaigeError, match="metrics.listen"):
            parse_listen(bad)


def test_port_in_use_is_said_and_the_daemon_goes_on(daemon: Any, det_inputs: dict[str, Any]) -> None:
    """A /metrics port already taken is a `metrics.unavailable` error event; drops are still compiled."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        d = daemon(metrics={"listen": f"127.0.0.1:{taken.getsockname()[1]}"})
        drop(d.inbox, "det", det_inputs["onnx"], det_inputs["manifest"])
        assert d.wait_job("det")["state"] == "succeeded"
    assert d.events("metrics.unavailable")[0]["level"] == "error"


def test_a_port_taken_at_start_up_is_served_once_it_is_free(tmp_path: Path) -> None:
    """/metrics whose port another process held at start-up is tried again every LISTEN_AGAIN_S (it was given up for
    good, until a restart): said once, served once the port is free. Time is passed in."""
    from conftest import write_config

    from saigeedged import config
    from saigeedged.adapters.store import Store
    from saigeedged.service.ops import LISTEN_AGAIN_S, Ops

    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    port = taken.getsockname()[1]
    ops = Ops(config.load(write_config(tmp_path, metrics={"listen": f"127.0.0.1:{port}"})),
              Store(tmp_path / "state" / "saigeedged.db"), clock=lambda: 0.0)
    try:
        ops.tick(100.0)  # the other process holds the port
        taken.close()
        ops.tick(100.0 + LISTEN_AGAIN_S / 2)
        with pytest.raises(OSError):
            scrape(port)  # not tried again yet: nothing listens
        ops.tick(100.0 + LISTEN_AGAIN_S)
        assert value(scrape(port), "saigeedged_build_info", version=__version__) == 1
    finally:
        taken.close()
        assert ops.metrics is not None
        ops.metrics.close()


def test_cache_hits_are_counted(daemon: Any, det_inputs: dict[str, Any]) -> None:
    """The same model dropped twice is one compile and one cache hit, and the counter says so after a restart too."""
    port = free_port()
    d = daemon(metrics={"listen": f"127.0.0.1:{port}"})
    for name in ("first", "again"):
        drop(d.inbox, name, det_inputs["onnx"], det_inputs["manifest"])
        d.wait_job(name)
    assert d.status(d.wait_job("again")["job_id"])["cache"]["hit"] is True
    assert value(scrape(port), "saigeedged_cache_hits_total") == 1
    assert d.stop() == 0
    d.start()
    assert value(wait_for(lambda: _try_scrape(port), 30, "/metrics after the restart"), "saigeedged_cache_hits_total") == 1
