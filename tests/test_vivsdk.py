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
    """An SDK with only the non-_PLUS_ A733 name: a733 is served by it, t527 and a527 (neither NANOSI spelling)
    warn; an override the image lacks warns once."""
    warnings = vivsdk.missing(["VIP9000NANODI_PID0X1000003B", "VIP9000PICO_PID0XEE"], ["X_PID0X1", "X_PID0X1"])
    assert [w.split(":")[0] for w in warnings] == ["platform t527", "platform a527", "optimize"]
    assert "VIP9000NANOSI_PLUS_PID0X10000016 or VIP9000NANOSI_PID0X10000016: neither" in warnings[0]
    assert "X_PID0X1" in warnings[-1] and len(warnings) == 3


def test_each_platform_gets_the_first_candidate_the_image_has() -> None:
    """_PLUS_ first when both are there, the non-_PLUS_ one when only it is, None when neither is."""
    both = ["VIP9000NANODI_PID0X1000003B", "VIP9000NANODI_PLUS_PID0X1000003B"]
    assert vivsdk.choose("a733", both) == "VIP9000NANODI_PLUS_PID0X1000003B"
    assert vivsdk.choose("a733", both[:1]) == "VIP9000NANODI_PID0X1000003B"
    assert vivsdk.choose("a733", ["VIP9000PICO_PID0XEE"]) is None
    assert vivsdk.choose("v853", ["VIP9000PICO_PID0XEE"]) == "VIP9000PICO_PID0XEE"


def test_versions_come_from_the_folder_names() -> None:
    """The wheel folder gives ACUITY's version and the VIV SDK path VivanteIDE's; an unknown layout gives None."""
    line = "/root/acuity-toolkit-whl-6.21.16 /root/Vivante_IDE/VivanteIDE5.8.2/cmdtools"
    assert vivsdk.versions(line) == {"acuity": "6.21.16", "vivante_ide": "5.8.2"}
    assert vivsdk.versions(" /opt/sdk/cmdtools") == {"acuity": None, "vivante_ide": None}


def test_the_choice_and_version_scripts_run_in_a_real_shell(tmp_path: Path) -> None:
    """The choice snippet prints the first candidate with a .config (exit 1, nothing printed, for none); the
    version snippet names the SDK folder (here a folder with a space, passed as one path)."""
    import subprocess

    sdk = tmp_path / "Vivante IDE" / "VivanteIDE5.11.0" / "cmdtools"
    (sdk / "common" / "cfg").mkdir(parents=True)
    (sdk / "common" / "cfg" / "B.config").write_text("")
    run = subprocess.run(["sh", "-c", vivsdk.choose_script(str(sdk), ["A", "B"])], capture_output=True, text=True)
    assert (run.returncode, run.stdout) == (0, "B\n")
    run = subprocess.run(["sh", "-c", vivsdk.choose_script(str(sdk), ["A"])], capture_output=True, text=True)
    assert (run.returncode, run.stdout) == (1, "")
    run = subprocess.run(["sh", "-c", vivsdk.version_script(str(sdk))], capture_output=True, text=True)
    assert vivsdk.versions(run.stdout)["vivante_ide"] == "5.11.0" and str(sdk) in run.stdout


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
