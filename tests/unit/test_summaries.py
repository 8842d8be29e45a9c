"""Summaries people can act on: the line a run, a sweep's step and a watch's step end with
(evaluation.verdict: τ [CI], the change from the previous comparable step, beyond noise or
not, the ratio to the reference, the key); the warning before a run that will not be
comparable, naming the group it joins or why it stands apart; a sweep's lines fitting a
screen; wording as the glossary has it."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from dflash_eval.contract.reading import format_interval, overall_interval

from dflash_ops.evaluation import results
from dflash_ops.evaluation.foresee import comparability_warning
from dflash_ops.evaluation.harness_options import harness_args
from dflash_ops.evaluation.request import EvalRequest
from dflash_ops.evaluation.run_listing import Run
from dflash_ops.evaluation.verdict import closing_line, verdict, verdicts
from dflash_ops.evaluation.watch import PassOutcome
from dflash_ops.ui import compare_view, eval_view
from dflash_ops.ui.watch_view import WatchView
from tests.schema_samples import comparable_results, sampled_results_dict
from tests.unit.test_comparability_key import pull

README = Path(__file__).resolve().parents[2] / "README.md"


def succeeded(run_id: str, step: int) -> Run:
    return Run(run_id, "eval", "succeeded", 0, {"step": step}, 1.0)


@pytest.fixture
def pulled(tmp_path) -> Path:
    """Steps 2000 → 4000 apart, 4000 → 6000 within the noise, all of one key; a 96-token
    run of step 5000 of another key between them."""
    root = tmp_path / "results"
    pull(root, "r2000", 2000, 2.0)
    pull(root, "r4000", 4000, 3.0)
    pull(root, "short5000", 5000, 1.5, prompts={"max_new_tokens": 96})
    pull(root, "r6000", 6000, 3.05)
    return root


def test_a_run_ends_with_tau_its_interval_the_change_the_reference_and_the_key(pulled):
    runs = {row.run_id: row for row in results.load_runs(pulled)}
    line = verdict(list(runs.values()), runs["r4000"])
    tau = format_interval(overall_interval(runs["r4000"].done))
    change = runs["r4000"].metrics["tau_macro"] - runs["r2000"].metrics["tau_macro"]
    assert line == (
        f"τ {tau}, {change:+.3f} vs step 2000 (beyond noise), 0.50× reference, "
        f"key {runs['r4000'].key_id}"
    )
    # the previous comparable step of 6000 is 4000, not the 96-token run of 5000
    assert "vs step 4000 (within noise)" in verdict(runs.values(), runs["r6000"])
    assert "first comparable step" in verdict(runs.values(), runs["short5000"])
    assert "first comparable step" in verdict(runs.values(), runs["r2000"])


def test_a_run_without_reference_or_interval_says_so(tmp_path, capsys):
    root = tmp_path / "results"
    directory = pull(root, "old", 2000)
    outcome = json.loads((directory / "results.json").read_text())
    outcome.update(reference=None, comparison=None)
    (directory / "results.json").write_text(json.dumps(outcome))
    (line,) = verdicts(root, ["old"]).values()
    assert line.startswith("τ 1.500 [no CI], first comparable step, no reference, key k")
    eval_view.console.print(closing_line(root, "old"))  # as a run's reporter says it
    assert capsys.readouterr().out.strip() == f"step 2000: {line}"  # brackets kept as text
    assert closing_line(root, "missing") is None


def test_a_sweep_and_a_watch_pass_end_with_each_steps_verdict(pulled, capsys):
    found = verdicts(pulled, ["r4000", "r6000"])
    line = eval_view.step_line(4000, succeeded("r4000", 4000), found)
    assert line == f"step 4000: {found['r4000']} on eval (run r4000)"
    view = WatchView(pulled)
    view.ended[6000] = succeeded("r6000", 6000)
    view.pass_done(PassOutcome(number=1, evaluated=[6000]), None)
    out = " ".join(capsys.readouterr().out.split())
    assert f"step 6000: {found['r6000']} on eval (run r6000)" in out


def test_a_sweep_of_three_steps_fits_a_screen(capsys):
    """What each host's view prints of a run as the harness reports it: three loading
    messages, four phases of 32 prompts counted one by one, a warning, the end."""
    for step in (2000, 4000, 6000):
        view = eval_view.PrefixedView("eval")
        view.say(f"eval: run r{step} started (setsid) in /eval/runs/r{step}")
        on_event = view.follow(f"r{step}")
        for what in ("target /models/t", "drafter /eval/ckpt", "reference drafter /models/r"):
            on_event({"event": "status", "message": f"Loading {what} …"})
        for phase in ("completions", "hidden_states", "drafter", "reference_drafter"):
            for done in range(33):
                on_event({"event": "progress", "phase": phase, "done": done, "total": 32})
        on_event({"event": "warning", "message": "block size 8 differs from the trained 16"})
        view.finished(succeeded(f"r{step}", step), ["step …", "more"], Path("/results"))
        view.say(f"step {step}: τ 1.849 [1.739, 1.955], +0.814 vs step …")
        eval_view.console.print(eval_view.step_line(step, succeeded(f"r{step}", step)))
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) <= 40, "\n".join(lines)
    assert sum("│ drafter: 32/32 done" in line for line in lines) == 3  # each phase once a run


def test_the_warning_names_the_group_a_run_joins(tmp_path):
    for run_id, tokens in (("a", 256), ("b", 256), ("c", 96)):
        directory = tmp_path / run_id
        directory.mkdir()
        outcome = comparable_results()
        outcome["prompts"]["max_new_tokens"] = tokens
        (directory / "run.json").write_text(json.dumps({"run_id": run_id, "step": 2000}))
        (directory / "results.json").write_text(json.dumps(outcome))
    groups = results.compare(results.load_runs(tmp_path)).groups
    short = EvalRequest(step=4000, harness_args=harness_args({"max_new_tokens": "96"}))
    warning = comparability_warning(tmp_path, short)
    assert warning.startswith(
        f"this run will not be comparable with the 2 pulled run(s) of comparability group 1 "
        f"(key {groups[0].id}: max new tokens 96 vs 256); it joins comparability group 2 "
        f"(key {groups[1].id}, 1 run(s), step(s) 2000)"
    )
    assert "of its own" not in warning
    other = EvalRequest(step=4000, harness_args=harness_args({"max_new_tokens": "64"}))
    assert comparability_warning(tmp_path, other).endswith(
        "it will stand apart, a new comparability group: no pulled run has its max new tokens"
    )


def test_compares_title_defines_tau_as_the_glossary_does():
    glossary = re.search(r"\*\*τ \(tau\)\*\*.*?\n- \*\*", README.read_text(), re.S).group(0)
    assert "(accepted + 1)" in glossary
    assert "accepted + 1" in compare_view.TITLE
    assert "accepted tokens per round" not in compare_view.TITLE


def test_compare_names_the_key_of_the_runs_it_shows(pulled):
    comparison = results.compare(results.load_runs(pulled))
    line = compare_view.key_line(comparison)
    assert line == f"comparability key {comparison.group.id}: group 1 of 2, 3 run(s)"
    (other,) = results.group_lines(comparison)
    assert other.endswith(f"; compare them with --group 2 (key {comparison.others()[0].id})")


def test_a_sampled_run_is_foreseen_comparable_with_sampled_runs_alike(tmp_path):
    """At T > 0 the completions are sampled (`local-sampled`) and the sampling settings are
    part of the key: a run like the pulled ones is not warned about, another T is."""
    directory = tmp_path / "sampled"
    directory.mkdir()
    outcome = comparable_results()
    outcome["completions"]["source"] = "local-sampled"
    outcome["metrics"]["sampling"] = sampled_results_dict(0.7)["metrics"]["sampling"]
    outcome["metrics"]["sampling"].update(top_p=1.0, top_k=0)
    (directory / "run.json").write_text(json.dumps({"run_id": "sampled", "step": 2000}))
    (directory / "results.json").write_text(json.dumps(outcome))
    alike = EvalRequest(step=4000, harness_args=harness_args({"temperature": "0.7"}))
    assert comparability_warning(tmp_path, alike) is None
    hotter = EvalRequest(step=4000, harness_args=harness_args({"temperature": "1.0"}))
    warning = comparability_warning(tmp_path, hotter)
    assert "(key k" in warning and "sampling T 1, top-p 1, top-k 0 vs T 0.7, top-p 1, top-k 0" in (
        warning
    )
    greedy = comparability_warning(tmp_path, EvalRequest(step=4000))
    assert "sampling greedy (T 0) vs T 0.7" in greedy and "completions" in greedy
