"""The harness's one number parser: options and config values are finite, bounded and whole
where they must be, and a bad one is one line naming it, before anything is built from it."""

from __future__ import annotations

import math

import pytest
from dflash_eval.cli import main
from dflash_eval.contract.config_keys import CONFIG_BOUNDS, TOP_LEVEL
from dflash_eval.contract.errors import HarnessError
from dflash_eval.contract.numbers import parse_number
from dflash_eval.drafter.config import from_hf_dict

from dflash_ops.core.arguments import parse_count
from dflash_ops.core.arguments import parse_number as workstation_number
from dflash_ops.core.errors import OpsError

from .helpers import small_config


@pytest.mark.parametrize(
    ("value", "whole", "expected"),
    [("12", True, 12), (12.0, True, 12), ("2.5", False, 2.5), (" 7 ", True, 7), (3, False, 3)],
)
def test_good_numbers_come_back_typed(value, whole, expected):
    number = parse_number("--n", value, minimum=0, maximum=100, whole=whole)
    assert number == expected and type(number) is type(expected)


@pytest.mark.parametrize(
    "value", ["1e400", "inf", "-inf", "nan", math.inf, math.nan, True, "12x", "", None, [1], "2.5"]
)
def test_no_infinite_unbounded_or_foreign_number_passes(value):
    with pytest.raises(HarnessError, match=r"^--n: expected a whole number from 0 to 100 tokens"):
        parse_number("--n", value, minimum=0, maximum=100, whole=True, unit="tokens")


def test_a_whole_number_of_any_length_is_judged_exactly_by_its_bounds():
    with pytest.raises(HarnessError, match="from 0 to 1024"):
        parse_number("layers", "1" + "0" * 400, minimum=0, maximum=1024, whole=True)
    assert parse_number("step", str(10**12), minimum=0, whole=True) == 10**12


def test_the_workstation_uses_the_same_parser_with_its_own_error():
    with pytest.raises(OpsError, match=r"^--margin-fraction: expected a finite number from 0 to 1"):
        workstation_number("--margin-fraction", "inf", minimum=0, maximum=1)
    with pytest.raises(
        OpsError, match=r"--retries: expected a whole number from 0 to 9, found '1e4"
    ):
        parse_count("--retries", "1e400", minimum=0, maximum=9)


@pytest.mark.parametrize(
    ("key", "value", "expected"),
    [
        ("num_hidden_layers", 10**12, "num_hidden_layers: expected a whole number from 1 to 1024"),
        ("hidden_size", "64", "hidden_size: expected a whole number from 1 to 65536, found '64'"),
        ("rms_norm_eps", math.inf, "rms_norm_eps: expected a finite number from 0 to 1"),
        ("max_position_embeddings", 2**40, "max_position_embeddings: expected a whole number"),
        ("dflash_config.target_layer_ids", [1, 2**40], "target_layer_ids: expected a whole number"),
        ("dflash_config.mask_token_id", "3", "mask_token_id: expected a whole number"),
        ("block_size", 1e400, "block_size: expected a whole number from 0 to 1024"),
        ("dflash_config.selector_top_k", 2**40, "selector_top_k: expected a whole number"),
        ("output_multiplier", math.inf, "output_multiplier=inf; expected a number (finite)"),
    ],
)
def test_a_config_number_out_of_bounds_is_one_line_before_anything_is_built(key, value, expected):
    """num_hidden_layers 10**12 in a checkpoint's config used to be built (and crash)."""
    raw = small_config().to_hf_dict()
    *block, name = key.split(".")
    (raw[block[0]] if block else raw)[name] = value
    with pytest.raises(HarnessError) as refused:
        from_hf_dict(raw, "c.pt")
    assert expected in str(refused.value)


def test_every_bounded_config_key_is_an_accepted_key():
    """The bounds and the accepted keys (contract/config_keys.py) describe the same config."""
    assert set(CONFIG_BOUNDS) <= set(TOP_LEVEL)


@pytest.mark.parametrize(
    ("flag", "value", "expected"),
    [
        ("--temperature", "nan", "expected a finite number from 0 to 100, found 'nan'"),
        ("--seed", "-1", f"expected a whole number from 0 to {(1 << 63) - 1}, found '-1'"),
        ("--seed", str(1 << 63), f"expected a whole number from 0 to {(1 << 63) - 1}, found"),
        ("--max-new-tokens", "1e400", "expected a whole number from 1 to 1048576 tokens"),
        ("--threads", "0", "expected a whole number from 1 to 4096 threads, found '0'"),
        ("--ddtree", "4,inf", "expected a whole number from 1 to 4096 tokens, found 'inf'"),
        ("--step", "-1", "expected a whole number from 0 to 1000000000, found '-1'"),
    ],
)
def test_a_bad_numeric_option_is_one_usage_line(tmp_path, capsys, flag, value, expected):
    argv = ["eval", "--target", str(tmp_path), "--checkpoint", str(tmp_path / "c.pt")]
    with pytest.raises(SystemExit) as exited:
        main([*argv, "--out", str(tmp_path / "r.json"), flag, value])
    assert exited.value.code == 2
    assert f"argument {flag}: {expected}" in capsys.readouterr().err
