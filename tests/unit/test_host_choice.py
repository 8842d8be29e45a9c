"""Which eval host `fab run-eval --step N` takes when the inventory has several and --host
names none (dflash_ops.evaluation.host_choice): the first idle one, saying why; the run and its
dry run both take it (tests/e2e/test_run_eval_plan.py shows them on the lab)."""

from __future__ import annotations

import pytest

from dflash_ops.core.errors import HostBusy
from dflash_ops.evaluation.host_choice import pick_idle

HOSTS = ["eval", "eval2", "eval3"]


def test_the_first_idle_host_in_inventory_order_is_taken_and_the_line_says_so():
    choice = pick_idle(HOSTS, {"eval": None, "eval2": None, "eval3": None}, 4000)
    assert choice.name == "eval"
    assert choice.reason == (
        "step 4000 runs here: idle (first in the inventory); --host NAME picks another"
    )


def test_a_busy_or_unreachable_host_is_passed_over_and_named():
    unavailable = {
        "eval": "busy with run 20261201-120301-step2000-eval-c3d4 (step 2000)",
        "eval2": "not asked (eval2: connection refused)",
        "eval3": None,
    }
    choice = pick_idle(HOSTS, unavailable, 4000)
    assert choice.name == "eval3"
    assert "idle (eval: busy with run 20261201-120301-step2000-eval-c3d4 (step 2000); " in (
        choice.reason
    )
    assert "eval2: not asked (eval2: connection refused))" in choice.reason


def test_no_idle_host_is_one_line_naming_each_and_what_to_do():
    unavailable = {name: f"busy with run r-{name} (step 2000)" for name in HOSTS}
    with pytest.raises(HostBusy) as refused:
        pick_idle(HOSTS, unavailable, 4000)
    message = str(refused.value)
    assert message.startswith("no eval host is free for step 4000: eval: busy with run r-eval")
    assert "eval3: busy with run r-eval3 (step 2000)" in message
    assert "--host NAME" in message and "\n" not in message
