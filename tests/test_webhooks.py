"""Completion notifications (SPEC §13) against a real HTTP endpoint on 127.0.0.1, from a running daemon."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from harness import drop, wait_for
from receiver import Receiver, free_port
from test_daemon_docker import cubie_daemon, in_quantize  # noqa: F401 (a fixture)

from saigeedged import config as configmod
from saigeedged.adapters.webhooks import channels
from saigeedged.cli import main as cli
from saigeedged.errors import SaigeError


def test_endpoint_down_then_up_gets_each_end_once(daemon: Any, det_inputs: dict[str, Any]) -> None:
    """A POST to an endpoint that is down is retried with backoff and delivered exactly once when it comes up."""
    port = free_port()
    d = daemon(notify=[{"url": f"http://127.0.0.1:{port}/hook", "retry_for_s": 300}])
    drop(d.inbox, "first", det_inputs["onnx"], det_inputs["manifest"])
    first = d.wait_job("first")
    wait_for(lambda: d.events("notify.retrying"), 30, "a refused POST being retried")
    with Receiver(port) as r:
        wait_for(lambda: d.events("notify.sent"), 60, "notify.sent once the endpoint is up")
        drop(d.inbox, "second", det_inputs["onnx"], det_inputs["manifest"])
        second = d.wait_job("second")
        wait_for(lambda: len(d.events("notify.sent")) == 2, 60, "the second job's notification")
    assert [p["body"]["job_id"] for p in r.posts] == [first["job_id"], second["job_id"]]
    assert r.posts[0]["body"] == d.status(first["job_id"])  # the body is the final status document itself
    assert r.posts[0]["headers"]["Content-Type"] == "application/json"
    sent = d.events("notify.sent")[0]
    assert sent["job_id"] == first["job_id"] and sent["attempts"] >= 2 and sent["channel"] == f"http://127.0.0.1:{port}"
    assert not d.events("notify.failed")


def test_slow_endpoint_never_delays_claims_or_compiles(daemon: Any, det_inputs: dict[str, Any]) -> None:
    """While the endpoint sits on the first POST, the next drop is claimed, compiled and published."""
    with Receiver(hold_s=300) as r:  # released by the test: a fixed hold could end before a loaded machine's job
        d = daemon(notify=[{"url": r.url, "timeout_s": 300}])
        drop(d.inbox, "first", det_inputs["onnx"], det_inputs["manifest"])
        first = d.wait_job("first")
        r.wait_posts(1, 30)  # the endpoint now holds the first job's POST
        drop(d.inbox, "second", det_inputs["onnx"], det_inputs["manifest"])
        second = d.wait_job("second")
        assert second["state"] == "succeeded"
        assert r.answered == [] and not d.events("notify.sent")  # the whole second job ran inside the first POST
        r.release()
        wait_for(lambda: len(d.events("notify.sent")) == 2, 30, "both notifications")
    assert [e["job_id"] for e in d.events("notify.sent")] == [first["job_id"], second["job_id"]]
    names = [e["event"] for e in d.events() if e.get("job_id") == second["job_id"]]
    assert names.index("job.succeeded") < names.index("notify.sent")


def test_slack_text_filters_and_no_secret_in_a_body(daemon: Any, det_inputs: dict[str, Any]) -> None:
    """Slack gets text with job, state, bundle, error code and hint; `events` filters; no password or URL secret leaks."""
    secret = "hunter2-do-not-leak"
    with Receiver() as r:
        d = daemon(notify=[{"url": f"{r.url}?token=s3cret-token", "format": "slack"},
                           {"url": r.url, "events": ["failed"]}])
        drop(d.inbox, "good", det_inputs["onnx"], {**det_inputs["manifest"], "password": secret})
        good = d.wait_job("good")
        drop(d.inbox, "bad", det_inputs["onnx"], {**det_inputs["manifest"], "num_classes": 7, "password": secret})
        bad = d.wait_job("bad")
        r.wait_posts(3, 60)
    assert good["state"] == "succeeded" and bad["error"]["code"] == "CALIB_INVALID"
    slack = {p["body"]["text"].split("*")[1]: p["body"]["text"] for p in r.posts if "token" in p["path"]}
    assert "good* succeeded" in slack["good"] and f"bundle: {good['bundle']['path']}" in slack["good"]
    assert "bad* failed" in slack["bad"] and "CALIB_INVALID" in slack["bad"] and bad["error"]["hint"] in slack["bad"]
    plain = [p["body"] for p in r.posts if "token" not in p["path"]]
    assert plain == [d.status(bad["job_id"])]  # only `failed` was asked for on that channel
    assert all(secret not in json.dumps(p["body"]) for p in r.posts)
    assert "s3cret-token" not in d.stderr() and "/hook" not in d.stderr()


@pytest.mark.parametrize(("entry", "named"), [
    ({"url": "ftp://x/y"}, "notify[0].url"),
    ({"url": "http://127.0.0.1:1/", "events": ["done"]}, "notify[0].events"),
    ({"url": "http://127.0.0.1:1/", "format": "teams"}, "notify[0].format"),
    ({"url": "http://127.0.0.1:1/", "retries": 3}, "notify[0].retries"),
])
def test_bad_channel_is_refused_naming_the_key(entry: dict[str, Any], named: str) -> None:
    """A bad `notify:` entry stops start-up with MANIFEST_INVALID naming the key."""
    with pytest.raises(SaigeError) as caught:
        channels([entry])
    assert caught.value.code == "MANIFEST_INVALID" and named in caught.value.message


def test_ops_keys_are_in_the_documented_config() -> None:
    """config/saigeedged.yml documents every ops key, with the defaults config.py has."""
    example = Path(__file__).parent.parent / "config" / "saigeedged.yml"
    loaded = configmod.load(example)
    for key in ("metrics", "notify", "retention", "dashboard"):
        assert loaded.raw[key] == configmod.DEFAULTS[key]


@pytest.mark.docker
def test_one_post_per_end_also_for_a_cancel_from_a_shell(cubie_daemon: Any, docker_client: Any,  # noqa: F811
                                                          tmp_path: Path, det_inputs: dict[str, Any]) -> None:
    """A queued job cancelled by `saigeedged cancel` (not by the daemon) is notified too, once, like the running one."""
    with Receiver() as r:
        d = cubie_daemon(notify=[{"url": r.url}])
        running = in_quantize(d, docker_client, tmp_path, "hang", det_inputs["manifest"])
        drop(d.inbox, "waiting", det_inputs["onnx"], det_inputs["manifest"])  # a cubie job: queued behind the hang
        queued = d.wait_job("waiting", ("queued",))
        assert cli.main(["cancel", queued["job_id"], "-c", str(d.config)]) == 0
        assert r.wait_posts(1, 30)[0]["body"] == d.status(queued["job_id"])
        assert cli.main(["cancel", running["job_id"], "-c", str(d.config)]) == 0
        r.wait_posts(2, 30)
        drop(d.inbox, "after", det_inputs["onnx"], {**det_inputs["manifest"], "target": "host"})
        after = d.wait_job("after")
        r.wait_posts(3, 30)
    assert [p["body"]["job_id"] for p in r.posts] == [queued["job_id"], running["job_id"], after["job_id"]]
    assert [p["body"]["state"] for p in r.posts] == ["cancelled", "cancelled", "succeeded"]


def test_slack_text_keeps_a_droppers_mentions_and_links_inert() -> None:
    """Slack control sequences in a dropper's values (a manifest key echoed in the error message) reach Slack
    escaped: no `@channel` ping, no disguised link."""
    from saigeedged.adapters.webhooks import slack_text

    doc = {"state": "failed", "name": "det", "target": "host", "job_id": "det-20261130T031500Z-a1b2c3", "bundle": None,
           "error": {"code": "MANIFEST_INVALID", "message": "det.yml: unknown key `<!channel> <https://evil.test|docs>`",
                     "hint": "see <!here> & fix"}}
    text = slack_text(doc)
    assert "<!" not in text and "<https" not in text
    assert "&lt;!channel&gt; &lt;https://evil.test|docs&gt;" in text and "see &lt;!here&gt; &amp; fix" in text


def test_a_bad_notify_url_is_refused_without_echoing_its_secret() -> None:
    """A notify URL with a typo in its scheme is refused at start-up naming the field, without its token or
    credentials in the message (it goes to the journal)."""
    with pytest.raises(SaigeError) as err:
        channels([{"url": "htps://bot:p4ssw0rd@hooks.example/services/T0/B0/s3cret-token"}])
    assert "notify[0].url" in err.value.message and "hooks.example" in err.value.message
    assert "s3cret" not in str(err.value) and "p4ssw0rd" not in str(err.value)


@pytest.mark.parametrize("url", ["http://[::1/hook", "http://hooks.example:99999/hook", "http://:8080/hook"])
def test_a_notify_url_that_cannot_be_parsed_is_a_config_error(url: str) -> None:
    """An unclosed IPv6 bracket or a port out of range is refused at start-up as a config error naming the field
    (not a traceback at start, nor a sender thread dying at its first log line)."""
    with pytest.raises(SaigeError) as err:
        channels([{"url": url}])
    assert err.value.code == "MANIFEST_INVALID" and "notify[0].url" in err.value.message


def test_notifications_queued_behind_a_slow_post_are_said_at_stop(daemon: Any, det_inputs: dict[str, Any]) -> None:
    """The endpoint holds the first POST when the daemon is stopped: the notification queued behind it is logged
    `notify.failed` (the daemon stopped), not lost without a word, and the stop still exits 0."""
    with Receiver(hold_s=300) as r:  # held until the test is done (its end releases it)
        d = daemon(notify=[{"url": r.url, "timeout_s": 300}])
        drop(d.inbox, "first", det_inputs["onnx"], det_inputs["manifest"])
        d.wait_job("first")
        r.wait_posts(1, 30)
        drop(d.inbox, "second", det_inputs["onnx"], det_inputs["manifest"])
        second = d.wait_job("second")
        assert d.stop() == 0
        failed = d.events("notify.failed")
    assert [e["job_id"] for e in failed] == [second["job_id"]] and "stopped" in failed[0]["message"]
