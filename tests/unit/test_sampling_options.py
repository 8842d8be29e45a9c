"""`fab run-eval`'s sampling options: checked on the workstation, passed under the harness's
names (the option table, dflash_eval.contract.options)."""

from __future__ import annotations

import re

import pytest
from dflash_eval.contract.errors import HarnessError
from dflash_eval.walk.sampling_settings import Sampling

from dflash_ops.core.arguments import one_of
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
        ("paths", "0", "--paths: expected a whole number from 1 to 1024 paths, found '0'"),
        ("paths", "1025", "--paths: expected a whole number from 1 to 1024 paths, found '1025'"),
    ],
)
def test_a_bad_sampling_option_fails_naming_its_flag(name, value, message):
    with pytest.raises(OpsError) as caught:
        harness_args({name: value})
    assert str(caught.value) == message


@pytest.mark.parametrize(
    ("given", "typed", "said"),
    [
        ({"top_p": "0.9"}, {"top_p": 0.9}, "--top-p need --temperature above 0"),
        (
            {"temperature": "0", "top_k": "20", "samples": "50"},
            {"top_k": 20, "samples": 50},
            "--top-k and --samples need",
        ),
        ({"paths": "8"}, {"paths": 8}, "--paths need --temperature above 0"),
        (
            {"temperature": "1e-45"},
            {"temperature": 1e-45},
            "--temperature 1e-45: below 0.0001 logits / T overflow",
        ),
    ],
)
def test_the_rules_between_options_are_checked_before_anything_is_staged(given, typed, said):
    with pytest.raises(OpsError, match=re.escape(said)):
        harness_args(given)
    # The harness cannot tell a --samples or --paths given from its default.
    if not {"samples", "paths"} & set(typed):
        with pytest.raises(HarnessError, match=re.escape(said)):
            Sampling(**typed).check()


def test_defaults_and_real_sampling_pass_the_rules():
    assert harness_args({"temperature": "0.0001", "samples": "50"}) == [
        "--temperature", "0.0001", "--samples", "50",
    ]  # fmt: skip
    assert harness_args({"top_p": "1", "top_k": "0"}) == ["--top-p", "1.0", "--top-k", "0"]


def test_step_zero_counts_as_a_step_beside_latest():
    with pytest.raises(OpsError, match=r"^--step and --latest exclude each other"):
        one_of(("--step", 0), ("--latest", True))
    one_of(("--step", None), ("--latest", True))
    one_of(("--step", 0), ("--latest", False))
