"""`fab run-eval --features` on a set that `fab extract-features` computed on the features host
and relayed to the eval host (the session fixture `extracted`, tests/e2e/conftest.py): it
gives the τ of an eval computing its features itself, a tampered copy is refused at use, a
copy changed together with its feature-set.json flags the run not comparable, and a set not
relayed says how to make one.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil

import pytest

from dflash_lab import lab as labs
from dflash_ops.core.inventory import load
from tests.conftest import run_fab
from tests.e2e.features_helpers import (
    DTYPE,
    MAX_NEW_TOKENS,
    digests,
    extract,
    new_results,
    said,
    set_dir,
)

pytestmark = pytest.mark.long(90)  # seconds in a cold `make test` (5 workers)

RUN_OPTIONS = ["--num-prompts", "2", "--max-new-tokens", MAX_NEW_TOKENS, "--ddtree", "4,8"]


def test_run_eval_without_a_relayed_set_says_how_to_make_one(features_lab, features_provisioned):
    done = run_fab(features_lab.inventory_path, "run-eval", "--step", "2000", "--features", "nope")
    assert done.returncode == 1
    assert "no relayed feature set 'nope'" in said(done.stderr), done.stderr
    assert "fab extract-features --to eval" in said(done.stderr), done.stderr


def test_an_eval_on_the_relayed_set_matches_one_computing_its_own(features_lab, extracted):
    inventory_path = features_lab.inventory_path
    results_root = load(inventory_path).local.results
    prompts = ["--prompts", str(features_lab.root / labs.LAB_PROMPTS)]
    before = set(results_root.glob("*/results.json"))
    relayed = run_fab(
        inventory_path, "run-eval", "--step", "2000", *RUN_OPTIONS, *prompts, *DTYPE,
        "--features", "latest", timeout=900,
    )  # fmt: skip
    assert relayed.returncode == 0, relayed.stdout + relayed.stderr
    with_set = new_results(inventory_path, before)
    before = set(results_root.glob("*/results.json"))
    local = run_fab(
        inventory_path, "run-eval", "--step", "2000", *RUN_OPTIONS, *prompts, *DTYPE,
        "--no-cache", timeout=900,
    )  # fmt: skip
    assert local.returncode == 0, local.stdout + local.stderr
    computed = new_results(inventory_path, before)

    features = with_set["features"]
    assert features["host"] == "features"
    assert features["set"] == extracted
    assert features["cache"]["completion_hits"] == features["cache"]["prompts"] == 2
    assert features["cache"]["hidden_state_hits"] == 2
    assert computed["features"]["host"] != "features"
    assert computed["features"]["cache"]["hidden_state_hits"] == 0
    assert with_set["features"]["dtype"] == computed["features"]["dtype"] == "float32"
    assert with_set["metrics"]["tau_macro"] == computed["metrics"]["tau_macro"]
    assert [row["tau"] for row in with_set["per_prompt"]] == [
        row["tau"] for row in computed["per_prompt"]
    ]

    # The two runs differ in features provenance: two comparability groups, each named.
    grouped = run_fab(inventory_path, "compare")
    assert grouped.returncode == 0, grouped.stdout + grouped.stderr
    assert "differ in features" in said(grouped.stdout + grouped.stderr), grouped.stdout
    mixed = run_fab(inventory_path, "compare", "--allow-mixed")
    assert mixed.returncode == 0, mixed.stdout + mixed.stderr


def test_a_tampered_copy_on_the_eval_host_is_refused_at_use(features_lab, extracted):
    """One value flipped in the eval host's copy (same size): the eval refuses it, naming
    the file and the fix, instead of scoring it; `--verify` repairs it."""
    copy = set_dir(features_lab, "eval", extracted)
    for victim in (copy / "hidden").glob("*.safetensors"):  # whichever the run reads first
        data = bytearray(victim.read_bytes())
        data[-1] ^= 0x40  # the last value of the last tensor
        victim.write_bytes(bytes(data))
    prompts = ["--prompts", str(features_lab.root / labs.LAB_PROMPTS)]
    refused = run_fab(
        features_lab.inventory_path, "run-eval", "--step", "2000", *RUN_OPTIONS, *prompts,
        *DTYPE, "--features", "latest", timeout=900,
    )  # fmt: skip
    output = said(refused.stdout + refused.stderr)
    assert refused.returncode == 1, output
    assert re.search(r"hidden/[0-9a-f]{64}\.safetensors does not match feature-set\.json", output)
    assert "fab extract-features --verify" in output
    repaired = extract(features_lab, "--verify")
    assert repaired.returncode == 0, repaired.stdout + repaired.stderr
    assert digests(copy) == digests(set_dir(features_lab, "features", extracted))


def test_a_set_changed_with_its_feature_set_json_on_the_eval_host_flags_the_run(
    features_lab, extracted
):
    """The eval host's copy altered (a hidden-state value) together with its feature-set.json
    (that file's new sha256): the run finds the set consistent and succeeds, but the
    feature-set.json it read is not the one the workstation recorded when it relayed the set:
    the pulled run is flagged not comparable, in run-eval, compare and the report, naming the
    set, the host, both sha256s and the fix; `--verify` repairs the copy."""
    inventory_path = features_lab.inventory_path
    copy = set_dir(features_lab, "eval", extracted)
    record_file = copy / "feature-set.json"
    made = hashlib.sha256(record_file.read_bytes()).hexdigest()
    record = json.loads(record_file.read_bytes())
    for victim in (copy / "hidden").glob("*.safetensors"):
        data = bytearray(victim.read_bytes())
        data[-1] ^= 0x40
        victim.write_bytes(bytes(data))
        record["files"][f"hidden/{victim.name}"]["sha256"] = hashlib.sha256(data).hexdigest()
    record_file.write_text(json.dumps(record, indent=1) + "\n")
    changed = hashlib.sha256(record_file.read_bytes()).hexdigest()
    results_root = load(inventory_path).local.results
    before = set(results_root.glob("*/results.json"))
    prompts = ["--prompts", str(features_lab.root / labs.LAB_PROMPTS)]
    flagged = run_fab(
        inventory_path, "run-eval", "--step", "2000", *RUN_OPTIONS, *prompts, *DTYPE,
        "--features", "latest", timeout=900,
    )  # fmt: skip
    pulled = [path.parent for path in set(results_root.glob("*/results.json")) - before]
    try:
        output = said(flagged.stdout + flagged.stderr)
        assert flagged.returncode == 1, output
        assert len(pulled) == 1, output  # the results are kept, flagged
        features = json.loads((pulled[0] / "results.json").read_text())["features"]
        assert (features["set"], features["set_sha256"]) == (extracted, changed)
        named = f"feature set {extracted} on eval: the run read a feature-set.json with sha256"
        assert named in output and changed[:12] in output and made[:12] in output, output
        assert "fab extract-features --to eval --verify" in output, output
        compared = run_fab(inventory_path, "compare", "--report")
        assert compared.returncode == 0, compared.stdout + compared.stderr
        notes = said(compared.stdout + compared.stderr)
        assert f"not comparable {pulled[0].name}" in notes and named in notes, notes
        report = (results_root / "report.html").read_text()
        assert "feature set changed" in report and changed[:12] in report
    finally:
        for directory in pulled:  # the module's other comparisons never see this run
            shutil.rmtree(directory)
    repaired = extract(features_lab, "--verify")
    assert repaired.returncode == 0, repaired.stdout + repaired.stderr
    assert digests(copy) == digests(set_dir(features_lab, "features", extracted))
