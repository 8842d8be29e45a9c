"""The watch's webhook against an endpoint on loopback (`HookServer`, tests/conftest.py):
retries a failing endpoint, never blocks nor shows the URL's credentials when it is down,
and adds a chat text line to each post."""

from __future__ import annotations

import socket

from dflash_ops.evaluation.webhook import Webhook
from tests.conftest import HookServer


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_webhook_retries_a_failing_endpoint():
    server = HookServer(statuses=[500, 503])
    said: list[str] = []
    webhook = Webhook(server.url(), said.append, backoff_s=0.01)
    webhook.post({"step": 1})
    webhook.close()
    server.close()
    assert [post["step"] for post in server.received()] == [1, 1, 1]
    assert (webhook.delivered, webhook.dropped, said) == (1, 0, [])


def test_webhook_down_never_blocks_and_never_shows_credentials():
    said: list[str] = []
    url = f"http://user:s3cret@127.0.0.1:{free_port()}/T0/tok3n?key=hidd3n"
    webhook = Webhook(url, said.append, backoff_s=0.01)
    webhook.post({"step": 1})  # returns at once: delivery happens on the webhook's thread
    webhook.post({"step": 2})
    webhook.close()
    assert (webhook.delivered, webhook.dropped) == (0, 2)
    assert len(said) == 2 and "not delivered" in said[0] and "ConnectionError" in said[0]
    for secret in ("s3cret", "tok3n", "hidd3n", "user"):
        assert not any(secret in line for line in said), said


def test_webhook_posts_carry_a_chat_text_line(hook):
    webhook = Webhook(hook.url(), print, backoff_s=0.01)
    evaluated = {
        "source": "dflash-ops watch",
        "event": "evaluated",
        "training_run": "v5",
        "step": 4000,
        "host": "eval",
        "run_id": "20261201-1203-v5-step4000-eval-ab12",
        "tau_macro": 3.14159,
        "tau_macro_ci": [3.01, 3.25],
    }
    failed = {
        "source": "dflash-ops watch",
        "event": "failed",
        "step": 6000,
        "attempts": 2,
        "error": "exit code 2: checkpoint refused\nmore detail",
    }
    webhook.post(evaluated)
    webhook.post(failed)
    webhook.close()
    posts = hook.received()
    assert [post["text"] for post in posts] == [
        "dflash-ops watch: step 4000 (training run v5) evaluated on eval: τ 3.142 [3.010, "
        "3.250] — run 20261201-1203-v5-step4000-eval-ab12",
        "dflash-ops watch: step 6000 failed after 2 attempt(s): exit code 2: checkpoint refused",
    ]
    assert {k: v for k, v in posts[0].items() if k != "text"} == evaluated  # the JSON as before
