"""What compare, eval-status, list-checkpoints and export print or write: tables that fit 80
and 120 columns (every line within the width, the key columns there), JSON and CSV read back,
the tidy export, short run ids, progress bars at 80 columns, and the run-eval checks made
before anything is staged (exclusive step flags, dtype aliases, comparability warnings)."""

from __future__ import annotations

import csv
import io
import json
import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from click.testing import CliRunner
from dflash_eval.contract.dtypes import dtype_name
from dflash_eval.contract.options import BY_NAME, help_text
from dflash_eval.contract.parser import build_parser
from rich.console import Console

from dflash_ops.core.arguments import one_of
from dflash_ops.core.errors import OpsError
from dflash_ops.evaluation import jobs, results, run_ids, run_listing
from dflash_ops.evaluation.foresee import comparability_warning
from dflash_ops.evaluation.harness_options import harness_args
from dflash_ops.evaluation.request import EvalRequest
from dflash_ops.staging.relay import RelayState
from dflash_ops.ui import cli, eval_view
from dflash_ops.ui.compare_commands import export_results, show_comparison
from dflash_ops.ui.compare_view import print_comparison
from dflash_ops.ui.eval_view import (
    LiveView,
    phase_bars,
    show_runs,
    status_records,
    step_line,
)
from dflash_ops.ui.staging_view import short_label, transfer_bars
from tests.schema_samples import comparable_results, results_dict
from tests.unit.test_report import pull as pull_with_sets

STAMPS = {2000: "20261201-120301", 4000: "20261201-120355", 6000: "20261202-093012"}


@pytest.fixture
def pulled(tmp_path) -> Path:
    """Three runs of training run v4 as fetch-results names them, with per-set intervals."""
    root = tmp_path / "results"
    for step, level, tail in ((2000, 2.0, "a1b2"), (4000, 3.0, "c3d4"), (6000, 3.05, "e5f6")):
        pull_with_sets(root, step, level, checkpoint={"training_run": "v4"})
        run_id = f"{STAMPS[step]}-v4-step{step}-eval-{tail}"
        (root / f"run-{step}").rename(root / run_id)
        run_file = root / run_id / "run.json"
        run_file.write_text(json.dumps({**json.loads(run_file.read_text()), "run_id": run_id}))
    return root


def rendered(width: int, show) -> list[str]:
    """The lines `show(console)` prints on a terminal `width` columns wide."""
    out = io.StringIO()
    show(Console(file=out, width=width, force_terminal=True, color_system=None))
    plain = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", out.getvalue())  # cursor moves of live bars
    return [part for line in plain.splitlines() for part in line.split("\r")]


@pytest.mark.parametrize("width", [80, 120])
def test_the_compact_comparison_fits_the_terminal(pulled, width):
    comparison = results.compare(results.load_runs(pulled))
    lines = rendered(width, lambda on: print_comparison(comparison, "table", False, on))
    assert max(len(line) for line in lines) <= width
    text = "\n".join(lines)
    for column in ("step", "id", "τ [95% CI]", "best tree", "acc@1", "prompt set"):
        assert column in text
    for short in ("a1b2", "c3d4", "e5f6"):
        assert short in text
    assert re.search(r"6000 .*e5f6 .*\d\.\d{3} \[\d\.\d{3}, \d\.\d{3}\]", text)
    if width == 120:  # complete: nothing left out
        assert "not shown at this width" not in text and "host" in text and "v4" in text


def test_the_wide_comparison_has_every_column_and_still_fits(pulled):
    comparison = results.compare(results.load_runs(pulled))
    lines = rendered(80, lambda on: print_comparison(comparison, "table", True, on))
    assert max(len(line) for line in lines) <= 80  # wrapped cells, not lost columns
    text = "\n".join(rendered(250, lambda on: print_comparison(comparison, "table", True, on)))
    for column in ("τ pooled", "tree-4", "tree-8", "acc@2", "training run", "comparable"):
        assert column in text
    assert "tau_pooled" in text and "acc_2" in text  # the per-set table: every metric


