"""Feature sets: `features` computes a target's completions and hidden states into SETDIR once,
and `eval --features SETDIR` reads them instead of computing them, with the same numbers."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch
from dflash_eval.contract.errors import HarnessError
from dflash_eval.contract.progress import Progress
from dflash_eval.run.features import FeaturesOptions, run_features
from dflash_eval.target.device import resolve_device

from tests.sglang_stand_in import StandIn, made_up_tokens, serve
from tests.unit.harness.helpers import quick_eval

pytestmark = pytest.mark.long(50)  # seconds in a cold `make test` (5 workers)

REMOTE = Path(__file__).resolve().parents[2] / "remote"
LAB_LAYERS = [1, 3]  # what the lab drafters read
LAB_BLOCK = 8
SUBPROCESS_TIMEOUT_S = 300


def _extract(lab, setdir: Path, **overrides) -> dict:
    options = FeaturesOptions(
        target=lab.target_dir,
        out=setdir,
        threads=1,
        layers=LAB_LAYERS,
        block_size=LAB_BLOCK,
        prompts=lab.prompts,
        max_new_tokens=48,
    )
    for name, value in overrides.items():
        setattr(options, name, value)
    return run_features(options, Progress(quiet=True))


def _manifest(setdir: Path) -> dict:
    return json.loads((setdir / "feature-set.json").read_text())


def _snapshot(directory: Path) -> dict[str, tuple[int, int]]:
    return {
        str(p.relative_to(directory)): (p.stat().st_size, p.stat().st_mtime_ns)
        for p in sorted(directory.rglob("*"))
    }


def _files(directory: Path) -> list[Path]:
    return [p for p in directory.rglob("*") if p.is_file()]


def _features_cli(*args: str, **kwargs) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "dflash_eval", "features", *args],
        cwd=REMOTE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **kwargs,
    )


@pytest.fixture(scope="module")
def lab_set(lab, tmp_path_factory) -> Path:
    """One set of the lab target over the lab prompts, shared by the read-only tests."""
    setdir = tmp_path_factory.mktemp("sets") / "lab-target-set"
    _extract(lab, setdir)
    return setdir


def test_eval_on_a_feature_set_scores_as_computing_the_features_here(lab, lab_set, tmp_path):
    before = _snapshot(lab_set)
    here = quick_eval(lab, tmp_path / "here")
    from_set = quick_eval(lab, tmp_path / "from-set", features=lab_set)
    assert from_set["metrics"] == here["metrics"]
    assert [row["tau"] for row in from_set["per_prompt"]] == [
        row["tau"] for row in here["per_prompt"]
    ]
    features = from_set["features"]
    assert features["cache"] == {"completion_hits": 3, "hidden_state_hits": 3, "prompts": 3}
    assert features["target_load"]["body_loaded"] is False
    assert features["set"] == "lab-target-set" and features["source"] == "feature set"
    assert features["target_match"] == "fingerprint"
    for name in ("device", "dtype", "kernel", "libraries", "fidelity"):
        assert features[name] == here["features"][name]
    assert from_set["completions"]["extra_tokens"] == LAB_BLOCK
    # Read-only: the set is unchanged and the run's own cache was never written.
    assert _snapshot(lab_set) == before
    assert not _files(tmp_path / "from-set" / "cache")


def test_the_manifest_says_what_the_set_holds(lab, lab_set):
    manifest = _manifest(lab_set)
    assert manifest["format"] == 1
    assert manifest["layer_ids"] == LAB_LAYERS and manifest["block_size"] == LAB_BLOCK
    assert (manifest["max_new_tokens"], manifest["thinking"]) == (48, False)
    prompt_bytes = Path(lab.prompts).read_bytes()
    count = len(prompt_bytes.decode().splitlines())
    assert manifest["prompts"]["sha256"] == hashlib.sha256(prompt_bytes).hexdigest()
    assert manifest["prompts"]["count"] == count == manifest["entries"]
    assert manifest["target"]["name"] == Path(lab.target_dir).name
    assert manifest["shared_key"]["target"] == manifest["target"]["fingerprint"]
    provenance = manifest["provenance"]
    assert (provenance["device"], provenance["dtype"]) == ("cpu", "float32")
    assert provenance["kernel"] == {"attention": "sdpa"}
    assert manifest["fidelity"]["status"] == "not needed"
    assert manifest["completions"] == {"source": "local-greedy"}
    assert len(list((lab_set / "completions").glob("*.json"))) == count
    assert len(list((lab_set / "hidden").glob("*.safetensors"))) == count
    assert len(list((lab_set / "features").glob("*.json"))) == 1
    assert not list(lab_set.parent.glob("*.partial"))


def test_the_command_reports_progress_and_records_the_inventory_host_name(lab, tmp_path):
    setdir = tmp_path / "sets" / "named"
    events_file = tmp_path / "events.jsonl"
    args = ["--target", str(lab.target_dir), "--out", str(setdir), "--layers", "1,3"]
    args += ["--block-size", "8", "--prompts", str(lab.prompts), "--max-new-tokens", "16"]
    args += ["--host-name", "features-box", "--progress-file", str(events_file)]
    process = _features_cli(*args)
    stdout, stderr = process.communicate(timeout=SUBPROCESS_TIMEOUT_S)
    assert process.returncode == 0, stderr
    events = [json.loads(line) for line in stdout.splitlines()]
    phases = {e["phase"] for e in events if e["event"] == "progress"}
    assert {"completions", "hidden_states"} <= phases
    done = events[-1]
    assert done["event"] == "done" and done["summary"]["noop"] is False
    assert done["summary"]["provenance"]["host"] == "features-box"
    assert events_file.read_text().splitlines() == stdout.splitlines()
    assert sorted(p.name for p in (tmp_path / "sets").iterdir()) == ["named"]

    results = quick_eval(lab, tmp_path, max_new_tokens=16, features=setdir)
    assert results["features"]["host"] == "features-box"

    again = _features_cli(*args)
    stdout, stderr = again.communicate(timeout=SUBPROCESS_TIMEOUT_S)
    assert again.returncode == 0, stderr
    assert json.loads(stdout.splitlines()[-1])["summary"]["noop"] is True
    assert "nothing to do" in stderr


def test_a_rerun_with_the_same_inputs_is_a_no_op_and_other_inputs_are_refused(lab, tmp_path):
    setdir = tmp_path / "set"
    first = _extract(lab, setdir, max_new_tokens=16)
    before = _snapshot(setdir)
    again = _extract(lab, setdir, max_new_tokens=16)
    assert (first["noop"], again["noop"]) == (False, True)
    assert _snapshot(setdir) == before
    with pytest.raises(HarnessError, match=r"other inputs \(differing: \['max_new_tokens'\]\)"):
        _extract(lab, setdir, max_new_tokens=12)
    assert _snapshot(setdir) == before


def test_an_unwritable_out_is_refused_before_the_target_loads(lab, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    setdir = blocker / "sets" / "s"
    expected = f"--out {setdir}: cannot write in {setdir.parent} (Not a directory)"
    with pytest.raises(HarnessError, match=re.escape(expected)):
        _extract(lab, setdir)


def test_an_interrupted_build_leaves_no_set_and_is_resumed(lab, tmp_path):
    asked, release = threading.Event(), threading.Event()

    def second_request_waits(input_ids: list[int], count: int) -> list[int]:
        if len(StandIn.requests) == 2:
            asked.set()
            release.wait(SUBPROCESS_TIMEOUT_S)
        return made_up_tokens(input_ids, count)

    server = serve(second_request_waits, model_path=str(lab.target_dir))  # serves the target
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    setdir = tmp_path / "set"
    args = ["--target", str(lab.target_dir), "--out", str(setdir), "--layers", "1,3"]
    args += ["--block-size", "8", "--prompts", str(lab.prompts), "--max-new-tokens", "12"]
    try:
        process = _features_cli(*args, "--sglang", url)
        assert asked.wait(SUBPROCESS_TIMEOUT_S), "the build never asked for a second completion"
        process.send_signal(signal.SIGINT)
        process.communicate(timeout=SUBPROCESS_TIMEOUT_S)
        release.set()
        assert process.returncode == 130
        assert not setdir.exists()
        partial = tmp_path / "set.partial"
        assert len(list((partial / "completions").glob("*.json"))) == 1

        StandIn.generate = made_up_tokens
        resumed = run_features(
            FeaturesOptions(
                lab.target_dir,
                setdir,
                LAB_LAYERS,
                LAB_BLOCK,
                lab.prompts,
                12,
                sglang_url=url,
                threads=1,
            ),
            Progress(quiet=True),
        )
    finally:
        release.set()
        server.shutdown()
        server.server_close()
    prompts = resumed["entries"]
    # The completion written before the interrupt was kept: one request less the second time.
    assert len(StandIn.requests) == 2 + prompts - 1
    assert not partial.exists() and _manifest(setdir)["entries"] == prompts
    served = f"sglang {url} serving {lab.target_dir} (SGLang 0.0.0-stand-in)"
    assert _manifest(setdir)["completions"] == {"source": served}  # what served them


def test_a_partial_left_by_other_inputs_is_replaced(lab, tmp_path):
    partial = tmp_path / "set.partial"
    (partial / "completions").mkdir(parents=True)
    (partial / "completions" / "stale.json").write_text("{}")
    (partial / "inputs.json").write_text(json.dumps({"max_new_tokens": 99}))
    _extract(lab, tmp_path / "set", max_new_tokens=8)
    assert not partial.exists()
    assert not (tmp_path / "set" / "completions" / "stale.json").exists()
    assert not (tmp_path / "set" / "inputs.json").exists()


def test_another_hosts_copy_of_the_target_is_accepted_and_other_weights_refused(
    lab, lab_set, tmp_path
):
    copy = tmp_path / "copy" / "target"
    shutil.copytree(lab.target_dir, copy)
    weights = copy / "model.safetensors"
    os.utime(weights, ns=(1, 1))  # the same bytes written at another time: another fingerprint
    here = quick_eval(lab, tmp_path / "here", target=copy)
    assert here["target"]["fingerprint"] != _manifest(lab_set)["target"]["fingerprint"]
    from_set = quick_eval(lab, tmp_path / "from-set", target=copy, features=lab_set)
    assert from_set["features"]["target_match"] == "content"
    assert from_set["metrics"] == here["metrics"]

    data = bytearray(weights.read_bytes())
    data[len(data) // 2] ^= 0x01  # other weights of the same shapes, as a fine-tune has
    weights.write_bytes(bytes(data))
    with pytest.raises(HarnessError, match=r"computed for target .* contents differ"):
        quick_eval(lab, tmp_path / "changed", target=copy, features=lab_set)


def test_a_set_without_the_drafters_layers_or_block_is_refused(lab, tmp_path):
    narrow = tmp_path / "layer-1"
    _extract(lab, narrow, layers=[1], max_new_tokens=8)
    with pytest.raises(HarnessError, match=r"holds layers \[1\] only \(missing \[3\]\)"):
        quick_eval(lab, tmp_path, max_new_tokens=8, features=narrow)
    short = tmp_path / "block-4"
    _extract(lab, short, block_size=4, max_new_tokens=8)
    with pytest.raises(HarnessError, match="block size 8 exceeds the feature set's 4"):
        quick_eval(lab, tmp_path, max_new_tokens=8, features=short)
    # A drafter evaluated with a block the set covers runs on it.
    results = quick_eval(lab, tmp_path, max_new_tokens=8, block_size=4, features=short)
    assert results["features"]["cache"]["hidden_state_hits"] == 3


def test_a_prompt_missing_from_the_set_is_an_error_never_computed_here(lab, tmp_path):
    prompts = tmp_path / "two.jsonl"
    prompts.write_text("".join(Path(lab.prompts).read_text().splitlines(True)[:2]))
    setdir = tmp_path / "two-prompts"
    _extract(lab, setdir, prompts=prompts, max_new_tokens=8)
    before = _snapshot(setdir)
    with pytest.raises(HarnessError, match=r"no completion in feature set .* extract-features"):
        quick_eval(lab, tmp_path, max_new_tokens=8, features=setdir)
    assert _snapshot(setdir) == before
    assert not _files(tmp_path / "cache")


def test_settings_the_set_was_not_made_with_are_refused(lab, lab_set, tmp_path):
    with pytest.raises(HarnessError, match="made with max_new_tokens 48, this run asks for 32"):
        quick_eval(lab, tmp_path, max_new_tokens=32, features=lab_set)
    with pytest.raises(HarnessError, match="made with thinking False"):
        quick_eval(lab, tmp_path, thinking=True, features=lab_set)
    with pytest.raises(HarnessError, match="--target-dtype bfloat16, but feature set"):
        quick_eval(lab, tmp_path, target_dtype="bfloat16", features=lab_set)


def test_a_missing_incomplete_or_corrupt_set_is_refused(lab, lab_set, tmp_path):
    with pytest.raises(HarnessError, match="exists not on this host"):
        quick_eval(lab, tmp_path, features=tmp_path / "absent")
    (tmp_path / "building.partial").mkdir()
    with pytest.raises(HarnessError, match="only as an incomplete build"):
        quick_eval(lab, tmp_path, features=tmp_path / "building")
    broken = tmp_path / "broken"
    shutil.copytree(lab_set, broken)
    (broken / "feature-set.json").write_text('{"format": 1,')
    with pytest.raises(HarnessError, match=r"feature-set\.json cannot be read"):
        quick_eval(lab, tmp_path, features=broken)
    (broken / "feature-set.json").write_text(json.dumps({"format": 1, "layer_ids": [1]}))
    with pytest.raises(HarnessError, match=r"lacks .*'shared_key'.* corrupt"):
        quick_eval(lab, tmp_path, features=broken)
    (broken / "feature-set.json").unlink()
    with pytest.raises(HarnessError, match=r"has no feature-set\.json"):
        quick_eval(lab, tmp_path, features=broken)


def test_every_file_of_the_set_is_listed_with_its_size_and_sha256(lab_set):
    files = _manifest(lab_set)["files"]
    on_disk = {
        p.relative_to(lab_set).as_posix(): p
        for p in _files(lab_set)
        if p.name != "feature-set.json"
    }
    assert sorted(files) == sorted(on_disk)
    for name, path in on_disk.items():
        data = path.read_bytes()
        assert files[name] == {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}


def test_a_flipped_value_in_a_hidden_state_file_is_refused_at_use(lab, lab_set, tmp_path):
    """Same size, one float32 changed: without the check τ would move without a word."""
    tampered = tmp_path / "tampered"
    shutil.copytree(lab_set, tampered)
    victims = sorted((tampered / "hidden").glob("*.safetensors"))
    for victim in victims:  # whichever of them the run reads first
        data = bytearray(victim.read_bytes())
        data[-4:] = torch.tensor([12345.0]).numpy().tobytes()  # the last value of the last
        victim.write_bytes(bytes(data))
    with pytest.raises(HarnessError) as caught:
        quick_eval(lab, tmp_path / "run", features=tampered)
    message = str(caught.value)
    read = re.search(r"hidden/(\S+) does not match feature-set\.json", message)
    assert read and read.group(1) in {victim.name for victim in victims}, message
    assert message.startswith(f"Feature set {tampered}: hidden/")
    assert "fab extract-features --verify" in message
    assert not (tmp_path / "run" / "r.json").exists()
    manifest = _manifest(tampered)
    del manifest["files"]  # a set made before sets listed their files
    (tampered / "feature-set.json").write_text(json.dumps(manifest))
    with pytest.raises(HarnessError, match="lists no files with their sha256"):
        quick_eval(lab, tmp_path / "run", features=tampered)


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a host without a GPU")
def test_without_a_gpu_auto_is_the_cpu_and_cuda_is_refused_with_advice(lab, tmp_path):
    assert resolve_device("auto") == "cpu"
    with pytest.raises(HarnessError, match=r"no CUDA device.*venv\.torch: cuda"):
        _extract(lab, tmp_path / "set", device="cuda")
    assert not (tmp_path / "set.partial").exists()
