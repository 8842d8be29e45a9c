"""`fab extract-features` end to end on a lab with a features host (CPU, its own namespace):
provisioning, the set computed there by the real harness (from local or SGLang completions),
relayed through the workstation to the eval host and verified, a corrupt copy sent again, an
interrupted relay resumed, and every refusal before a run starts or a byte moves.

The lab, and the set computed and relayed once, are session fixtures (`features_lab`,
`extracted` in tests/e2e/conftest.py) shared with test_run_eval_features.py, which evaluates
on the relayed set. What a set is made of (its id, the layers rule) is tested without a lab in
test_feature_spec.py.
"""

from __future__ import annotations

import json
import shlex
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from dflash_lab import lab as labs
from dflash_lab.models import BLOCK_SIZE
from dflash_ops.core.errors import DiskSpaceError
from dflash_ops.core.inventory import load
from dflash_ops.core.units import format_bytes
from dflash_ops.features.extract import FeatureSet
from dflash_ops.features.relay import set_destination, set_payload
from dflash_ops.remote.layout import EvalLayout
from dflash_ops.staging.delivery import StageOptions, deliver
from tests.conftest import run_fab
from tests.e2e.conftest import with_sglang_url
from tests.e2e.features_helpers import (
    MAX_NEW_TOKENS,
    digests,
    extract,
    lab_layers,
    said,
    set_dir,
    small_extraction,
    tiny_disk,
    without_margin,
)
from tests.sglang_stand_in import started_in

pytestmark = pytest.mark.long(350)  # seconds in a cold `make test` (5 workers)


def test_lab_has_a_features_host_with_the_same_target(features_lab):
    inventory = load(features_lab.inventory_path)
    assert list(inventory.features_hosts) == ["features"]
    assert list(inventory.eval_hosts) == ["eval"]
    hosts = features_lab.state.hosts
    if features_lab.state.mode == "netns":  # a namespace of its own, like the other hosts
        assert len({record.netns for record in hosts.values()}) == len(hosts) == 3
    targets = [
        features_lab.data_dir(name) / "models" / "tiny-target" for name in ("eval", "features")
    ]
    assert digests(targets[0]) == digests(targets[1])
    mtimes = [{p.name: p.stat().st_mtime_ns for p in target.iterdir()} for target in targets]
    assert mtimes[0] == mtimes[1]  # the target's fingerprint counts them


def test_setup_eval_host_provisions_the_features_host(features_lab, features_provisioned):
    assert "features: provisioned" in said(features_provisioned.stdout), features_provisioned.stdout
    again = run_fab(features_lab.inventory_path, "setup-eval-host", "--host", "features")
    assert again.returncode == 0, again.stdout + again.stderr
    assert "features: nothing to do" in said(again.stdout), again.stdout


def test_check_hosts_checks_the_features_host(features_lab, features_provisioned):
    done = run_fab(features_lab.inventory_path, "check-hosts", "-v")
    assert done.returncode == 0, done.stdout + done.stderr
    # the host's rows: from its name in the host column (the last host) to the table's end
    checks = said(done.stdout.split("│ features ")[1])
    for check in ("reachable", "host key", "authenticated", "target model", "workdir", "venv"):
        assert check in checks, done.stdout
    assert "staging dir" not in checks and "reference drafter" not in checks


def test_the_set_is_computed_on_the_features_host_and_relayed_verified(features_lab, extracted):
    source = set_dir(features_lab, "features", extracted)
    copy = set_dir(features_lab, "eval", extracted)
    record = json.loads((source / "feature-set.json").read_text())
    assert record["provenance"]["host"] == "features"
    assert record["provenance"]["device"] == "cpu"
    assert record["layer_ids"] == [int(i) for i in lab_layers(features_lab).split(",")]
    assert record["block_size"] == BLOCK_SIZE and record["max_new_tokens"] == int(MAX_NEW_TOKENS)
    assert record["entries"] >= 2
    assert digests(copy) == digests(source)
    manifest = json.loads(copy.with_name(f"{extracted}.manifest.json").read_text())
    assert manifest["feature_set"] == extracted and manifest["source_host"] == "features"
    assert {f["name"]: f["sha256"] for f in manifest["files"]} == digests(source)
    assert not (source.parent / f"{extracted}.partial").exists()