def test_compare_as_json_csv_and_markdown_reads_back(pulled, capsys):
    show_comparison(pulled, fmt="json", plots=pulled / "plots", with_report=True)
    captured = capsys.readouterr()
    document = json.loads(captured.out)
    assert [run["step"] for run in document["runs"]] == [2000, 4000, 6000]
    assert document["runs"][0]["tau_macro_low"] < document["runs"][0]["tau_macro"]
    key = document["runs"][0]["comparability_key"]
    assert document["groups"] == [
        {"group": 1, "comparability_key": key, "compared": True,
         "runs": [r["run_id"] for r in document["runs"]], "differs": []},
    ]  # fmt: skip
    assert {run["comparability_key"] for run in document["runs"]} == {key}
    assert {r["prompt_set"] for r in document["per_set"]} == {"all prompts", "gsm8k", "humaneval"}
    assert "report: " in captured.err and "report: " not in captured.out

    show_comparison(pulled, fmt="csv", plots=pulled / "plots")
    rows = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    assert [row["short_id"] for row in rows] == ["a1b2", "c3d4", "e5f6"]
    assert float(rows[1]["tree_8"]) == 1.75 and float(rows[1]["tau_macro"]) > 2.5

    show_comparison(pulled, fmt="markdown", plots=pulled / "plots")
    markdown = capsys.readouterr().out.splitlines()
    assert markdown[0].startswith("| step |") and markdown[1].startswith("|---:|")


def test_dflash_ops_results_compare_and_export(pulled, tmp_path):
    runner = CliRunner()
    listed = runner.invoke(
        cli.main, ["results", "compare", "--results", str(pulled), "--format", "json"]
    )
    assert listed.exit_code == 0, listed.output
    assert len(json.loads(listed.stdout)["runs"]) == 3
    out = tmp_path / "tidy.csv"
    exported = runner.invoke(
        cli.main, ["results", "export", "--results", str(pulled), "--out", str(out)]
    )
    assert exported.exit_code == 0, exported.output
    rows = list(csv.DictReader(out.open()))
    # 3 runs × 3 sets (all prompts, gsm8k, humaneval) × 6 metrics (τ ×2, tree-4/8, acc@1/2)
    assert len(rows) == 3 * 3 * 6
    gsm8k = [r for r in rows if r["prompt_set"] == "gsm8k" and r["metric"] == "tau_macro"]
    assert [int(r["step"]) for r in gsm8k] == [2000, 4000, 6000]
    assert all(float(r["low"]) <= float(r["value"]) <= float(r["high"]) for r in gsm8k)
    refused = runner.invoke(
        cli.main, ["results", "export", "--results", str(pulled), "--out", str(tmp_path / "x")]
    )
    assert refused.exit_code == 1 and "expected a .csv or .json file name" in refused.output


def test_an_export_covers_runs_from_before_intervals(tmp_path):
    directory = tmp_path / "old"
    directory.mkdir()
    (directory / "run.json").write_text(json.dumps({"run_id": "old", "step": 2000}))
    (directory / "results.json").write_text(json.dumps(results_dict()))
    path = export_results(tmp_path, tmp_path / "tidy.json")
    records = json.loads(path.read_text())
    assert {(r["prompt_set"], r["metric"], r["value"], r["low"]) for r in records} >= {
        ("all prompts", "tau_macro", 1.5, None),
        ("all prompts", "tree_4", 1.75, None),
    }


def test_an_odd_run_gets_a_group_of_its_own_and_is_named(pulled, capsys):
    pull_with_sets(pulled, 8000, 3.5, prompts={"max_new_tokens": 48})
    comparison = show_comparison(pulled, plots=pulled / "plots", with_report=True)
    assert [row.step for row in comparison.rows] == [2000, 4000, 6000]  # the largest group
    out = " ".join(capsys.readouterr().out.split())
    assert "group 2: 1 run(s) (step 8000 run-8000) differ in max new tokens" in out
    assert "--group 2" in out
    report = (pulled / "report.html").read_text()
    assert "run-8000" in report and "differ from comparability group 1 (3 run(s))" in report
    second = show_comparison(pulled, group=2, plots=pulled / "plots")
    assert [row.step for row in second.rows] == [8000]


# --- run ids, eval-status ------------------------------------------------------------------


def test_short_ids_and_any_unique_part_name_a_run():
    ids = [
        "20261201-120301-step2000-eval-a1b2",
        "20261201-120355-step4000-eval-c3d4",
        "20261201-130000-step4000-eval2-a1b2",  # the same tail: both show whole
        "pulled-elsewhere",
    ]
    short = run_ids.short_ids(ids)
    assert short[ids[1]] == "c3d4" and short[ids[0]] == ids[0] and short[ids[3]] == ids[3]
    assert run_ids.match(ids, "c3d4") == ids[1]
    assert run_ids.match(ids, "step2000") == ids[0]
    assert run_ids.match(ids, ids[2]) == ids[2]
    with pytest.raises(run_ids.RunIdError, match="part of several run ids"):
        run_ids.match(ids, "a1b2")
    with pytest.raises(run_ids.RunIdError, match="no run id contains 'zzzz'"):
        run_ids.match(ids, "zzzz")


