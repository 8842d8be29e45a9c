"""The suite's scheduling (tests/conftest.py): modules that share a session lab are sent to one
worker, so the lab is built once per `make test`."""

from __future__ import annotations

from tests.conftest import REPO, SAME_WORKER, work_unit


def test_joined_modules_exist_so_the_join_is_not_silently_lost_to_a_rename():
    for module, joins in SAME_WORKER.items():
        assert (REPO / module).is_file(), f"SAME_WORKER names {module}, which is gone"
        assert (REPO / joins).is_file(), f"SAME_WORKER joins {module} to {joins}, which is gone"


def test_a_joined_module_is_one_work_unit_with_the_module_it_joins():
    joined = "tests/e2e/test_run_eval_features.py::test_a_tampered_copy_on_the_eval_host"
    assert work_unit(joined) == "tests/e2e/test_extract_features.py"
    assert work_unit("tests/e2e/test_extract_features.py::test_x") == (
        "tests/e2e/test_extract_features.py"
    )
    assert work_unit("tests/unit/test_work_units.py::test_y") == "tests/unit/test_work_units.py"
