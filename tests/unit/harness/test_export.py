"""`python -m dflash_eval export`: a lab checkpoint written as a Hugging Face drafter
directory, whose τ equals the checkpoint's prompt for prompt, and which replaces only its
own earlier output."""

from __future__ import annotations

import json

from dflash_eval.cli import main
from dflash_eval.contract.config_keys import TOP_LEVEL, UNDER_DFLASH_CONFIG


def _per_prompt(lab, checkpoint, tmp_path, name):
    out = tmp_path / f"{name}.json"
    argv = ["eval", "--checkpoint", str(checkpoint), "--target", str(lab.target_dir)]
    argv += ["--out", str(out), "--prompts", str(lab.prompts), "--num-prompts", "3"]
    argv += ["--max-new-tokens", "24", "--ddtree", "4", "--cache-dir", str(tmp_path / "cache")]
    assert main([*argv, "--quiet"]) == 0
    results = json.loads(out.read_text())
    return [(p["id"], p["tau"], p["tau_capped"]) for p in results["per_prompt"]]


def test_export_writes_a_published_layout_with_the_checkpoints_tau(lab, tmp_path, capsys):
    out = tmp_path / "drafter"
    argv = ["export", "--checkpoint", str(lab.checkpoints[4000]), "--target"]
    assert main([*argv, str(lab.target_dir), "--out", str(out), "--quiet"]) == 0
    assert sorted(p.name for p in out.iterdir()) == [
        "config.json",
        "dflash_export.json",
        "model.safetensors",
    ]
    config = json.loads((out / "config.json").read_text())
    assert set(config) <= set(TOP_LEVEL) and set(config["dflash_config"]) <= set(
        UNDER_DFLASH_CONFIG
    )
    assert {"target_layer_ids", "mask_token_id"} <= set(config["dflash_config"])
    assert config["architectures"] == ["DFlashDraftModel"] and config["block_size"] >= 2
    assert json.loads((out / "dflash_export.json").read_text())["step"] == 4000
    checkpoint = _per_prompt(lab, lab.checkpoints[4000], tmp_path, "checkpoint")
    assert _per_prompt(lab, out, tmp_path, "exported") == checkpoint
    assert any(tau > 1 for _, tau, _ in checkpoint)  # a trained step: the test can fail


def test_export_replaces_only_its_own_directory(lab, tmp_path, capsys):
    out = tmp_path / "drafter"
    argv = ["export", "--checkpoint", str(lab.checkpoints[2000]), "--target", str(lab.target_dir)]
    argv += ["--out", str(out), "--quiet"]
    assert main(argv) == 0
    assert main(argv) == 0  # its own earlier export: replaced
    (out / "dflash_export.json").unlink()  # now no one's record: someone else's directory
    capsys.readouterr()
    assert main(argv) == 2
    assert f"{out} exists and was not written by export" in capsys.readouterr().err
    assert (out / "config.json").is_file()  # left as it was
