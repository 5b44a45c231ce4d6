"""Shared fixtures: temp configs pointing every directory into tmp_path."""

from __future__ import annotations

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
