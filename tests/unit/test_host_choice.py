"""Which eval host `fab run-eval --step N` takes when the inventory has several and --host
names none (dflash_ops.evaluation.host_choice): the first idle one, saying why; the run and its
dry run both take it (tests/e2e/test_run_eval_plan.py shows them on the lab). `--hosts all`
(or a comma list) names several, each to run the step; it goes with neither --host nor a
sweep, and says so in one line before any host is asked."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from dflash_ops.core import inventory
from dflash_ops.core.errors import HostBusy, OpsError
from dflash_ops.evaluation.host_choice import named_eval_hosts, pick_idle
from tests.conftest import run_fab
from tests.unit.test_inventory import example

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


@pytest.fixture
def three_hosts(tmp_path) -> Path:
    """The example inventory with three eval hosts (never contacted: every case here is
    decided before a host is asked)."""
    document = example()
    for name in HOSTS[1:]:
        document["hosts"][name] = {**document["hosts"]["eval"], "address": f"ct-{name}"}
    path = tmp_path / "inventory.yaml"
    path.write_text(yaml.safe_dump(document))
    return path


def test_hosts_all_names_every_eval_host_and_a_list_names_those_it_lists(three_hosts):
    inv = inventory.load(three_hosts)
    assert named_eval_hosts(inv, None, "all", sweep=False) == HOSTS
    assert named_eval_hosts(inv, None, " eval3, eval,eval3 ", sweep=False) == ["eval3", "eval"]
    assert named_eval_hosts(inv, "eval2", None, sweep=False) is None  # not given: --host decides


@pytest.mark.parametrize(
    ("host", "hosts", "sweep", "expected"),
    [
        ("eval", "all", False, "--host and --hosts exclude each other: pass one of them"),
        (None, "all", True, "--hosts runs one step on each named host: pass --step N"),
        (None, "eval,ct9", False, "--hosts 'eval,ct9': no eval host named 'ct9'; pass 'all' "
         "or a comma list of the eval hosts: eval, eval2, eval3"),
        (None, " , ", False, "--hosts ' , ': no name; pass 'all'"),
    ],
)  # fmt: skip
def test_hosts_refused_in_one_line(three_hosts, host, hosts, sweep, expected):
    with pytest.raises(OpsError) as refused:
        named_eval_hosts(inventory.load(three_hosts), host, hosts, sweep=sweep)
    assert str(refused.value).startswith(expected) and "\n" not in str(refused.value)


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        (["--step", "2000", "--host", "eval", "--hosts", "all"], "--host and --hosts exclude"),
        (["--steps", "2000,4000", "--hosts", "all"], "--hosts runs one step on each named"),
        (["--step", "2000", "--hosts", "eval9"], "no eval host named 'eval9'"),
    ],
)
def test_fab_run_eval_refuses_hosts_beside_host_or_a_sweep(three_hosts, flags, expected):
    refused = run_fab(three_hosts, "run-eval", *flags)
    assert refused.returncode == 1
    assert expected in refused.stderr and "Traceback" not in refused.stderr
