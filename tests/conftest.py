"""Shared fixtures: temp configs pointing every directory into tmp_path."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

sys.path.insert(0, str(Path(__file__).parent))

from saigeedged import config as configmod  # noqa: E402


def write_config(tmp_path: Path, **overrides: Any) -> Path:
    data: dict[str, Any] = {"inbox": str(tmp_path / "inbox"), "outbox": str(tmp_path / "outbox"),
                            "state_dir": str(tmp_path / "state")}
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(data.get(key), dict):
            data[key].update(value)
        else:
            data[key] = value
    path = tmp_path / "saigeedged.yml"
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.fixture
def config_path(tmp_path: Path) -> Path:
    return write_config(tmp_path)


@pytest.fixture
def config(config_path: Path) -> configmod.Config:
    return configmod.load(config_path)


# the shared tags; a run that changed tests/images names its own tags here (built from the checkout when missing)
STANDIN_ACUITY = os.environ.get("SAIGEEDGED_STANDIN_ACUITY", "saigeedged-standin/acuity:test")
STANDIN_MOBILINT = os.environ.get("SAIGEEDGED_STANDIN_MOBILINT", "saigeedged-standin/qbcompiler:test")
IMAGES = Path(__file__).parent / "images"


def build_standins(client: Any) -> None:
    """Build the stand-in compiler images from tests/images (also done by .ci/run)."""
    import subprocess

    from docker.errors import ImageNotFound

    for tag, overlays in ((STANDIN_ACUITY, ["common", "acuity"]), (STANDIN_MOBILINT, ["common", "mobilint"])):
        if not (IMAGES / overlays[-1]).is_dir():
            continue
        try:
            client.images.get(tag)
        except ImageNotFound:
            subprocess.run([str(IMAGES / "build.sh"), tag, *[str(IMAGES / o) for o in overlays]], check=True)


@pytest.fixture(scope="session")
def docker_client() -> Any:
    import docker

    client = docker.from_env()
    client.ping()
    build_standins(client)
    return client


@pytest.fixture(scope="session")
def fresh_acuity(docker_client: Any) -> Any:
    """A stand-in ACUITY image built for this session under its own tag (tests/images as checked out: the call
    record, every cfg folder), so a rebuild of the shared tag by another run cannot change it mid-test."""
    import uuid

    tag = f"saigeedged-standin/acuity:session-{uuid.uuid4().hex[:8]}"
    yield build_variant(tag, "common", "acuity")
    docker_client.images.remove(tag, force=True)


def build_variant(tag: str, *overlays: str) -> str:
    """Build a stand-in image from tests/images overlays (later ones win, see build.sh) under `tag`."""
    import subprocess

    subprocess.run([str(IMAGES / "build.sh"), tag, *[str(IMAGES / o) for o in overlays]], check=True,
                   stdout=subprocess.DEVNULL)
    return tag


@pytest.fixture
def docker_config(tmp_path: Path, docker_client: Any) -> Any:
    """A config whose containers are unique to this test and removed afterwards."""
    import uuid

    tag = uuid.uuid4().hex[:8]
    names = {"cubie": f"saige-test-cubie-{tag}", "mobilint": f"saige-test-mobilint-{tag}"}
    path = write_config(tmp_path, cubie={"image": STANDIN_ACUITY, "container": names["cubie"]},
                        mobilint={"image": STANDIN_MOBILINT, "container": names["mobilint"]},
                        limits={"step_timeout_s": 600})  # tests of a TIMEOUT set their own
    yield path
    for name in names.values():
        try:
            docker_client.containers.get(name).remove(force=True)
        except Exception:  # already gone
            pass


@pytest.fixture
def daemon(tmp_path: Path) -> Any:
    """Start `saigeedged run` on temp dirs: daemon(**config overrides) -> harness.Daemon (stopped at teardown)."""
    from harness import Daemon

    started: list[Daemon] = []

    def start(env: dict[str, str] | None = None, **overrides: Any) -> Daemon:
        base: dict[str, Any] = {"watch": {"settle_s": 0.3, "rescan_interval_s": 60}, "log": {"format": "json"},
                                "allowed_roots": [str(tmp_path / "data")], "defaults": {"target": "host"}}
        for key, value in overrides.items():
            if isinstance(value, dict) and isinstance(base.get(key), dict):
                base[key] = {**base[key], **value}
            else:
                base[key] = value
        config = write_config(tmp_path, **base)
        d = Daemon(config, env)
        started.append(d)
        return d.start()

    yield start
    for d in started:
        d.close()


@pytest.fixture
def det_inputs(tmp_path: Path) -> dict[str, Any]:
    """A tiny YOLOX ONNX and a val.json under tmp_path/data (an allowed root)."""
    from factory import random_labels, valjson, yolox

    onnx = yolox(tmp_path / "det.onnx", size=(64, 64))
    calib = valjson(tmp_path / "data", random_labels(8, 3))
    return {"onnx": onnx, "manifest": {"task": "detection", "num_classes": 3, "calib": str(calib), "n_samples": 4}}