def listing(run_id: str, started: float, state: str, last: dict | None) -> str:
    code, harness = ("0", "gone 42") if state == "succeeded" else ("-", "live 42")
    results_file = "yes" if state == "succeeded" else "no"
    params = json.dumps({"step": int(run_id.split("step")[1].split("-")[0]), "started": started})
    event = json.dumps(last) if last else "-"
    fields = [run_id, code, harness, "gone 41", results_file, "-", event, "-", params]
    return "\t".join(fields) + "\0"


def test_eval_status_is_newest_first_with_progress_and_tau_and_fits_80_columns():
    output = "".join(
        [
            listing(
                "20261201-120301-step2000-eval-a1b2",
                1000.0,
                "succeeded",
                {"event": "done", "summary": {"tau_macro": 3.21}},
            ),
            listing(
                "20261201-120355-step4000-eval-c3d4",
                2000.0,
                "running",
                {"event": "progress", "phase": "drafter", "done": 12, "total": 40},
            ),
        ]
    )
    runs = run_listing.parse_runs("eval", output, now=2100.0)
    records = status_records(runs, now=2100.0)
    assert [r["short_id"] for r in records] == ["c3d4", "a1b2"]
    assert records[0]["progress"] == "drafter 12/40" and records[1]["tau_macro"] == 3.21
    lines = rendered(80, lambda on: _show_runs_on(on, runs))
    assert max(len(line) for line in lines) <= 80
    text = "\n".join(lines)
    assert "drafter 12/40" in text and "τ 3.210" in text and "c3d4" in text


def _show_runs_on(on: Console, runs: list[jobs.Run]) -> None:
    with printing_on(on):
        show_runs(runs, "table", False)


@contextmanager
def printing_on(on: Console) -> Iterator[None]:
    """eval_view's output on `on` meanwhile (it prints on the shared console)."""
    saved, eval_view.console = eval_view.console, on
    try:
        yield
    finally:
        eval_view.console = saved


def test_a_sweep_ends_with_one_line_per_step():
    run = run_listing.parse_runs(
        "eval",
        listing(
            "20261201-120301-step2000-eval-a1b2",
            1.0,
            "succeeded",
            {"event": "done", "summary": {"tau_macro": 2.5}},
        ),
    )[0]
    assert step_line(2000, run) == (
        "step 2000: τ 2.500 on eval (run 20261201-120301-step2000-eval-a1b2)"
    )
    assert step_line(4000, OpsError("no space\nmore")) == "step 4000: [red]failed[/]: no space"
    assert step_line(6000, "given up (see above)") == "step 6000: given up (see above)"


# --- progress at 80 columns ----------------------------------------------------------------


def test_transfer_bars_show_rate_and_time_left_at_80_columns():
    label = "eval:/srv/a/very/long/staging/directory/checkpoints/v4/step_4000/checkpoint.pt"
    assert short_label(label) == "…step_4000/checkpoint.pt"  # 24 characters
    assert short_label("eval:/x/step_2/model.pt") == "eval:step_2/model.pt"

    def show(on: Console) -> None:
        with transfer_bars(on) as factory:
            advance = factory(label, 64 * 2**20)
            advance(RelayState(16 * 2**20, 64 * 2**20, None, None))  # type: ignore[arg-type]

    lines = rendered(80, show)
    assert max(len(line) for line in lines) <= 80
    bar = [line for line in lines if "MiB" in line][-1]  # the last frame
    assert "step_4000/checkpoint.pt" in bar and "16.0/64.0 MiB" in bar
    assert re.search(r"(\d:\d\d:\d\d|-:--:--)", bar)  # time left


def test_phase_bars_show_time_left_at_80_columns():
    def show(on: Console) -> None:
        with phase_bars(on) as progress:
            task = progress.add_task("target hidden states", total=40)
            progress.update(task, completed=12)

    lines = rendered(80, show)
    assert max(len(line) for line in lines) <= 80
    bar = [line for line in lines if "12/40" in line][-1]
    assert "target hidden states" in bar and "left" in bar


