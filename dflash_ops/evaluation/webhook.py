"""Notifications to a webhook URL (`fab watch --webhook URL`): JSON posted from a background
thread, so a slow or dead endpoint never holds up the evaluations.

Each payload is tried a few times with a short timeout and a growing pause; one that still
fails is reported (through `say`) and dropped. The URL may carry credentials (user:password,
a token in its path or query): messages name only its scheme, host and port.

Every payload also carries `text`, one human line, so chat tools whose incoming webhooks
require that field (Slack, Mattermost, Rocket.Chat) accept the JSON as it is.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from urllib.parse import urlsplit

import requests

from dflash_ops.core.errors import OpsError

POST_TIMEOUT_S = 5.0  # per attempt: connect and read
ATTEMPTS = 3
BACKOFF_S = 2.0  # pause after the first failed attempt, doubled after each further one
CLOSE_WAIT_S = 20.0  # how long closing waits for posts still queued (then drops them)


def display_url(url: str) -> str:
    """`https://user:secret@hooks.example/T0/abc?token=x` → `https://hooks.example/…`: what
    messages may show of a webhook URL."""
    parts = urlsplit(url)
    port = f":{parts.port}" if parts.port else ""
    return f"{parts.scheme}://{parts.hostname}{port}/…"


def check_url(url: str) -> str:
    """The URL when it is an http(s) URL with a host; else a clear error (without echoing
    the URL, which may hold a secret)."""
    try:
        parts = urlsplit(url)
        valid = parts.scheme in ("http", "https") and bool(parts.hostname)
        _ = parts.port  # a malformed port raises here
    except ValueError:
        valid = False
    if not valid:
        raise OpsError(
            "--webhook: expected an http:// or https:// URL with a host name "
            "(the value is not shown: it may hold credentials)"
        )
    return url


def chat_text(payload: dict) -> str:
    """The payload as one line: what happened to which step, and τ (and its comparability
    key) or the error."""
    run = f" (training run {payload['training_run']})" if payload.get("training_run") else ""
    line = f"{payload.get('source', 'dflash-ops')}: step {payload.get('step')}{run} "
    line += str(payload.get("event", "update"))
    if payload.get("host"):
        line += f" on {payload['host']}"
    tau, interval = payload.get("tau_macro"), payload.get("tau_macro_ci")
    if isinstance(tau, int | float):
        line += f": τ {tau:.3f}"
        if isinstance(interval, list) and all(isinstance(v, int | float) for v in interval):
            line += f" [{interval[0]:.3f}, {interval[1]:.3f}]"
    if payload.get("comparability_key"):
        line += f" (comparability key {payload['comparability_key']})"
    if payload.get("attempts"):
        line += f" after {payload['attempts']} attempt(s)"
    if payload.get("error"):
        line += f": {str(payload['error']).splitlines()[0]}"
    if payload.get("run_id"):
        line += f" — run {payload['run_id']}"
    return line


class Webhook:
    """Posts JSON payloads to one URL in order, from a daemon thread; `post` never blocks."""

    def __init__(self, url: str, say: Callable[[str], None], backoff_s: float = BACKOFF_S) -> None:
        self._url = check_url(url)
        self._backoff_s = backoff_s
        self.shown = display_url(url)
        self._say = say
        self._pending: queue.Queue[dict | None] = queue.Queue()
        self._closing = threading.Event()  # cuts pauses between attempts short
        self.delivered = 0
        self.dropped = 0
        self._thread = threading.Thread(target=self._deliver_all, name="webhook", daemon=True)
        self._thread.start()

    def post(self, payload: dict) -> None:
        self._pending.put({"text": chat_text(payload), **payload})

    def close(self, wait_s: float = CLOSE_WAIT_S) -> None:
        """Deliver what is queued within `wait_s`, then stop; what is left is dropped."""
        self._pending.put(None)
        self._thread.join(wait_s)
        if self._thread.is_alive():
            self._closing.set()
            self._say(f"webhook {self.shown}: gave up on undelivered posts at exit")

    def _deliver_all(self) -> None:
        while (payload := self._pending.get()) is not None:
            problem = self._deliver(payload)
            if problem is None:
                self.delivered += 1
            else:
                self.dropped += 1
                self._say(
                    f"[yellow]webhook {self.shown}: not delivered[/] after {ATTEMPTS} "
                    f"attempt(s) ({problem}); the watch goes on"
                )

    def _deliver(self, payload: dict) -> str | None:
        """None once delivered, else why the last attempt failed."""
        problem = None
        for attempt in range(ATTEMPTS):
            if attempt:
                self._closing.wait(self._backoff_s * 2 ** (attempt - 1))
            try:
                answer = requests.post(self._url, json=payload, timeout=POST_TIMEOUT_S)
            except requests.RequestException as exc:
                # Only the exception's kind: its text carries the URL's path and query.
                problem = type(exc).__name__
                continue
            if answer.ok:
                return None
            problem = f"HTTP {answer.status_code}"
            if answer.status_code < 500 and answer.status_code != 429:
                return problem  # the endpoint refuses this payload: retrying will not help
        return problem
