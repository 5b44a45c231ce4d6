"""Daemon config loading (SPEC §2)."""

from pathlib import Path

import pytest

from saigeedged import config as configmod
from saigeedged.errors import SaigeError


def test_defaults_fill_every_key(tmp_path: Path) -> None:
    """An empty config file gives the documented defaults."""
    path = tmp_path / "c.yml"
    path.write_text("{}\n")
    cfg = configmod.load(path)
    assert cfg.section("watch")["settle_s"] == 2.0
    assert cfg.section("limits")["max_attempts"] == 3
    assert cfg.section("cubie")["image"] == "ubuntu-npu:v2.0.10.1"
    assert cfg.inbox == Path("/srv/saige/inbox")


def test_relative_paths_are_relative_to_the_config_file(tmp_path: Path) -> None:
    """`inbox: in` in /x/c.yml means /x/in, whatever the current directory."""
    (tmp_path / "etc").mkdir()
    path = tmp_path / "etc" / "c.yml"
    path.write_text("inbox: in\noutbox: ../out\nstate_dir: state\nallowed_roots: [data]\n")
    cfg = configmod.load(path)
    assert cfg.inbox == tmp_path / "etc" / "in"
    assert cfg.outbox == tmp_path / "out"
    assert cfg.allowed_roots == (tmp_path / "etc" / "data",)
    assert cfg.named_dirs


def test_unknown_key_suggests_the_nearest(tmp_path: Path) -> None:
    """A typo in a nested key is rejected with the valid key suggested."""
    path = tmp_path / "c.yml"
    path.write_text("watch:\n  setle_s: 3\n")
    with pytest.raises(SaigeError) as err:
        configmod.load(path)
    assert "watch.setle_s" in err.value.message and "watch.settle_s" in err.value.message


def test_wrong_type_and_choice_are_rejected(tmp_path: Path) -> None:
    """Types come from the defaults; enumerated keys only take their values."""
    path = tmp_path / "c.yml"
    path.write_text("limits: {max_attempts: three}\n")
    with pytest.raises(SaigeError, match="limits.max_attempts"):
        configmod.load(path)
    path.write_text("watch: {mode: inotify}\n")
    with pytest.raises(SaigeError, match="watch.mode"):
        configmod.load(path)


def test_integer_accepted_for_float_key(tmp_path: Path) -> None:
    """`settle_s: 1` is a valid float setting."""
    path = tmp_path / "c.yml"
    path.write_text("watch: {settle_s: 1}\n")
    assert configmod.load(path).section("watch")["settle_s"] == 1


def test_keep_work_env_override(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """SAIGE_CUBIE_KEEP_WORK=1 turns keep_work on (read at load)."""
    path = tmp_path / "c.yml"
    path.write_text("{}\n")
    assert not configmod.load(path).keep_work
    monkeypatch.setenv("SAIGE_CUBIE_KEEP_WORK", "1")
    assert configmod.load(path).keep_work


def test_example_config_is_valid() -> None:
    """config/saigeedged.yml documents every key and loads."""
    example = Path(__file__).parent.parent / "config" / "saigeedged.yml"
    cfg = configmod.load(example)
    text = example.read_text()
    for section, value in configmod.DEFAULTS.items():
        assert f"{section}:" in text
        if isinstance(value, dict):
            for key in value:
                assert f"{key}:" in text, key
    assert cfg.section("limits") == configmod.DEFAULTS["limits"]
