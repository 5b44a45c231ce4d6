"""Container settings that need no engine: runtime choice, exec user, SAIGE_CUBIE_* overrides, pegasus entry point."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from saigeedged import config as configmod
from saigeedged.adapters.docker import Spec, exec_user, pick_runtime
from saigeedged.compile.backends.cubie import pegasus_prefix


def test_runtime_auto_avoids_an_nvidia_default() -> None:
    """auto: runc when the default runtime is nvidia and runc exists; the engine's default otherwise."""
    assert pick_runtime("auto", {"DefaultRuntime": "nvidia", "Runtimes": {"nvidia": {}, "runc": {}}}) == "runc"
    assert pick_runtime("auto", {"DefaultRuntime": "runc", "Runtimes": {"runc": {}}}) is None
    assert pick_runtime("runc", {}) == "runc" and pick_runtime("kata", {}) == "kata"


def test_exec_user() -> None:
    """auto runs steps as the daemon's uid:gid so outbox files are not root-owned."""
    assert exec_user("auto") == f"{os.getuid()}:{os.getgid()}"
    assert exec_user("root") == "root" and exec_user("1000:1000") == "1000:1000"


def test_saige_cubie_environment_overrides(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """SAIGE_CUBIE_IMAGE / SAIGE_CUBIE_CONTAINER override the cubie config, as in the guide's script."""
    path = tmp_path / "c.yml"
    path.write_text("cubie: {image: 'ubuntu-npu:v2.0.10.1'}\n")
    monkeypatch.setenv("SAIGE_CUBIE_IMAGE", "ubuntu-npu:v1.8.11")
    monkeypatch.setenv("SAIGE_CUBIE_CONTAINER", "npu-t527")
    cfg = configmod.load(path)  # the overrides are read at load
    spec = Spec.for_target(cfg, "cubie")
    assert (spec.image, spec.name, spec.work_root) == ("ubuntu-npu:v1.8.11", "npu-t527", cfg.state_dir / "work")
    assert Spec.for_target(cfg, "mobilint").image == "mobilint/qbcompiler:1.3-cpu-ubuntu22.04"


def test_pegasus_entry_point() -> None:
    """A pegasus.py found in the toolkit runs under python3; a pegasus executable runs as it is."""
    assert pegasus_prefix("/root/acuity-toolkit-whl-6.30.22/bin/pegasus.py") == [
        "python3", "/root/acuity-toolkit-whl-6.30.22/bin/pegasus.py"]
    assert pegasus_prefix("/usr/local/bin/pegasus") == ["/usr/local/bin/pegasus"]
