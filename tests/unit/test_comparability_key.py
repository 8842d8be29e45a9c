"""The comparability key's short name (reading.key_id): one hash of exactly the settings in
reading.COMPARABILITY, computed from a results file; in compare's records, the export, the
report and the watch's webhook; stable as runs are added, unlike the groups' display
numbers, so `compare --group KEY` picks the same runs however many are added. The guide's
pandas recipe, run on an export that holds runs which may not be compared, gives only
numbers that some run produced."""

from __future__ import annotations

import copy
import csv
import hashlib
import io
import json
import re
from pathlib import Path

import pytest
from click.testing import CliRunner
from dflash_eval.contract import reading
from dflash_eval.contract.summary import summary_lines
from dflash_eval.walk.by_dataset import intervals

from dflash_ops.core.errors import OpsError
from dflash_ops.evaluation import compare_rows, results
from dflash_ops.evaluation.watch import results_news
from dflash_ops.evaluation.webhook import chat_text
from dflash_ops.ui import cli, report, report_facts
from dflash_ops.ui.compare_commands import export_results, show_comparison
from dflash_ops.ui.compare_view import group_records
from tests.schema_samples import results_dict, sampled_results_dict
from tests.unit.test_report import per_prompt

GUIDE = Path(__file__).resolve().parents[2] / "docs" / "guide.md"


def pull(root: Path, run_id: str, step: int, tau: float | None = None, **changes) -> Path:
    """A pulled run `run_id` of `step` (τ macro `tau`, with per-set intervals around it when
    given), its results' blocks updated with `changes`."""
    outcome = results_dict(reference=True)
    outcome["checkpoint"]["step"] = step
    if tau is not None:
        outcome["per_prompt"] = per_prompt(tau, seed=step)
        outcome["by_dataset"] = intervals(outcome["per_prompt"], ["4", "8"], resamples=200)
        outcome["metrics"]["tau_macro"] = outcome["by_dataset"]["overall"]["tau_macro"]["value"]
    for block, values in changes.items():
        outcome[block].update(values)
    directory = root / run_id
    directory.mkdir(parents=True)
    run = {"run_id": run_id, "host": "eval", "state": "succeeded", "step": step}
    (directory / "run.json").write_text(json.dumps({**run, "started": len(list(root.iterdir()))}))
    (directory / "results.json").write_text(json.dumps(outcome))
    return directory


# --- the key itself ------------------------------------------------------------------------


def test_the_key_is_a_short_name_fixed_by_its_settings_alone():
    key = reading.comparability_key(results_dict())
    name = reading.key_id(key)
    assert re.fullmatch(r"k[0-9a-f]{8}", name)
    assert reading.key_id(dict(reversed(key.items()))) == name  # the order does not count
    assert reading.key_id(copy.deepcopy(key)) == name
    # the same name in any process, on any machine: sha256 of the sorted JSON
    text = b'{"block size": 16, "max new tokens": 256}'
    assert "k" + hashlib.sha256(text).hexdigest()[:8] == "k29598840"
    assert reading.key_id({"max new tokens": 256, "block size": 16}) == "k29598840"


@pytest.mark.parametrize("name", list(reading.COMPARABILITY))
def test_a_change_in_any_deciding_setting_changes_the_key(name):
    key = reading.comparability_key(results_dict())
    changed = {**key, name: ["something", "else"]}
    assert reading.key_id(changed) != reading.key_id(key)


@pytest.mark.parametrize(
    ("block", "field", "value"),
    [
        ("prompts", "max_new_tokens", 96),
        ("prompts", "sha256", "q" * 64),
        ("target", "fingerprint", "e" * 64),
        ("target", "dtype", "bfloat16"),
        ("completions", "source", "sglang"),
        ("options", "max_blocks", 4),
        ("metrics", "block_size", 8),
        ("harness", "numerics_version", 2),
    ],
)
def test_the_key_of_a_results_file_follows_what_decides_comparability(block, field, value):
    first, second = results_dict(), results_dict()
    second[block][field] = value
    assert reading.comparability_id(first) != reading.comparability_id(second)


def test_what_does_not_decide_comparability_leaves_the_key_alone():
    first, second = results_dict(), results_dict()
    second["checkpoint"].update(step=4000, sha256="cd" * 32)
    second["metrics"]["tau_macro"] = 3.2
    second["host"]["hostname"] = "another-eval-host"
    second["harness"]["content_sha256"] = "9" * 64  # and numerics_version is that of `first`
    second["harness"]["numerics_version"] = first["harness"]["numerics_version"] = 1
    assert reading.comparability_id(first) == reading.comparability_id(second)
    # at T > 0 the seed and the Monte Carlo walks do not change what is measured
    sampled, reseeded = sampled_results_dict(seed=0), sampled_results_dict(seed=7)
    reseeded["metrics"]["sampling"]["samples"] = 50
    assert reading.comparability_id(sampled) == reading.comparability_id(reseeded)
    assert reading.comparability_id(sampled) != reading.comparability_id(first)


