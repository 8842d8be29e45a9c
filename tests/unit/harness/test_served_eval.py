"""The SGLang stand-in's DFLASH mode launched as `python -m sglang.launch_server` on loopback,
asked by the harness's `served-eval`: its served τ per prompt is the CPU harness's τ of the
same checkpoint and prompts in SGLang's count (completion tokens, the prefill's first
included, over the rounds of the zlab-07ebd93 loop)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from dflash_eval.cli import main
from dflash_eval.contract.schema_served import parse_served

ROOT = Path(__file__).resolve().parents[3]
PROMPTS = ["--num-prompts", "3", "--max-new-tokens", "24"]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture
def dflash_server(lab, tmp_path):
    """The stand-in serving the lab target with step 6000 exported; yields (URL, drafter, log)."""
    drafter, log = tmp_path / "drafter", tmp_path / "server.jsonl"
    argv = ["export", "--checkpoint", str(lab.checkpoints[6000]), "--target", str(lab.target_dir)]
    assert main([*argv, "--out", str(drafter), "--quiet"]) == 0
    block = json.loads((drafter / "config.json").read_text())["block_size"]
    port = free_port()
    path = os.pathsep.join(str(p) for p in (ROOT / "tests" / "stand_ins", ROOT / "remote", ROOT))
    env = {**os.environ, "PYTHONPATH": path, "SGLANG_STAND_IN_LOG": str(log)}
    launch = ["--model-path", str(lab.target_dir), "--speculative-algorithm", "DFLASH"]
    launch += ["--speculative-draft-model-path", str(drafter)]
    launch += ["--speculative-num-draft-tokens", str(block), "--port", str(port)]
    server = subprocess.Popen([sys.executable, "-m", "sglang.launch_server", *launch], env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                with urllib.request.urlopen(f"{url}/health", timeout=5) as answer:
                    assert answer.status == 200
                    break
            except OSError:
                assert server.poll() is None and time.monotonic() < deadline, "never healthy"
                time.sleep(0.2)
        yield url, drafter, block, log
    finally:
        server.terminate()
        server.wait(timeout=30)


def test_served_tau_is_the_cpu_tau_in_sglangs_count(lab, dflash_server, tmp_path):
    url, drafter, block, log = dflash_server
    out = tmp_path / "served.json"
    argv = ["served-eval", "--target", str(lab.target_dir), "--sglang-url", url]
    argv += ["--out", str(out), "--prompts", str(lab.prompts), *PROMPTS]
    argv += ["--num-draft-tokens", str(block), "--drafter", str(drafter), "--quiet"]
    assert main(argv) == 0
    served = parse_served(json.loads(out.read_text()))
    assert served["server"]["num_draft_tokens"] == block
    cpu_out = tmp_path / "cpu.json"
    cpu = ["eval", "--checkpoint", str(lab.checkpoints[6000]), "--target", str(lab.target_dir)]
    cpu += ["--out", str(cpu_out), "--prompts", str(lab.prompts), *PROMPTS, "--ddtree", "4"]
    assert main([*cpu, "--cache-dir", str(tmp_path / "cache"), "--quiet"]) == 0
    rows = json.loads(cpu_out.read_text())["per_prompt"]
    in_sglangs_count = [
        r["completion_tokens"] * r["tau_capped"] / (r["completion_tokens"] - 1) for r in rows
    ]
    assert [row["tau"] for row in served["per_prompt"]] == pytest.approx(in_sglangs_count)
    assert [r["completion_tokens"] for r in served["per_prompt"]] == [
        r["completion_tokens"] for r in rows
    ]
    assert served["served"]["tau_macro"]["value"] > 1  # the trained step 6000 speculates
    [launched] = [json.loads(line)["launch"] for line in log.read_text().splitlines()[:1]]
    assert launched["argv"][:2] == ["--model-path", str(lab.target_dir)]
