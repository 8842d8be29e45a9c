"""The command line as the workstation runs it: JSON-line events, summary, exit codes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from dflash_eval.contract import reading, schema_check, summary
from dflash_eval.contract.parser import build_parser

REMOTE = Path(__file__).resolve().parents[3] / "remote"


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "dflash_eval", *args],
        cwd=REMOTE,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def test_eval_prints_events_and_summary_and_writes_results(lab, tmp_path):
    out = tmp_path / "results.json"
    result = _run(
        "eval",
        "--checkpoint",
        str(lab.checkpoints[6000]),
        "--target",
        str(lab.target_dir),
        "--out",
        str(out),
        "--prompts",
        str(lab.prompts),
        "--num-prompts",
        "3",
        "--max-new-tokens",
        "48",
        "--cache-dir",
        str(tmp_path / "cache"),
        "--threads",
        "1",
        "--progress-file",
        str(tmp_path / "progress.jsonl"),
    )
    assert result.returncode == 0, result.stderr
    events = [json.loads(line) for line in result.stdout.splitlines()]
    kinds = [event["event"] for event in events]
    assert kinds[0] == "start" and kinds[-1] == "done"
    phases = {event["phase"] for event in events if event["event"] == "progress"}
    assert phases == {"completions", "hidden_states", "drafter"}
    assert events[-1]["summary"]["step"] == 6000
    results = json.loads(out.read_text())
    assert results["schema_version"] == 3
    assert results["metrics"]["tau_macro"] == events[-1]["summary"]["tau_macro"]
    # The workstation reads this file through the same schema: every key it needs is there.
    assert events[-1]["summary"] == summary.headline(results)
    assert "\n".join(summary.summary_lines(results)) in result.stderr
    assert schema_check.parse_results(results) is results
    assert set(reading.comparability_key(results)) == set(reading.COMPARABILITY)
    assert len(results["harness"]["content_sha256"]) == 64
    assert (tmp_path / "progress.jsonl").read_text() == result.stdout


def test_expected_failure_exits_2_with_a_message_and_no_traceback(lab, tmp_path):
    missing = tmp_path / "step_9999" / "checkpoint.pt"
    result = _run(
        "eval",
        "--checkpoint",
        str(missing),
        "--target",
        str(lab.target_dir),
        "--out",
        str(tmp_path / "r.json"),
    )
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert str(missing) in result.stderr and "does not exist" in result.stderr
    last = json.loads(result.stdout.splitlines()[-1])
    assert last["event"] == "error" and str(missing) in last["message"]
    assert not (tmp_path / "r.json").exists()


def test_plan_reads_every_eval_run_flag_with_the_same_default():
    # The workstation sends plan the argv it would send eval: a default that differs between
    # the two would make the plan describe another run than the eval that follows it.
    parser = build_parser()
    evaluated = vars(
        parser.parse_args(["eval", "--checkpoint", "c", "--target", "t", "--out", "o"])
    )
    planned = vars(parser.parse_args(["plan", "--checkpoint", "c", "--target", "t"]))
    assert set(evaluated) - set(planned) == {"progress_file", "quiet"}
    assert set(planned) - set(evaluated) == {"inputs_on_stdin", "diagnose"}
    shared = set(evaluated) & set(planned) - {"command", "out"}
    assert {dest: planned[dest] for dest in shared} == {dest: evaluated[dest] for dest in shared}


def test_sampling_flags_reach_the_run_and_a_bad_one_exits_2(lab, tmp_path):
    args = ["--checkpoint", str(lab.checkpoints[6000]), "--target", str(lab.target_dir)]
    parsed = build_parser().parse_args(
        ["eval", *args, "--out", "o", "--temperature", "0.7", "--top-p", "0.9", "--top-k", "20"]
    )
    assert (parsed.temperature, parsed.top_p, parsed.top_k, parsed.seed) == (0.7, 0.9, 20, 0)
    result = _run(
        "eval", *args, "--out", str(tmp_path / "r.json"), "--temperature", "0.7", "--top-p", "2"
    )
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "--top-p: expected a finite number > 0 and ≤ 1, found '2'" in result.stderr
    assert not (tmp_path / "r.json").exists()
