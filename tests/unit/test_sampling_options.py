"""`fab run-eval`'s sampling options: checked on the workstation, passed under the harness's
names (the option table, dflash_eval.contract.options)."""

from __future__ import annotations

import pytest

from dflash_ops.core.errors import OpsError
from dflash_ops.evaluation.harness_options import harness_args


def test_sampling_options_become_harness_flags():
    args = harness_args({"temperature": "0.6", "top_p": "0.95", "top_k": "20", "seed": "3"})
    assert args == ["--temperature", "0.6", "--top-p", "0.95", "--top-k", "20", "--seed", "3"]
    assert harness_args({"temperature": None, "samples": None}) == []


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("temperature", "-1", "--temperature: expected a finite number from 0 to 100, found '-1'"),
        (
            "temperature",
            "warm",
            "--temperature: expected a finite number from 0 to 100, found 'warm'",
        ),
        (
            "temperature",
            "inf",
            "--temperature: expected a finite number from 0 to 100, found 'inf'",
        ),
        ("top_p", "nan", "--top-p: expected a finite number > 0 and ≤ 1, found 'nan'"),
        ("top_p", "0", "--top-p: expected a finite number > 0 and ≤ 1, found '0'"),
        ("top_p", "1.5", "--top-p: expected a finite number > 0 and ≤ 1, found '1.5'"),
        ("samples", "1", "--samples: expected a whole number from 2 to 1000000 walks, found '1'"),
    ],
)
def test_a_bad_sampling_option_fails_naming_its_flag(name, value, message):
    with pytest.raises(OpsError) as caught:
        harness_args({name: value})
    assert str(caught.value) == message
