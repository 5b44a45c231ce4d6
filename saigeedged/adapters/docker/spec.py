"""What a target's container must look like: name, image, work root, runtime, exec user, owner labels."""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from saigeedged.config import Config, Cubie

MANAGED_LABEL = "io.saigeedge.managed"
OWNER_LABEL = "io.saigeedge.owner"  # host:state_dir of the daemon that made it: another daemon never touches it


@dataclass(frozen=True)
class Spec:
    """What a target's container must look like."""

    name: str
    image: str
    work_root: Path
    runtime: str = "auto"
    user: str = "auto"
    owner: str = ""

    @classmethod
    def for_target(cls, config: Config, target: str) -> Spec:
        section = config.cubie if target == "cubie" else config.mobilint
        runtime, user = (section.runtime, section.user) if isinstance(section, Cubie) else ("auto", "auto")
        return cls(section.container, section.image, config.work_root, runtime, user,
                   f"{socket.gethostname()}:{config.state_dir}")


def pick_runtime(setting: str, info: dict[str, Any]) -> str | None:
    """The container runtime: `auto` avoids an nvidia default (runc when the engine has it), else the engine's default."""
    if setting != "auto":
        return setting
    return "runc" if info.get("DefaultRuntime") == "nvidia" and "runc" in info.get("Runtimes", {}) else None


def exec_user(setting: str) -> str:
    if setting == "auto":
        return f"{os.getuid()}:{os.getgid()}"
    return setting
