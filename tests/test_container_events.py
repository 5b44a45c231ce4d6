"""What the journal hears about the compiler container's life (SPEC §9), against a real engine."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from saigeedged import config as configmod
from saigeedged.adapters.docker import Containers

pytestmark = pytest.mark.docker


def test_first_start_is_created_a_later_start_is_restarted(docker_config: Path, docker_client: Any) -> None:
    """A fresh container's first start is `container.created` only; starting it again after it stopped is a restart."""
    heard: list[str] = []
    containers = Containers(configmod.load(docker_config), on_event=lambda name, fields: heard.append(name))
    cubie = containers.container("cubie")
    first = cubie.ensure()
    assert heard == ["container.created"]
    cubie.ensure()
    assert heard == ["container.created"]  # running: nothing to say
    first.stop(timeout=0)
    assert cubie.ensure().id == first.id
    assert heard == ["container.created", "container.restarted"]
