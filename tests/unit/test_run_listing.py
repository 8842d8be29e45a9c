"""What the workstation reads from an eval host's listing of its runs, without a host
(dflash_ops.evaluation.run_listing): each run's state from the host's verdicts, a bad line
kept as a broken run; and the run ids that name them. The lab tier lists real runs
(tests/lab/test_jobs.py, tests/lab/test_run_status.py)."""

from __future__ import annotations

import json
import re

from dflash_ops.evaluation import jobs, run_listing


def test_parse_runs_states():
    # pid: the host's verdict on the harness's pid file, alive: on the wrapper's
    line = "r1\t{code}\t{pid}\t{alive}\t{results}\t{finished}\t-\t-\t{params}"
    params = json.dumps({"step": 2000, "started": 1000.0})

    def state(**fields) -> str:
        values = {
            "code": "-",
            "pid": "gone 42",
            "alive": "gone 41",
            "results": "no",
            "finished": "-",
            "params": params,
            **fields,
        }
        return run_listing.parse_runs("eval", line.format(**values), now=1010.0)[0].state

    assert state(alive="live 41") == "running"
    assert state(code="0", results="yes", finished="1005") == "succeeded"
    assert state(code="0") == "failed"  # exit 0 without results is not a success
    assert state(code="137") == "failed"
    assert state(pid="none") == "starting"
    assert state() == "lost"
    assert state(code="143", results="cancelled") == "cancelled"
    # A features run's product is its feature set, not results.json.
    features = json.dumps({"kind": "features", "started": 1000.0})
    assert state(code="0", params=features) == "succeeded"
    assert state(code="2", params=features) == "failed"


def test_run_ids_name_a_named_training_run_and_keep_the_default_as_it_was():
    default = jobs.new_run_id(4000, "eval", tag="t1")
    named = jobs.new_run_id(4000, "eval", tag="t1", training_run="v4")
    assert re.fullmatch(r"\d{8}-\d{6}-step4000-eval-t1-[0-9a-f]{4}", default)
    assert re.fullmatch(r"\d{8}-\d{6}-v4-step4000-eval-t1-[0-9a-f]{4}", named)
    assert "-step4000-" in jobs.new_run_id(4000, "eval", training_run="a/b c")  # made safe
    assert "/" not in jobs.new_run_id(4000, "eval", training_run="a/b c")


def test_parse_runs_never_fails_on_one_bad_line():
    output = (
        'a\t0\tgone 1\tgone 2\tyes\t5\t-\t-\t{"step": 1, "started": 1}\0'
        "b\t-\tnone\tnone\tno\t-\t-\t-\t[1]\0"
    )
    bad, good = run_listing.parse_runs("eval", output, now=100)  # oldest first; b has no start
    assert (good.run_id, good.state) == ("a", "succeeded")
    assert (bad.run_id, bad.state, bad.problem) == (
        "b",
        "broken",
        "params.json: expected a JSON object, found list",
    )