def test_a_run_shows_what_loads_then_its_phases_then_three_lines(tmp_path):
    run = run_listing.parse_runs(
        "eval", listing("20261201-120301-step2000-eval-a1b2", 1.0, "succeeded", None)
    )[0]
    summary = ["step 2000  τ macro 3.210  τ pooled 3.100", "DDTree τ: b=4: 3.900", "more"]

    def show(on: Console) -> None:
        with printing_on(on):
            view = LiveView()
            on_event = view.follow(run.run_id)
            on_event({"event": "status", "message": "Loading target /models/Qwen3-27B (bf16) …"})
            on_event({"event": "progress", "phase": "drafter", "done": 3, "total": 10})
            view.finished(run, summary, tmp_path)

    lines = [line.rstrip() for line in rendered(1000, show) if line.strip()]  # paths unwrapped
    assert "Loading target /models/Qwen3-27B (bf16) …" in lines
    assert any("drafter" in line and "3/10" in line for line in lines)
    end = lines[[i for i, line in enumerate(lines) if "succeeded" in line][-1] :]
    assert end == [
        "run 20261201-120301-step2000-eval-a1b2 succeeded (exit code 0)",
        "  step 2000  τ macro 3.210  τ pooled 3.100",
        f"results pulled to {tmp_path}; -v for the whole summary",
    ]


# --- run-eval's checks before anything is staged -------------------------------------------


def test_step_flags_exclude_each_other_in_one_line():
    with pytest.raises(OpsError, match=r"^--step and --steps exclude each other: pass one"):
        one_of(("--step", 4000), ("--steps", "2000"), ("--latest", False))
    one_of(("--step", 4000), ("--steps", None), ("--latest", False))  # one is fine


def test_dtype_aliases_are_normalised_on_both_sides():
    assert [dtype_name(t) for t in ("bf16", "FP32", "torch.float16", "half")] == [
        "bfloat16",
        "float32",
        "float16",
        "float16",
    ]
    assert harness_args({"dtype": "bf16", "target_dtype": "fp32"}) == [
        "--dtype",
        "bfloat16",
        "--target-dtype",
        "float32",
    ]
    with pytest.raises(OpsError, match="--dtype: expected one of float32, bfloat16, found 'f"):
        harness_args({"dtype": "fp16"})
    args = build_parser().parse_args(
        ["eval", "--checkpoint", "c", "--target", "t", "--out", "o", "--dtype", "bf16"]
    )
    assert args.dtype == "bfloat16"
    assert "bf16" in help_text(BY_NAME["target_dtype"])  # fab and argparse help say so


def test_a_run_that_will_not_be_comparable_is_named_before_it_starts(tmp_path):
    for step in (2000, 4000):
        directory = tmp_path / f"r{step}"
        directory.mkdir()
        (directory / "run.json").write_text(json.dumps({"run_id": directory.name}))
        (directory / "results.json").write_text(json.dumps(comparable_results()))
    assert comparability_warning(tmp_path, EvalRequest(step=6000)) is None
    fewer = EvalRequest(step=6000, harness_args=harness_args({"num_prompts": "4"}))
    warning = comparability_warning(tmp_path, fewer)
    assert warning.startswith("this run will not be comparable with the 2 pulled run(s)")
    assert "prompts sha256" in warning and "max new tokens" not in warning
    shorter = EvalRequest(step=6000, harness_args=harness_args({"max_new_tokens": "64"}))
    assert "max new tokens 64 vs 256" in comparability_warning(tmp_path, shorter)
    thinking = EvalRequest(step=6000, harness_args=harness_args({"thinking": "on"}))
    assert "thinking" in comparability_warning(tmp_path, thinking)
    assert comparability_warning(tmp_path / "none", fewer) is None  # nothing pulled yet


def test_fab_refuses_a_missing_step_and_mixed_step_flags_before_deploying(lab, fab):
    """The lab's eval host has no venv: a run that got as far as deploying would say so."""
    missing = fab(lab.inventory_path, "run-eval", "--step", "9999")
    assert missing.returncode == 1
    assert "no checkpoint for step 9999" in missing.stderr and "venv" not in missing.stderr
    assert "available steps: 2000, 4000, 6000" in missing.stderr
    mixed = fab(lab.inventory_path, "run-eval", "--steps", "2000", "--step", "4000")
    assert mixed.returncode == 1
    assert "--step and --steps exclude each other: pass one of them" in mixed.stderr
    assert "Traceback" not in missing.stderr + mixed.stderr


def test_prune_takes_dry_run_and_y(lab, fab):
    dry = fab(lab.inventory_path, "prune", "--dry-run")
    assert dry.returncode == 0, dry.stderr
    both = fab(lab.inventory_path, "prune", "-y", "--dry-run")
    assert both.returncode == 1
    assert "--yes and --dry-run exclude each other" in both.stderr
