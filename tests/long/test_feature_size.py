"""A feature set's size is known before it is computed (reference/feature_size.py): an upper bound
that the built set never exceeds, reported by `features --check-space` without computing or
writing the set, and a refusal before the target loads when the disk cannot hold it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from dflash_eval.contract.errors import HarnessError
from dflash_eval.contract.options import MAX_TOKENS
from dflash_eval.contract.progress import Progress
from dflash_eval.contract.prompts import Prompt
from dflash_eval.reference import feature_size
from dflash_eval.run.features import FeaturesOptions, run_features
from dflash_eval.target.files import load_tokenizer

pytestmark = pytest.mark.long(15)  # seconds in a cold `make test` (5 workers)

REMOTE = Path(__file__).resolve().parents[2] / "remote"
TIMEOUT_S = 300


def _options(lab, setdir: Path, **overrides) -> FeaturesOptions:
    options = FeaturesOptions(
        target=lab.target_dir,
        out=setdir,
        threads=1,
        layers=[1, 3],
        block_size=8,
        prompts=lab.prompts,
        max_new_tokens=16,
        target_dtype="float32",
    )
    for name, value in overrides.items():
        setattr(options, name, value)
    return options


def test_the_built_set_never_exceeds_the_bound_reported_before(lab, tmp_path):
    setdir = tmp_path / "sets" / "one"
    args = ["--target", str(lab.target_dir), "--out", str(setdir), "--layers", "1,3"]
    args += ["--block-size", "8", "--prompts", str(lab.prompts), "--max-new-tokens", "16"]
    checked = subprocess.run(
        [sys.executable, "-m", "dflash_eval", "features", *args, "--check-space"],
        cwd=REMOTE,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )
    assert checked.returncode == 0, checked.stderr
    events = [json.loads(line) for line in checked.stdout.splitlines()]
    [space] = [event for event in events if event["event"] == "space"]
    assert list(setdir.parent.iterdir()) == []  # nothing computed, nothing written

    run_features(_options(lab, setdir, target_dtype="auto"), Progress(quiet=True))
    block = max(feature_size.MIN_BLOCK, os.statvfs(setdir).f_frsize)
    used = feature_size.allocated_bytes(setdir, block) + feature_size.SET_DIRECTORIES * block
    assert used <= space["upper_bound_bytes"] <= 4 * used, (used, space)
    assert space["to_write_bytes"] == space["upper_bound_bytes"]
    assert space["prompts"] == len(lab.prompts.read_text().splitlines())
    assert space["free_bytes"] > 0 and space["path"] == str(setdir.parent)


def test_later_turns_count_the_earlier_replies(lab):
    tokenizer = load_tokenizer(lab.target_dir)
    first = Prompt("a", (("user", "abc"),))
    second = Prompt("b", (("user", "def"),), follows="a")
    alone = Prompt("b", (("user", "def"),))
    bounds = feature_size.token_bounds([first, second], tokenizer, False, 20, 8)
    [single] = feature_size.token_bounds([alone], tokenizer, False, 20, 8)
    assert bounds[1] > single + 20 + feature_size.REPLY_SLACK_TOKENS - 1
    assert bounds[0] >= 20 + 8


def test_a_set_the_disk_cannot_hold_is_refused_before_the_target_loads(lab, tmp_path):
    """A set larger than this machine's disks (5000 prompts of up to 2^20 new tokens, the
    option's bound: terabytes) against its real free space; the lab test
    (test_extract_features.py) does it on a small tmpfs."""
    setdir = tmp_path / "sets" / "huge"
    prompts = tmp_path / "many.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": f"Say {i}."}) + "\n" for i in range(5000)))
    huge = _options(lab, setdir, max_new_tokens=MAX_TOKENS, prompts=prompts)
    with pytest.raises(HarnessError, match=r"Not enough free space for feature set") as refused:
        run_features(huge, Progress(quiet=True))
    message = str(refused.value)
    assert "an upper bound" in message and "fab prune --features" in message
    assert "fewer prompts" in message
    assert not setdir.exists() and not feature_size.allocated_bytes(setdir.parent, 4096)