def test_eval_logs_and_eval_status_find_the_features_run(features_lab, extracted):
    runs = Path(EvalLayout(load(features_lab.inventory_path).hosts["features"]).runs)
    succeeded = [p for p in runs.glob("*/exit_code") if p.read_text() == "0\n"]
    run_id = succeeded[0].parent.name
    done = run_fab(features_lab.inventory_path, "eval-logs", "--id", run_id)
    assert done.returncode == 0, done.stdout + done.stderr
    log = (runs / run_id / "log").read_text()
    assert log.strip() and said(done.stdout) == said(log)
    status = run_fab(features_lab.inventory_path, "eval-status")
    assert status.returncode == 0, status.stdout + status.stderr
    [row] = [line for line in status.stdout.splitlines() if run_id in line]
    assert "features" in row and "succeeded" in row  # exit 0 with a set, not results.json


def test_asking_again_computes_and_sends_nothing(features_lab, extracted):
    runs = Path(EvalLayout(load(features_lab.inventory_path).hosts["features"]).runs)
    before = sorted(runs.iterdir())
    again = extract(features_lab)
    assert again.returncode == 0, again.stdout + again.stderr
    assert f"feature set {extracted} already computed" in said(again.stdout), again.stdout
    assert "already staged" in said(again.stdout), again.stdout
    assert sorted(runs.iterdir()) == before


def test_a_corrupt_relayed_file_is_found_by_verify_and_sent_again(features_lab, extracted):
    source = set_dir(features_lab, "features", extracted)
    copy = set_dir(features_lab, "eval", extracted)
    victim = max((p for p in copy.rglob("*") if p.is_file()), key=lambda p: p.stat().st_size)
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0xFF
    victim.write_bytes(bytes(data))  # same size; the mtime changes, as a real rot would not
    assert digests(copy) != digests(source)
    verified = extract(features_lab, "--verify")
    assert verified.returncode == 0, verified.stdout + verified.stderr
    output = said(verified.stdout)
    assert victim.name in output and "sending the set again" in output, verified.stdout
    assert "staged and verified" in output, verified.stdout
    assert digests(copy) == digests(source)
    clean = extract(features_lab, "--verify")
    assert clean.returncode == 0 and "verified again" in said(clean.stdout), clean.stdout