def test_a_setting_added_later_leaves_earlier_results_their_names():
    """A results file without a setting reads None for it: a new entry in COMPARABILITY
    does not rename every key pulled before it."""
    key = reading.comparability_key(results_dict())
    assert reading.key_id({**key, "a setting added later": None}) == reading.key_id(key)


def test_tag_and_host_are_no_part_of_the_key(tmp_path):
    pull(tmp_path, "a", 2000)
    directory = pull(tmp_path, "b", 2000)
    run = json.loads((directory / "run.json").read_text())
    (directory / "run.json").write_text(json.dumps({**run, "tag": "x", "host": "other"}))
    first, second = results.load_runs(tmp_path)
    assert first.key_id == second.key_id
    assert len(results.compare([first, second]).groups) == 1


# --- everywhere runs leave the tool ----------------------------------------------------------


def test_records_exports_and_the_report_carry_the_key_and_it_does_not_shift(tmp_path):
    root = tmp_path / "results"
    pull(root, "short-2000", 2000, prompts={"max_new_tokens": 96})
    pull(root, "long-2000", 2000, prompts={"max_new_tokens": 256})
    pull(root, "long-4000", 4000, prompts={"max_new_tokens": 256})
    before = results.compare(results.load_runs(root))
    keys = {row.run_id: row.key_id for row in before.rows}
    short, long = keys["short-2000"], keys["long-2000"]
    assert [g.id for g in before.groups] == [long, short] and short != long
    # two more 96-token runs: the 96-token group becomes group 1, its key stays its own
    pull(root, "short-4000", 4000, prompts={"max_new_tokens": 96})
    pull(root, "short-6000", 6000, prompts={"max_new_tokens": 96})
    after = results.compare(results.load_runs(root))
    assert [g.id for g in after.groups] == [short, long]
    records = {r.run_id: r.flat() for r in compare_rows.run_records(after.within())}
    assert records["short-2000"]["comparability_key"] == short
    assert [g["comparability_key"] for g in group_records(after)] == [short, long]

    path = export_results(root, root / "tidy.json")
    exported = json.loads(path.read_text())
    assert {r["run_id"]: r["comparability_key"] for r in exported} == {
        "short-2000": short, "short-4000": short, "short-6000": short,
        "long-2000": long, "long-4000": long,
    }  # fmt: skip
    assert all("group" not in row for row in exported)  # a rank that moves: not exported
    page = report.render(after)
    assert short in page and long in page
    (runs,) = [card for card in report_facts.key_numbers(after) if card["label"] == "runs"]
    assert runs["note"] == f"2 not comparable (flagged); comparability key {short}"


# --- the guide's pandas recipe ---------------------------------------------------------------


def guide_recipe() -> str:
    """The guide's pandas code block that reads the export."""
    blocks = re.findall(r"```python\n(.*?)```", GUIDE.read_text(), re.S)
    (recipe,) = [block for block in blocks if "export.csv" in block]
    return recipe


def test_the_guides_recipe_never_mixes_runs_that_may_not_be_compared(tmp_path, monkeypatch):
    """The audit's case: step 4000 at 96 tokens (τ about 1.85) and at 256 (about 3.2);
    the old `pivot_table` recipe gave their mean, a number no run produced."""
    pd = pytest.importorskip("pandas", reason="pandas is not installed here")
    root = tmp_path / "results"
    pull(root, "short-2000", 2000, 1.2, prompts={"max_new_tokens": 96})
    pull(root, "short-4000", 4000, 1.85, prompts={"max_new_tokens": 96})
    pull(root, "long-2000", 2000, 2.4, prompts={"max_new_tokens": 256})
    pull(root, "long-4000", 4000, 3.2, prompts={"max_new_tokens": 256})
    export_results(root)  # results/export.csv, where the recipe reads it
    produced = {
        (row.run_id, name): group["tau_macro"]["value"]
        for row in results.load_runs(root)
        for name, group in reading.groups(row.done).items()
    }
    monkeypatch.chdir(tmp_path)
    old = pd.read_csv("results/export.csv")
    mixed = old[old.metric == "tau_macro"].pivot_table(
        index="step", columns="prompt_set", values="value"
    )
    mean = (produced["short-4000", "gsm8k"] + produced["long-4000", "gsm8k"]) / 2
    assert mixed.loc[4000, "gsm8k"] == pytest.approx(mean)  # what the old recipe said

    namespace: dict = {}
    exec(compile(guide_recipe(), str(GUIDE), "exec"), namespace)
    tables = namespace["tables"]
    runs = {row.run_id: row for row in results.load_runs(root)}
    keys = {run_id: row.key_id for run_id, row in runs.items()}
    assert set(tables) == set(keys.values())  # one table per key
    for key, table in tables.items():
        for (step, run_id), row in table.iterrows():
            assert keys[run_id] == key and runs[run_id].step == step
            for name, value in row.items():
                assert value == pytest.approx(produced[run_id, name])
    assert not any(
        value == pytest.approx(mean) for table in tables.values() for value in table.values.flat
    )


