"""Typed configuration: sections are frozen dataclasses built once at load, with the SAIGE_CUBIE_* overrides."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

import saigeedged
from saigeedged import config as configmod
from saigeedged.compile.reuse import host_side


def test_sections_are_typed_and_frozen(tmp_path: Path) -> None:
    """Each section is a frozen dataclass of the loaded values; a float key written as an int is a float."""
    path = tmp_path / "c.yml"
    path.write_text("watch: {settle_s: 1}\nlimits: {max_attempts: 5}\nnotify: [{url: 'http://h/x'}]\n")
    cfg = configmod.load(path)
    assert cfg.watch.settle_s == 1.0 and isinstance(cfg.watch.settle_s, float)
    assert cfg.limits.max_attempts == 5 and cfg.limits.step_timeout_s == 3600
    assert cfg.defaults.as_dict() == configmod.DEFAULTS["defaults"]
    assert cfg.notify == ({"url": "http://h/x"},)
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.limits.max_attempts = 1  # type: ignore[misc]


def test_cubie_overrides_apply_at_load_everywhere(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """SAIGE_CUBIE_<KEY> reaches the typed section, the raw one, and the cache key's record of pegasus/viv_sdk."""
    path = tmp_path / "c.yml"
    path.write_text("cubie: {pegasus: /opt/a/pegasus.py}\n")
    monkeypatch.setenv("SAIGE_CUBIE_PEGASUS", "/opt/b/pegasus.py")
    monkeypatch.setenv("SAIGE_CUBIE_VIV_SDK", "")  # empty: no override, as before
    cfg = configmod.load(path)
    assert cfg.cubie.pegasus == "/opt/b/pegasus.py" == cfg.section("cubie")["pegasus"]
    assert cfg.cubie.viv_sdk == configmod.DEFAULTS["cubie"]["viv_sdk"]
    assert host_side("cubie", cfg)["pegasus"] == "/opt/b/pegasus.py"


def test_no_section_lookups_outside_config() -> None:
    """Only config.py reads the untyped sections (`section(...)`, `.raw[...]`): every other module uses the typed fields."""
    root = Path(saigeedged.__file__).parent
    found = [str(p.relative_to(root)) for p in root.rglob("*.py")
             if re.search(r"\.section\(|\.raw\[", p.read_text()) and p.name != "config.py"]
    assert found == [], found
