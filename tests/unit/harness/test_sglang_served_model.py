"""The SGLang server is asked what it serves before its completions are used (a stand-in
server on loopback: tests/sglang_stand_in.py), and --completions chooses the source."""

from __future__ import annotations

import json

import pytest
from dflash_eval.contract.errors import HarnessError
from dflash_eval.plan.dry_run import make_plan
from dflash_eval.reference.sglang_server import (
    check_serves,
    completions_url,
    model_name,
    target_names,
)

from tests.sglang_stand_in import StandIn

from .helpers import quick_eval
from .test_plan import facts, options


def test_a_model_is_named_by_its_last_component_or_its_hub_repository():
    assert model_name("/root/models/Qwen3.6-27B/") == "qwen3.6-27b"
    assert model_name("Qwen/Qwen3.6-27B") == "qwen3.6-27b"
    hub = "/cache/hub/models--Qwen--Qwen3.6-27B/snapshots/0123abcd"
    assert model_name(hub) == "qwen3.6-27b"


def test_the_target_also_goes_by_the_name_its_config_records(tmp_path):
    target = tmp_path / "local-copy"
    target.mkdir()
    (target / "config.json").write_text(json.dumps({"_name_or_path": "Qwen/Qwen3.6-27B"}))
    assert target_names(target) == {"local-copy", "qwen3.6-27b"}


def test_a_server_serving_the_target_gives_its_model_and_version(tmp_path, sglang_url):
    target = tmp_path / "Qwen3.6-27B"
    target.mkdir()
    StandIn.model_path = "/srv/models/qwen3.6-27b"  # another machine's path, same model
    served = check_serves(sglang_url, target)
    assert served.record() == {"model_path": "/srv/models/qwen3.6-27b", "version": "0.0.0-stand-in"}
    StandIn.version = None  # an older server without /get_server_info: no version, no refusal
    assert check_serves(sglang_url, target).version is None


def test_a_server_serving_another_model_is_refused_in_one_line_naming_both(tmp_path, sglang_url):
    target = tmp_path / "Qwen3.6-27B"
    target.mkdir()
    StandIn.model_path = "Qwen/Qwen3-8B"
    secret = sglang_url.replace("http://", "http://user:s3cret@") + "/s3cret-path?key=s3cret"
    with pytest.raises(HarnessError) as refused:
        check_serves(secret, target)
    message = str(refused.value)
    assert f"SGLang at {sglang_url}/*** serves Qwen/Qwen3-8B, but the target is {target}" in message
    assert "--completions local" in message and "\n" not in message and "s3cret" not in message


def test_a_server_that_cannot_say_what_it_serves_is_refused(tmp_path, sglang_url):
    StandIn.mode = "no-info"  # not SGLang's native API: /get_model_info is not there
    with pytest.raises(HarnessError, match=r"/get_model_info at .* answered HTTP 404"):
        check_serves(sglang_url + "/proxy-prefix", tmp_path)
    with pytest.raises(
        HarnessError, match=r"Cannot reach the SGLang server at http://127\.0\.0\.1:9 "
    ):
        check_serves("http://127.0.0.1:9", tmp_path)


def test_completions_local_drops_the_url_and_sglang_needs_one():
    assert completions_url(None, "http://127.0.0.1:1") == "http://127.0.0.1:1"
    assert completions_url("local", "http://127.0.0.1:1") is None
    assert completions_url(None, None) is None
    with pytest.raises(HarnessError, match="--completions sglang needs --sglang-url"):
        completions_url("sglang", None)


def test_eval_refuses_a_server_serving_another_model_before_any_completion(
    lab, tmp_path, sglang_url
):
    StandIn.model_path = "/models/some-other-model"
    with pytest.raises(HarnessError, match="serves /models/some-other-model, but the target is"):
        quick_eval(lab, tmp_path, sglang_url=sglang_url, num_prompts=1, max_new_tokens=4)
    assert StandIn.requests == []  # not one /generate


def test_eval_records_the_served_model_and_version(lab, tmp_path, sglang_url):
    StandIn.model_path = str(lab.target_dir)
    results = quick_eval(
        lab, tmp_path, sglang_url=sglang_url, num_prompts=1, max_new_tokens=4, ddtree=[]
    )
    completions = results["completions"]
    assert completions["source"] == "sglang"
    assert completions["sglang_model"] == str(lab.target_dir)
    assert completions["sglang_version"] == "0.0.0-stand-in"
    local = quick_eval(lab, tmp_path, num_prompts=1, max_new_tokens=4, ddtree=[])
    assert local["completions"]["sglang_model"] is None
    assert local["completions"]["sglang_version"] is None


def test_the_plan_asks_the_server_and_names_a_wrong_model_as_a_problem(lab, tmp_path, sglang_url):
    StandIn.model_path = str(lab.target_dir)
    plan = make_plan(options(lab, tmp_path, sglang_url=sglang_url), facts())
    assert plan["completions"] == {
        "source": "sglang",
        "sglang_url": sglang_url,
        "sglang_model": str(lab.target_dir),
        "sglang_version": "0.0.0-stand-in",
    }
    assert plan["problems"] == []
    StandIn.model_path = "Qwen/Qwen3-8B"
    plan = make_plan(options(lab, tmp_path, sglang_url=sglang_url), facts())
    [problem] = plan["problems"]
    assert problem.startswith("the run would refuse to start: SGLang at")
    assert "serves Qwen/Qwen3-8B" in problem
    local = make_plan(options(lab, tmp_path), facts())
    assert local["completions"] == {"source": "local", "sglang_url": None}


def test_completions_are_keyed_by_the_model_and_version_the_server_serves(
    lab, tmp_path, sglang_url, monkeypatch
):
    """A URL is not an identity: after an SGLang upgrade (or another copy of the model behind
    the same URL) the cached completions are not the server's any more."""
    monkeypatch.setattr(StandIn, "model_path", str(lab.target_dir))

    def completion_hits() -> int:
        plan = make_plan(options(lab, tmp_path, sglang_url=sglang_url), facts())
        return plan["cache"]["completions"]["hits"]

    assert completion_hits() == 0
    quick_eval(lab, tmp_path, sglang_url=sglang_url, max_new_tokens=24, ddtree=[4])
    assert completion_hits() == 3  # eval and plan key them alike
    monkeypatch.setattr(StandIn, "version", "0.0.1-upgraded")
    assert completion_hits() == 0
    monkeypatch.setattr(StandIn, "model_path", f"/other/copy/{lab.target_dir.name}")
    assert completion_hits() == 0
