"""The suite's own rule for ../shared/data: a missing data set is a skip on a developer's machine and a failure where
LEANTRAIN_REQUIRE_SHARED_DATA=1 (.ci/run sets it), so a CI checkout without the data cannot pass by skipping."""

import pytest

from tests import helpers

REQUIRE = "LEANTRAIN_REQUIRE_SHARED_DATA"


@pytest.fixture
def empty_shared(tmp_path, monkeypatch):
    monkeypatch.setattr(helpers, "SHARED_DATA", tmp_path)  # a shared-data folder that holds nothing
    return tmp_path


def outcome(*parts: str):
    """What shared_data does for these parts: ("skip" | "fail", message), or ("path", the path)."""
    try:
        return "path", helpers.shared_data(*parts)
    except pytest.skip.Exception as e:  # caught here, or this test would itself be reported as skipped
        return "skip", str(e)
    except pytest.fail.Exception as e:
        return "fail", str(e)


@pytest.mark.parametrize("value", [None, "0", ""])
def test_missing_shared_data_is_a_skip_by_default(empty_shared, monkeypatch, value):
    if value is None:
        monkeypatch.delenv(REQUIRE, raising=False)
    else:
        monkeypatch.setenv(REQUIRE, value)
    kind, message = outcome("sst2", "dev.tsv")
    assert kind == "skip" and f"shared data not found: {empty_shared / 'sst2' / 'dev.tsv'}" in message


def test_missing_shared_data_is_a_failure_when_required(empty_shared, monkeypatch):
    monkeypatch.setenv(REQUIRE, "1")
    kind, message = outcome("sst2", "dev.tsv")
    assert kind == "fail", message
    assert f"shared data not found: {empty_shared / 'sst2' / 'dev.tsv'}" in message and f"{REQUIRE}=1" in message


def test_present_shared_data_is_returned_either_way(empty_shared, monkeypatch):
    (empty_shared / "sst2").mkdir()
    (empty_shared / "sst2" / "dev.tsv").write_text("sentence\tlabel\n")
    for value in ("0", "1"):
        monkeypatch.setenv(REQUIRE, value)
        assert outcome("sst2", "dev.tsv") == ("path", empty_shared / "sst2" / "dev.tsv")