def test_the_harness_summary_names_the_key():
    outcome = results_dict()
    line = f"Comparability key {reading.comparability_id(outcome)}: compared only with runs"
    assert any(entry.startswith(line) for entry in summary_lines(outcome))


# --- compare --group KEY ---------------------------------------------------------------------


@pytest.fixture
def two_keys(tmp_path) -> tuple[Path, str, str]:
    """Three 256-token runs (group 1) and two 96-token ones (group 2): the results and the
    two keys, long then short."""
    root = tmp_path / "results"
    for step in (2000, 4000):
        pull(root, f"short-{step}", step, prompts={"max_new_tokens": 96})
    for step in (2000, 4000, 6000):
        pull(root, f"long-{step}", step, prompts={"max_new_tokens": 256})
    ids = {row.run_id: row.key_id for row in results.load_runs(root)}
    return root, ids["long-2000"], ids["short-2000"]


SHORT_RUNS = {"short-2000", "short-4000"}


def test_group_by_key_or_its_start_compares_that_keys_runs_in_every_format(two_keys, capsys):
    root, _, short = two_keys
    for typed in (short, short[:4].upper()):  # the whole name, or its start in any case
        show_comparison(root, group=typed, fmt="json")
        document = json.loads(capsys.readouterr().out)
        assert {run["run_id"] for run in document["runs"]} == SHORT_RUNS
        assert {run["comparability_key"] for run in document["runs"]} == {short}
        assert {row["run_id"] for row in document["per_set"]} == SHORT_RUNS
    show_comparison(root, group=short, fmt="csv")
    assert {row["run_id"] for row in csv.DictReader(io.StringIO(capsys.readouterr().out))} == (
        SHORT_RUNS
    )
    for wide in (False, True):
        show_comparison(root, group=short, wide=wide, samples=True)
        table = capsys.readouterr().out
        assert f"comparability key {short}: group 2 of 2, 2 run(s)" in table
        assert "short-4000 (step 4000):" in table and "long-2000 (step" not in table
    compared = show_comparison(root, group=short, with_report=True)
    assert {row.run_id for row in compared.rows} == SHORT_RUNS  # what --plots draws
    (runs,) = [c for c in report_facts.key_numbers(compared) if c["label"] == "runs"]
    assert runs["note"].endswith(f"comparability key {short}")
    assert f"comparability key {short}" in (root / report.REPORT_NAME).read_text()


def test_the_results_cli_takes_a_key_too(two_keys):
    root, long, _ = two_keys
    args = ["results", "compare", "--results", str(root), "--format", "json", "--group", long]
    answer = CliRunner().invoke(cli.main, args)
    assert answer.exit_code == 0, answer.output
    runs = json.loads(answer.stdout)["runs"]
    assert {run["run_id"] for run in runs} == {"long-2000", "long-4000", "long-6000"}


@pytest.mark.parametrize(
    ("typed", "expected"),
    [
        ("kzz", "--group kzz: no comparability key of the selected runs starts so; their keys: "
         "{long} (3 run(s)), {short} (2 run(s))"),
        ("k", "--group k: 2 keys start so ({long} (3 run(s)), {short} (2 run(s))); type more"),
        ("3", "--group 3: the selected runs form 2 comparability group(s); pass 1 to 2"),
        ("x1", "--group 'x1': expected a group's number (1 = the largest; compare lists them) "
         "or its comparability key (k3f9a1b2c, or its first digits)"),
    ],
)  # fmt: skip
def test_a_key_no_group_has_is_one_line_listing_the_keys_and_their_runs(two_keys, typed, expected):
    root, long, short = two_keys
    with pytest.raises(OpsError) as refused:
        show_comparison(root, group=typed)
    assert str(refused.value).startswith(expected.format(long=long, short=short))
    assert "\n" not in str(refused.value)


def test_the_watch_webhook_payload_names_the_key_and_its_settings():
    outcome = sampled_results_dict()
    news = results_news(outcome)
    assert news["comparability_key"] == reading.comparability_id(outcome)
    assert news["comparability"]["max new tokens"] == outcome["prompts"]["max_new_tokens"]
    assert news["comparability"]["sampling"] == list(reading.sampling_settings(outcome["metrics"]))
    assert json.loads(json.dumps(news)) == news  # posted as JSON as it is
    line = chat_text({"source": "dflash-ops watch", "step": 4000, "event": "evaluated", **news})
    assert line.startswith("dflash-ops watch: step 4000 evaluated: τ ")
    assert line.endswith(f"(comparability key {news['comparability_key']})")
