"""A host as `apt install` leaves it (SPEC §16): the shipped config, no vendor image loaded. `check` passes for what
the host can do and says what to load; the journal warns about a missing image only for a target something asks
for, once across restarts."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import pytest
import yaml
from harness import drop, wait_for

from saigeedged import config as configmod
from saigeedged.adapters.store import Store
from saigeedged.cli import readiness
from saigeedged.jobs import Job

pytestmark = pytest.mark.docker
SHIPPED = Path(__file__).parent.parent / "config" / "saigeedged.yml"


def shipped(tmp_path: Path) -> Path:
    """The shipped config with its folders moved under tmp_path (nothing else changed: the vendor images' tags stay)."""
    data = yaml.safe_load(SHIPPED.read_text())
    data.update(inbox=str(tmp_path / "inbox"), outbox=str(tmp_path / "outbox"), state_dir=str(tmp_path / "state"))
    path = tmp_path / "saigeedged.yml"
    path.write_text(yaml.safe_dump(data))
    return path


def check(path: Path) -> tuple[int, list[str]]:
    out = io.StringIO()
    code = readiness.main(configmod.load(path), out)
    return code, out.getvalue().splitlines()


def test_the_shipped_config_checks_clean_and_says_what_to_load(tmp_path: Path, docker_client: Any) -> None:
    """Without the vendor images, `check` on the shipped config exits 0: a warning per image naming `docker load`,
    and no FAIL line."""
    config = configmod.load(shipped(tmp_path))
    for image in (config.cubie.image, config.mobilint.image):
        assert not docker_client.images.list(name=image), f"{image} is loaded on this machine: the test needs a bare host"
    code, lines = check(shipped(tmp_path))
    assert code == 0, lines
    assert not [line for line in lines if line.startswith("FAIL")], lines
    warned = [line for line in lines if line.split()[:2] == ["warn", "image"]]
    assert len(warned) == 2 and all("not loaded: docker load" in line for line in warned), warned
    assert "ubuntu-npu_v2.0.10.1.tar" in warned[0] and "host jobs compile" in warned[0]


def test_a_missing_image_fails_check_once_a_queued_job_needs_it(tmp_path: Path, docker_client: Any) -> None:
    """The same bare host with a cubie job waiting in the queue: the cubie image is a FAIL naming the job count (exit
    3); the mobilint image, which nothing asks for, stays a warning."""
    path = shipped(tmp_path)
    store = Store(tmp_path / "state" / "saigeedged.db")
    store.add(Job(job_id="det-1", name="det", target="cubie", task="detection", entry={"onnx": "/x.onnx"}, subdir="",
                  claim_dir="/c/det-1", manifest="det.yml", priority=0, created_at="t"))
    store.close()
    code, lines = check(path)
    failed = [line for line in lines if line.startswith("FAIL")]
    assert code == 3 and len(failed) == 1, lines
    assert "cubie ubuntu-npu:v2.0.10.1 not loaded: docker load" in failed[0] and "1 queued or running cubie job need it" \
        in failed[0], failed
    assert any(line.startswith("warn  image        mobilint") for line in lines), lines


def test_image_warnings_only_for_asked_targets_and_once_across_restarts(docker_config: Path, daemon: Any,
                                                                        det_inputs: dict[str, Any]) -> None:
    """Neither vendor image loaded: a host-only config logs no `engine.image_missing`; with cubie as the default
    target one warning names the cubie image (not mobilint's, which nothing asks for), and a restart repeats none."""
    names = yaml.safe_load(docker_config.read_text())
    missing = {"cubie": {"image": "saigeedged-standin/not-loaded:cubie", "container": names["cubie"]["container"]},
               "mobilint": {"image": "saigeedged-standin/not-loaded:mobilint",
                            "container": names["mobilint"]["container"]}}
    d = daemon(**missing)  # defaults.target host
    drop(d.inbox, "onhost", det_inputs["onnx"], det_inputs["manifest"])
    assert d.wait_job("onhost")["state"] == "succeeded"
    (ready,) = wait_for(lambda: d.events("engine.ready"), 30, "the engine's first look")
    assert ready["targets"] == "" and "no vendor image is loaded (host jobs need none" in ready["message"], ready
    assert d.events("engine.image_missing") == []
    assert d.stop() == 0
    first = daemon(defaults={"target": "cubie"}, **missing)
    wait_for(lambda: first.events("engine.ready"), 30, "the engine's first look")
    warned = [(e["targets"], e["images"]) for e in first.events("engine.image_missing")]
    assert warned == [("cubie", "saigeedged-standin/not-loaded:cubie")], warned
    assert first.stop() == 0
    again = daemon(defaults={"target": "cubie"}, **missing)  # the same state_dir: the warning was given
    wait_for(lambda: again.events("engine.ready"), 30, "the engine's first look")
    assert again.events("engine.image_missing") == []
