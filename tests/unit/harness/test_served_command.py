"""The harness asks the SGLang server what it serves before anything heavy: `served` (what
`fab check-hosts` runs on the host, URL on stdin) and `features` (before the target loads).
Unit tier: an SGLang stand-in on loopback (tests/sglang_stand_in.py)."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from dflash_eval.cli import main
from dflash_eval.contract.errors import HarnessError
from dflash_eval.contract.progress import Progress
from dflash_eval.run.features import FeaturesOptions, run_features

from tests.sglang_stand_in import StandIn


@pytest.fixture
def ask(monkeypatch, capsys, tmp_path, sglang_url):
    """`python -m dflash_eval served --target …/Qwen3.6-27B`, the stand-in's URL on stdin and
    serving the model given: the target, its exit status, its JSON events and its stderr."""

    def asked(served_as: str) -> tuple[Path, int, list[dict], str]:
        StandIn.model_path = served_as
        monkeypatch.setattr("sys.stdin", io.StringIO(sglang_url + "\n"))
        target = tmp_path / "Qwen3.6-27B"
        status = main(["served", "--target", str(target)])
        out, err = capsys.readouterr()
        return target, status, [json.loads(line) for line in out.splitlines()], err

    return asked


def test_served_names_the_model_and_version_of_a_server_serving_the_target(ask):
    _, status, events, _ = ask("/srv/models/Qwen3.6-27B")
    assert status == 0
    assert {key: value for key, value in events[-1].items() if key != "time"} == {
        "event": "served",
        "model_path": "/srv/models/Qwen3.6-27B",
        "version": "0.0.0-stand-in",
    }


def test_served_refuses_another_model_in_one_line_naming_both(ask):
    target, status, events, err = ask("/srv/models/Llama-3-8B")
    assert status == 2
    assert events[-1]["event"] == "error"
    [line] = err.splitlines()
    assert f"serves /srv/models/Llama-3-8B, but the target is {target}" in line


def test_features_refuse_another_model_before_the_target_loads(tmp_path, sglang_url):
    """The target directory holds no model at all: only the served check can fail first."""
    target = tmp_path / "Qwen3.6-27B"
    target.mkdir()
    StandIn.model_path = "/srv/models/Llama-3-8B"
    options = FeaturesOptions(
        target=target, out=tmp_path / "set", layers=[1], block_size=4, sglang_url=sglang_url
    )
    with pytest.raises(HarnessError, match="serves /srv/models/Llama-3-8B, but the target is"):
        run_features(options, Progress(quiet=True))
    assert StandIn.requests == []  # no completion asked for
    assert list(tmp_path.iterdir()) == [target]  # no set, no partial
