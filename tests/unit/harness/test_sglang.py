"""Completions from SGLang's native /generate, against a stand-in server on loopback."""

from __future__ import annotations

import pytest
from dflash_eval.contract.errors import HarnessError
from dflash_eval.reference.completions import SGLangClient

from tests.sglang_stand_in import StandIn, made_up_tokens

from .helpers import quick_eval


def test_client_sends_greedy_request_and_reads_output_ids(sglang_url):
    output = SGLangClient(sglang_url).complete([7, 8, 9], 4)
    assert output == made_up_tokens([7, 8, 9], 4)
    request = StandIn.requests[0]
    assert request["path"] == "/generate" and request["input_ids"] == [7, 8, 9]
    assert request["sampling_params"]["temperature"] == 0.0
    assert request["sampling_params"]["max_new_tokens"] == 4


def test_reference_asks_to_ignore_eos_and_keeps_a_block_past_the_stop_token(sglang_url):
    client = SGLangClient(sglang_url)
    made_up = made_up_tokens([7, 8, 9], 10 + 4)  # 15, 16, 17, 18, …
    # No stop token: max_new_tokens and then the extra tokens.
    assert client.reference([7, 8, 9], 10, 4, stops=[0]) == made_up
    # A stop token at index 3: the completion ends there, the reference 4 tokens later.
    assert client.reference([7, 8, 9], 10, 4, stops=[18]) == made_up[: 3 + 1 + 4]
    for request in StandIn.requests:
        assert request["sampling_params"]["ignore_eos"] is True
        assert request["sampling_params"]["max_new_tokens"] == 14


def test_server_errors_and_missing_ids_are_explained(sglang_url):
    StandIn.mode = "error"
    with pytest.raises(HarnessError, match="HTTP 500"):
        SGLangClient(sglang_url).complete([1], 2)
    StandIn.mode = "no-ids"
    with pytest.raises(HarnessError, match="did not return output_ids"):
        SGLangClient(sglang_url).complete([1], 2)


def test_a_prefix_and_query_are_kept_and_never_shown(sglang_url):
    """A proxy's URL: a token in the path and another in the query string. /generate goes
    after the path, the query stays; no message shows either token."""
    url = f"{sglang_url}/tok3n-in-path/?key=s3cret&x=1"
    assert len(SGLangClient(url).complete([7, 8, 9], 4)) == 4
    assert [r["path"] for r in StandIn.requests] == ["/tok3n-in-path/generate?key=s3cret&x=1"]
    StandIn.mode = "error"  # its answer quotes the URL it was asked for
    with pytest.raises(HarnessError) as caught:
        SGLangClient(url).complete([1], 2)
    message = str(caught.value)
    assert "HTTP 500" in message and f"at {sglang_url}/***" in message
    assert "tok3n" not in message and "s3cret" not in message


def test_unreachable_server_names_the_url_and_the_fix():
    import socket

    with socket.socket() as probe:  # a loopback port with nobody listening
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    with pytest.raises(HarnessError) as caught:
        SGLangClient(url, timeout_s=5).complete([1], 2)
    assert url in str(caught.value) and "--sglang-url" in str(caught.value)


def test_eval_uses_sglang_completions(lab, tmp_path, sglang_url):
    StandIn.model_path = str(lab.target_dir)  # what the server is asked before it is used
    results = quick_eval(
        lab,
        tmp_path,
        checkpoint=lab.checkpoints[2000],
        num_prompts=2,
        max_new_tokens=12,
        sglang_url=sglang_url,
        ddtree=[],
    )
    assert results["completions"] == {
        "source": "sglang",
        "sglang_url": sglang_url,
        "extra_tokens": 8,  # the lab drafter's block size
        "sglang_model": str(lab.target_dir),
        "sglang_version": "0.0.0-stand-in",
    }
    assert len(StandIn.requests) == 2
    assert {r["sampling_params"]["max_new_tokens"] for r in StandIn.requests} == {12 + 8}
    assert [row["completion_tokens"] for row in results["per_prompt"]] == [12, 12]
    assert [row["reference_tokens"] for row in results["per_prompt"]] == [20, 20]


def test_a_url_with_credentials_is_shown_redacted_and_can_come_from_a_file(tmp_path):
    from dflash_eval.contract.urls import read_url, redact_url

    for secret in ("http://user:pw@127.0.0.1:30000", "http://127.0.0.1:30000/tok/v1?key=t#f"):
        assert redact_url(secret) == "http://127.0.0.1:30000/***"
    assert redact_url("http://127.0.0.1:30000") == "http://127.0.0.1:30000"
    assert redact_url("https://[::1]:8443/") == "https://[::1]:8443"
    secret = tmp_path / "url"
    secret.write_text("http://user:pw@127.0.0.1:30000\n")
    assert read_url(f"@{secret}") == "http://user:pw@127.0.0.1:30000"
    assert read_url("http://x") == "http://x"
