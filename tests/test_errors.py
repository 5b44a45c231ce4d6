"""The error codes are one typed set: SPEC's list, each with a hint, and mypy rejects any other spelling."""

from __future__ import annotations

from pathlib import Path

import pytest
from mypy import api

from saigeedged.adapters.outbox import Outbox
from saigeedged.errors import CODES, ENVIRONMENT_CODES, HINTS, INPUT_CODES, RETRYABLE, SaigeError
from saigeedged.service.publishing import publish_patiently

# SPEC §10's list, plus ENGINE_LOST of §11 and CHILD_LOST (SPEC lives outside the repository, so CI cannot read it).
SPEC_CODES = {
    "MANIFEST_INVALID", "PATH_NOT_ALLOWED", "INPUT_NOT_FOUND", "INPUT_INCOMPLETE", "ONNX_INVALID", "SYMBOLIC_DIM",
    "INPUT_SIZE_MISMATCH", "SURGERY_OUTPUTS_NOT_FOUND", "CALIB_INVALID", "DOCKER_UNAVAILABLE", "IMAGE_NOT_FOUND",
    "CONTAINER_FAILED", "CONTAINER_LOST", "STEP_FAILED", "QUANTIZE_NO_OUTPUT", "EXPORT_FAILED", "NBG_INVALID",
    "TIMEOUT", "PUBLISH_FAILED", "CANCELLED", "INTERNAL", "ACCURACY_GATE",
    "ENGINE_LOST",  # §11
    "CHILD_LOST",  # issue 26: a killed host child is a retryable loss, like a lost container
    "OUT_OF_MEMORY",  # issue 25: a bound on memory struck (§10 does not list it yet)
}
MYPY = ["--config-file", "", "--strict", "--no-incremental"]  # not pyproject's: it names the package to check


def test_codes_are_specs_list_each_with_a_hint() -> None:
    """The typed set is SPEC's list, once each; every code has a hint and every hint a code."""
    assert len(CODES) == len(set(CODES))
    assert set(CODES) == SPEC_CODES
    assert set(HINTS) == SPEC_CODES
    assert all(HINTS[code].strip() for code in CODES)
    assert RETRYABLE == {"CONTAINER_LOST", "ENGINE_LOST", "CHILD_LOST", "PUBLISH_FAILED"}
    assert INPUT_CODES | ENVIRONMENT_CODES < SPEC_CODES


def test_unknown_code_read_back_is_refused() -> None:
    """A code that only arrives at run time (a child's pickle, a file) is checked against the set too."""
    try:
        SaigeError("NOPE", "x")  # type: ignore[arg-type]
    except ValueError as exc:
        assert "NOPE" in str(exc)
    else:
        raise AssertionError("SaigeError took an unknown code")


def test_mypy_rejects_a_misspelt_code() -> None:
    """mypy --strict fails on a code outside the set, in SaigeError and in a comparison with .code."""
    good = "from saigeedged.errors import SaigeError\nSaigeError('CANCELLED', 'x')\n"
    out, _, status = api.run([*MYPY, "-c", good])
    assert status == 0, out
    bad = ("from saigeedged.errors import SaigeError\nSaigeError('CANCELED', 'x')\n"
           "def f(e: SaigeError) -> bool:\n    return e.code == 'CANCELED'\n")
    out, _, status = api.run([*MYPY, "-c", bad])
    assert status == 1
    assert 'Argument 1 to "SaigeError" has incompatible type' in out, out
    assert "Non-overlapping equality check" in out, out


def test_a_publish_out_of_patience_says_to_retry_the_job(tmp_path: Path) -> None:
    """A bundle the outbox still refuses past publish_patience_s fails the job for good with a hint to `saigeedged
    retry` it (the hint said the job is retried); a refusal before that keeps the hint of a bundle tried again."""
    outbox = Outbox(tmp_path / "outbox")
    outbox.root.mkdir()
    (outbox.root / "sub").write_text("a file where the bundle's folder goes")
    bundle = tmp_path / "det.host.saigeedge"
    bundle.write_bytes(b"PK")
    rel = Path("sub/det.host.saigeedge")
    with pytest.raises(SaigeError) as refused:
        outbox.publish_bundle(bundle, rel, "det-20261130T031500Z-a1b2c3")
    assert refused.value.retryable and "publish_patience_s" in refused.value.hint
    assert "saigeedged retry" not in refused.value.hint
    with pytest.raises(SaigeError) as final:
        publish_patiently(lambda: outbox.publish_bundle(bundle, rel, "det-20261130T031500Z-a1b2c3"), 0.0,
                          lambda: None, lambda exc, wait_s: None)
    assert final.value.code == "PUBLISH_FAILED" and final.value.fields["exhausted"]
    assert "`saigeedged retry JOB_ID` once it takes files" in final.value.hint and "is retried" not in final.value.hint
    assert final.value.as_dict("publish")["hint"] == final.value.hint


def test_a_failure_in_one_line_ends_with_the_compilers_last_word_and_no_control_character() -> None:
    """The journal's, `status`'s and Slack's line of a failure: its first line and, when that only announces the
    lines after it, their last one; a compiler's colour codes are escaped (journalctl showed such a MESSAGE as
    "[blob data]", hiding the failure it was there to say)."""
    from saigeedged.guards import headline

    said = headline("`pegasus import onnx` exited 1; last lines:\nI start\n\x1b[31mE Fatal model error: 65280\x1b[0m\n")
    assert said == "`pegasus import onnx` exited 1; last lines: ... \\x1b[31mE Fatal model error: 65280\\x1b[0m"
    assert headline("quantize ran out of memory\nsee the log") == "quantize ran out of memory" and headline("") == ""
