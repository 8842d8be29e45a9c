"""Hostile and careless input (issue 14): nothing it names ever runs, and each gets one line."""

from __future__ import annotations

import pytest
import yaml

from dflash_ops.core.errors import HostError
from dflash_ops.core.inventory import load
from dflash_ops.remote import probes
from dflash_ops.remote.connection import Host

INJECTED = "10.0.0.6/22;touch {marker};echo "


def changed_inventory(lab, tmp_path, host: str, key: str, value) -> str:
    """The lab's inventory with hosts.HOST.KEY set to `value`, written beside the test."""
    document = yaml.safe_load(lab.inventory_path.read_text())
    document["hosts"][host][key] = value
    changed = tmp_path / "inventory.yaml"
    changed.write_text(yaml.safe_dump(document))
    return changed


def test_an_injected_eval_address_is_refused_before_anything_runs(lab, fab, tmp_path):
    marker = tmp_path / "injected"
    hostile = changed_inventory(lab, tmp_path, "eval", "address", INJECTED.format(marker=marker))
    result = fab(hostile, "check-hosts", "-v")
    assert result.returncode == 1
    assert "hosts.eval.address: expected a host name" in result.stderr
    assert "Traceback" not in result.stderr
    assert not marker.exists()


def test_the_reachability_probe_quotes_the_address_on_the_trainer(inventory, tmp_path):
    """Validation aside, the address reaches the trainer's shell only quoted."""
    marker = tmp_path / "injected"
    probe = probes.tcp_reachable(INJECTED.format(marker=marker), 22, timeout=1)
    trainer = Host(inventory, "trainer")
    try:
        assert trainer.probe(probe) is False
    finally:
        trainer.close()
    assert not marker.exists()


def test_the_lab_inventory_addresses_still_load(lab):
    assert load(lab.inventory_path).eval_hosts["eval"].address


@pytest.mark.parametrize(
    "layout",
    ["step_{0}/checkpoint.pt", "ckpt.pt", "step_{step}/{run}.pt", "step_{step}_{step}.pt", "a{b"],
)
def test_a_layout_without_exactly_one_step_placeholder_is_one_line(lab, fab, tmp_path, layout):
    broken = changed_inventory(lab, tmp_path, "trainer", "layout", layout)
    result = fab(broken, "list-checkpoints")
    assert result.returncode == 1
    assert "hosts.trainer.layout: expected a path with {step} exactly once" in result.stderr
    assert "Traceback" not in result.stderr


def test_a_duplicate_key_in_the_inventory_is_refused(lab, fab, tmp_path):
    text = lab.inventory_path.read_text()
    eval_block = text[text.index("  eval:") : text.index("local:")]
    broken = tmp_path / "inventory.yaml"
    broken.write_text(text.replace(eval_block, eval_block + eval_block.replace("eval:", "eval:")))
    result = fab(broken, "check-hosts", "-v")
    assert result.returncode == 1
    assert "duplicate key 'eval' (first at line" in result.stderr
    assert "Traceback" not in result.stderr


def test_an_inventory_that_is_not_utf8_is_one_line(lab, fab, tmp_path):
    broken = tmp_path / "inventory.yaml"
    broken.write_bytes(lab.inventory_path.read_bytes().replace(b"trainer:", b"tr\xe4iner:", 1))
    result = fab(broken, "check-hosts", "-v")
    assert result.returncode == 1
    assert "expected UTF-8 text, found the byte 0xe4" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize(
    ("task", "flag", "value"),
    [
        ("stage-checkpoint", "--step", "abc"),
        ("stage-checkpoint", "--step", "4000;id"),
        ("run-eval", "--step", "-1"),
        ("run-eval", "--max-new-tokens", "12x"),
        ("run-eval", "--threads", "0"),
    ],
)
def test_a_bad_number_on_the_command_line_is_one_line(lab, fab, task, flag, value):
    result = fab(lab.inventory_path, task, flag, value)
    assert result.returncode == 1
    assert f"{flag}: expected a whole number" in result.stderr and repr(value) in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize(
    ("drafter", "expected"),
    [
        ({"dtype": "fp16"}, "hosts.trainer.drafter.dtype: expected 'float32' or 'bfloat16'"),
        ({"blocksize": 16}, "hosts.trainer.drafter.blocksize: unknown key (did you mean"),
        ({"mask_token_id": -1}, "hosts.trainer.drafter.mask_token_id: expected greater than"),
    ],
)
def test_a_careless_drafter_profile_is_one_line(lab, fab, tmp_path, drafter, expected):
    broken = changed_inventory(lab, tmp_path, "trainer", "drafter", drafter)
    result = fab(broken, "check-hosts", "-v")
    assert result.returncode == 1
    assert expected in result.stderr, result.stderr


def test_an_upload_to_a_full_disk_leaves_nothing_and_says_so(make_lab):
    """What run-eval does with --prompts and the other files it sends: on a full disk, one
    clear error and no empty file left behind."""
    lab = make_lab(steps=(2000,), eval_disk="16m")
    inventory = load(lab.inventory_path)
    host = Host(inventory, "eval")
    disk = lab.data_dir("eval")
    filler = disk / "filler"
    try:
        host.run(f"dd if=/dev/zero of={filler} bs=1M count=64 2>/dev/null; true")
        target = f"{disk}/prompts.jsonl"
        with pytest.raises(HostError, match=r"eval: writing .*prompts\.jsonl \(2\.0 MiB\) failed"):
            host.upload(b"x" * (2 << 20), target)
        assert not host.run(f"test -e {target}", check=False).ok
    finally:
        filler.unlink(missing_ok=True)
        host.close()


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (
            ["stage-checkpoint", "--step", "2000", "--bwlimit", "1e400"],
            "--bwlimit: not a bandwidth",
        ),
        (["stage-checkpoint", "--step", "2000", "--margin", "inf"], "--margin: not a size: 'inf'"),
        (["run-eval", "--step", "2000", "--bwlimit", "nan"], "--bwlimit: not a bandwidth: 'nan'"),
        (["watch", "--interval", "1" + "0" * 400 + "s"], "--interval: expected a finite number"),
        (
            ["run-eval", "--step", "1e400"],
            "--step: expected a whole number from 0 to 1000000000, found '1e400'",
        ),
    ],
)
def test_a_number_beyond_any_bound_is_one_line(lab, fab, argv, expected):
    """Each of these was an OverflowError traceback (float('inf') into int())."""
    result = fab(lab.inventory_path, *argv)
    assert result.returncode == 1
    assert expected in result.stderr, result.stderr
    assert "Traceback" not in result.stderr


def test_a_prompts_file_that_is_not_utf8_is_refused_before_anything_moves(lab, fab, tmp_path):
    """It was staged, uploaded and launched, then a traceback on the eval host."""
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_bytes(b'{"id": "a", "prompt": "caf\xe9"}\n')
    eval_disk = lab.data_dir("eval")
    before = sorted(str(p) for p in eval_disk.rglob("*"))
    result = fab(lab.inventory_path, "run-eval", "--step", "2000", "--prompts", str(prompts))
    assert result.returncode == 1
    assert f"--prompts {prompts}: line 1: not UTF-8 text (the byte 0xe9)" in result.stderr
    assert "Traceback" not in result.stderr
    assert sorted(str(p) for p in eval_disk.rglob("*")) == before  # nothing staged or sent