def test_an_interrupted_relay_resumes_where_it_stopped(features_lab, extracted):
    """The eval host's copy put back as an interrupted relay leaves it (staging's layout:
    verified files and their records in `<set>.partial`, the file being written half there);
    the next extract-features sends only the missing half."""
    source = set_dir(features_lab, "features", extracted)
    copy = set_dir(features_lab, "eval", extracted)
    manifest_file = copy.with_name(f"{extracted}.manifest.json")
    records = sorted(json.loads(manifest_file.read_text())["files"], key=lambda r: r["size"])
    partial = copy.with_name(f"{extracted}.partial")
    manifest_file.unlink()
    copy.rename(partial)
    done_records = "".join(json.dumps(record) + "\n" for record in records[:-1])
    partial.with_name(f"{partial.name}.jsonl").write_text(done_records)
    writing = partial / records[-1]["name"]
    data = writing.read_bytes()
    writing.unlink()
    writing.with_name(f"{writing.name}.partial").write_bytes(data[: len(data) // 2])

    resumed = extract(features_lab)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    rest = format_bytes(len(data) - len(data) // 2)
    assert "staged and verified" in said(resumed.stdout), resumed.stdout
    assert f"{rest} moved" in said(resumed.stdout), resumed.stdout
    assert digests(copy) == digests(source) and manifest_file.is_file()
    assert not partial.exists()


def test_layers_the_target_lacks_are_refused_before_any_run_starts(
    features_lab, features_provisioned
):
    """The free-space check runs the harness's own argument and target checks: a bad request
    fails in seconds, with no run started."""
    runs = Path(EvalLayout(load(features_lab.inventory_path).hosts["features"]).runs)
    before = sorted(runs.iterdir()) if runs.is_dir() else []
    done = run_fab(
        features_lab.inventory_path, "extract-features", "--layers", "1,99", "--block-size",
        "8", "--max-new-tokens", "4", timeout=600,
    )  # fmt: skip
    assert done.returncode == 1, done.stdout + done.stderr
    assert "--layers [99] do not exist" in said(done.stderr), done.stderr
    assert (sorted(runs.iterdir()) if runs.is_dir() else []) == before
    assert "staged and verified" not in done.stdout


def test_a_failed_extraction_says_why_and_relays_nothing(
    features_lab, features_provisioned, tmp_path
):
    """A run that fails once started: the SGLang server (the default with an sglang_url)
    serves the target, then answers every /generate with HTTP 500."""
    features = load(features_lab.inventory_path).hosts["features"]
    sets_before = sorted(Path(EvalLayout(features).features).glob("*"))
    log, failing = tmp_path / "requests.jsonl", ("--mode", "error")
    with started_in(features_lab, "features", features.target_model, log, *failing) as (_, url):
        done = small_extraction(with_sglang_url(features_lab, url, tmp_path, host="features"))
    assert done.returncode == 1, done.stdout + done.stderr
    assert "failed (exit code" in said(done.stderr), done.stderr
    assert f"/generate at {url} answered HTTP 500" in said(
        done.stderr.split("last lines of its log:")[1]
    ), done.stderr
    assert "staged and verified" not in done.stdout
    complete = [p for p in Path(EvalLayout(features).features).glob("*") if p not in sets_before]
    assert not [p for p in complete if (p / "feature-set.json").exists()]


def test_a_server_serving_another_model_is_refused_before_anything_is_extracted(
    features_lab, features_provisioned, tmp_path
):
    features = load(features_lab.inventory_path).hosts["features"]
    layout = EvalLayout(features)
    before = {d: sorted(Path(d).glob("*")) for d in (layout.features, layout.runs)}
    log, other = tmp_path / "requests.jsonl", "/srv/models/another-model"
    served_as = ("--model-path", other)
    with started_in(features_lab, "features", features.target_model, log, *served_as) as (_, url):
        done = small_extraction(with_sglang_url(features_lab, url, tmp_path, host="features"))
    assert done.returncode == 1, done.stdout + done.stderr
    output = said(done.stderr)
    assert f"SGLang at {url} serves {other}, but the target is {features.target_model}" in output
    assert "or pass --completions local" in output and "Traceback" not in output
    assert not log.exists()  # not one completion asked for
    assert "needs at most" not in done.stdout  # refused before the set was even sized
    assert {d: sorted(Path(d).glob("*")) for d in before} == before  # no run, no partial set


def test_an_unknown_relay_host_fails_before_anything_is_computed(features_lab):
    done = run_fab(
        features_lab.inventory_path, "extract-features", "--layers", "1", "--block-size", "8",
        "--to", "eval,nope",
    )  # fmt: skip
    assert done.returncode == 1
    assert "no eval host named 'nope'" in said(done.stderr), done.stderr
    assert "computing" not in done.stdout


def test_a_set_the_features_disk_cannot_hold_is_refused_before_the_run(
    features_lab, features_provisioned, tmp_path
):
    layout = EvalLayout(load(features_lab.inventory_path).hosts["features"])
    with tiny_disk(features_lab, "features", layout.features, "64k") as host:
        runs_before = host.run(f"ls -A {shlex.quote(layout.runs)}", check=False).stdout
        done = extract(features_lab, inventory_path=without_margin(features_lab, tmp_path))
        assert done.returncode == 1, done.stdout + done.stderr
        message = said(done.stderr)
        assert f"features: not enough free space at {layout.features}" in message, message
        assert "free 64.0 KiB" in message and "an upper bound" in message, message
        assert "fab prune --features --host features" in message, message
        assert "fewer prompts" in message and "fewer --max-new-tokens" in message, message
        # nothing launched or left behind: no run, no uploaded prompts, nothing on the disk
        assert host.run(f"ls -A {shlex.quote(layout.runs)}", check=False).stdout == runs_before
        assert host.run(f"ls -A {shlex.quote(layout.features)}").stdout == ""
    assert "staged and verified" not in done.stdout


def test_a_relay_the_eval_disk_cannot_hold_is_refused_before_a_byte_moves(
    features_lab, extracted, tmp_path
):
    layout = EvalLayout(load(features_lab.inventory_path).hosts["eval"])
    with tiny_disk(features_lab, "eval", layout.features, "64k") as host:
        done = extract(features_lab, inventory_path=without_margin(features_lab, tmp_path))
        assert done.returncode == 1, done.stdout + done.stderr
        assert f"feature set {extracted} already computed" in said(done.stdout), done.stdout
        message = said(done.stderr)
        assert f"eval: not enough free space at {layout.features}" in message, message
        assert f"for feature set {extracted}" in message, message
        assert "fab prune --features --host eval" in message, message
        assert host.run(f"ls -A {shlex.quote(layout.features)}").stdout == ""
        # Staging's own check (a disk that filled after that look) names the set and its prune
        # too, not a checkpoint step.
        inventory = load(without_margin(features_lab, tmp_path))
        features_dir = EvalLayout(inventory.hosts["features"]).feature_set(extracted)
        source = FeatureSet("features", extracted, features_dir, {}, False)
        planned = deliver(
            inventory,
            set_payload(inventory, source),
            set_destination(inventory, "eval", extracted),
            StageOptions(report=lambda _: None, dry_run=True),
        )
        (space,) = [hop.space for hop in planned.plan if hop.space is not None]
        with pytest.raises(DiskSpaceError) as refused:
            space.require()
        assert f"for feature set {extracted}:" in str(refused.value), refused.value
        assert "fab prune --features --host eval" in str(refused.value), refused.value


@pytest.fixture
def sglang_on_the_features_host(features_lab, tmp_path):
    """The SGLang stand-in (tests/sglang_stand_in.py: the target's own greedy continuations)
    in the features host's namespace, on its loopback. Yields its URL and request log."""
    target = load(features_lab.inventory_path).hosts["features"].target_model
    log = tmp_path / "requests.jsonl"
    with started_in(features_lab, "features", target, log) as (_, url):
        yield url, log


@pytest.fixture
def own_sets(features_lab) -> Iterator[list[str]]:
    """The ids of the sets a test makes besides the module's, removed from every host after
    it: `--features latest` names the module's set whichever tests ran before."""
    made: list[str] = []
    yield made
    for host, identifier in ((h, i) for h in ("features", "eval") for i in made):
        directory = set_dir(features_lab, host, identifier)
        shutil.rmtree(directory, ignore_errors=True)
        directory.with_name(f"{identifier}.manifest.json").unlink(missing_ok=True)


def test_completions_from_sglang_make_their_own_set(
    features_lab, extracted, sglang_on_the_features_host, own_sets, tmp_path
):
    url, log = sglang_on_the_features_host
    # credentials in the URL (the stand-in ignores them) must reach no file, argv or output
    secret = url.replace("http://", "http://u:s3cret@")
    with_sglang = with_sglang_url(features_lab, secret, tmp_path, host="features")

    done = extract(features_lab, inventory_path=with_sglang)  # sglang_url: SGLang by default
    assert done.returncode == 0, done.stdout + done.stderr
    identifier = done.stdout.split("fab run-eval --features ")[1].split()[0]
    own_sets.append(identifier)
    assert identifier != extracted  # other completions: another set, never the local one
    prompts = (features_lab.root / labs.LAB_PROMPTS).read_text().splitlines()
    requests = [json.loads(line) for line in log.read_text().splitlines()]
    assert len(requests) == len(prompts) and {r["path"] for r in requests} == {"/generate"}
    source = set_dir(features_lab, "features", identifier)
    record = json.loads((source / "feature-set.json").read_text())
    assert record["completions"]["source"].startswith("sglang")
    assert digests(set_dir(features_lab, "eval", identifier)) == digests(source)
    features = load(features_lab.inventory_path).hosts["features"]
    seen = [*source.rglob("*"), *Path(EvalLayout(features).runs).rglob("*")]
    for path in (p for p in seen if p.is_file()):
        assert b"s3cret" not in path.read_bytes(), path
    assert "s3cret" not in done.stdout + done.stderr
    local = extract(features_lab, "--completions", "local", inventory_path=with_sglang)
    assert local.returncode == 0, local.stdout + local.stderr
    assert f"feature set {extracted} found" in said(local.stdout)  # the module's local set
    assert len(log.read_text().splitlines()) == len(requests)  # the server was not asked
