"""What the ACUITY image's VIV SDK supports (pure part of `check`): targets from its cfg files, warnings."""

from __future__ import annotations

from pathlib import Path

from saigeedged.compile import vivsdk

PLUS = ["VIP9000NANODI_PLUS_PID0X1000003B", "VIP9000NANOSI_PLUS_PID0X10000016", "VIP9000PICO_PID0XEE"]


def test_targets_are_the_config_file_stems() -> None:
    """Only `.config` names count, without the suffix, sorted."""
    listing = "VIP9000PICO_PID0XEE.config\nREADME\nVIP9000NANODI_PLUS_PID0X1000003B.config\n"
    assert vivsdk.targets(listing) == ["VIP9000NANODI_PLUS_PID0X1000003B", "VIP9000PICO_PID0XEE"]


def test_no_warning_when_every_platform_and_override_is_there() -> None:
    """The stand-in's (and the guide's) _PLUS_ names cover every platform: nothing to warn about."""
    assert vivsdk.missing(PLUS, ["VIP9000PICO_PID0XEE"]) == []


def test_a_missing_platform_target_and_a_missing_override_are_each_named() -> None:
    """An SDK without the _PLUS_ names: a733, t527 and a527 warn; an override the image lacks warns once."""
    warnings = vivsdk.missing(["VIP9000NANODI_PID0X1000003B", "VIP9000PICO_PID0XEE"], ["X_PID0X1", "X_PID0X1"])
    assert [w.split(":")[0] for w in warnings] == ["platform a733", "platform t527", "platform a527", "optimize"]
    assert "X_PID0X1" in warnings[-1] and len(warnings) == 4


def test_overrides_without_a_queue_are_none(tmp_path: Path) -> None:
    """A host that never ran the daemon has no overrides in use (and check creates no database)."""
    assert vivsdk.overrides_in_use(tmp_path) == [] and not (tmp_path / "saigeedged.db").exists()


def test_the_listing_script_takes_a_folder_with_spaces_and_quotes_as_one_path(tmp_path: Path) -> None:
    """cubie.viv_sdk with a space or a quote in it is listed as written (run here by a real `sh`), never split
    or run as shell syntax."""
    import subprocess

    sdk = tmp_path / "Vivante IDE 'x'; touch hacked" / "cmdtools"
    (sdk / "common" / "cfg").mkdir(parents=True)
    (sdk / "common" / "cfg" / "VIP9000PICO_PID0XEE.config").write_text("")
    out = subprocess.run(["sh", "-c", vivsdk.list_script(str(sdk))], capture_output=True, text=True, cwd=tmp_path,
                         check=True).stdout
    assert vivsdk.targets(out) == ["VIP9000PICO_PID0XEE"] and not (tmp_path / "hacked").exists()
