"""STAND-IN for an SGLang server (SGLang needs a GPU build; it cannot run here).

It answers SGLang's native `POST [PREFIX]/generate[?QUERY]` JSON (input_ids + sampling_params →
output_ids, text, meta_info), `GET …/get_model_info` (model_path, tokenizer_path,
is_generation) and `GET …/get_server_info` (a few server arguments and `version`), and nothing
else. In-process it serves the harness's client
tests with made-up tokens and failure modes; as a script, started inside a lab host's
network namespace, it answers with the model's own greedy continuation:

    python -m tests.sglang_stand_in --model TARGET_DIR --log requests.jsonl

It prints the port it listens on (127.0.0.1, an ephemeral port) as its first line.
`--model-path` makes it claim to serve another model, `--mode` picks a failure (as `mode`);
`started_in` runs the script so in a lab host's namespace.
"""

from __future__ import annotations

import argparse
import functools
import json
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar
from urllib.parse import urlsplit

Generate = Callable[[list[int], int], list[int]]


def made_up_tokens(input_ids: list[int], count: int) -> list[int]:
    """Deterministic tokens in 5..94 that depend on the last prompt token."""
    return [5 + (input_ids[-1] + i) % 90 for i in range(1, count + 1)]


class StandIn(BaseHTTPRequestHandler):
    generate: ClassVar[Generate] = made_up_tokens
    # "error": HTTP 500 to POSTs; "no-ids": a reply without output_ids; "no-info": no model info
    mode: ClassVar[str] = "ok"
    model_path: ClassVar[str] = "stand-in-model"  # what /get_model_info says it serves
    version: ClassVar[str | None] = "0.0.0-stand-in"  # None: no /get_server_info (older)
    requests: ClassVar[list[dict]] = []
    log: ClassVar[Path | None] = None

    def do_GET(self):  # not in `requests`, which holds the /generate calls
        path = urlsplit(self.path).path
        if path.endswith("/get_model_info") and StandIn.mode != "no-info":
            info = {"model_path": StandIn.model_path, "is_generation": True}
            self._reply(200, {**info, "tokenizer_path": StandIn.model_path})
        elif path.endswith("/get_server_info") and StandIn.version is not None:
            # the real one holds every server argument, an api_key among them
            self._reply(
                200,
                {"model_path": StandIn.model_path, "api_key": "s3cret", "version": StandIn.version},
            )
        else:
            self._reply(404, {"detail": "Not Found"})

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        request = {"path": self.path, **body}
        StandIn.requests.append(request)
        if StandIn.log:
            with StandIn.log.open("a") as log:
                log.write(json.dumps(request) + "\n")
        # A proxy's prefix may come before /generate, and its query string after.
        if not urlsplit(self.path).path.endswith("/generate") or StandIn.mode == "error":
            self._reply(500, {"error": f"boom at {self.path}"})  # as proxies echo the URL
            return
        count = body["sampling_params"]["max_new_tokens"]
        output_ids = StandIn.generate(body["input_ids"], count)
        reply = {
            "text": "x" * len(output_ids),
            "meta_info": {
                "id": "1",
                "prompt_tokens": len(body["input_ids"]),
                "completion_tokens": len(output_ids),
                "finish_reason": {"type": "length", "length": len(output_ids)},
            },
        }
        if StandIn.mode == "ok":
            reply["output_ids"] = output_ids
        self._reply(200, reply)

    def _reply(self, status: int, payload: dict) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


def serve(
    generate: Generate = made_up_tokens, model_path: str = "stand-in-model"
) -> ThreadingHTTPServer:
    """A server on 127.0.0.1 (ephemeral port) with fresh state, serving `model_path`; call
    serve_forever on it."""
    StandIn.generate, StandIn.mode, StandIn.requests = generate, "ok", []
    StandIn.model_path, StandIn.version = model_path, "0.0.0-stand-in"
    return ThreadingHTTPServer(("127.0.0.1", 0), StandIn)


def greedy_with(model_dir: Path) -> Generate:
    """The target's greedy continuation, as SGLang at temperature 0 would serve it. The
    target loads at the first /generate: a server only asked what it serves (check-hosts)
    starts without torch."""

    @functools.cache
    def loaded() -> Generate:
        import torch
        from dflash_eval.target.model import load_target, load_tokenizer, stop_token_ids

        torch.set_num_threads(1)
        target = load_target(model_dir, "float32")
        stops = stop_token_ids(model_dir, load_tokenizer(model_dir))
        return lambda input_ids, count: target.greedy(input_ids, count, stops)

    return lambda input_ids, count: loaded()(input_ids, count)


@contextmanager
def started_in(
    lab: Any, host: str, model: str, log: Path, *more: str
) -> Iterator[tuple[subprocess.Popen, str]]:
    """The script in lab host `host`'s network namespace, on its loopback (`more`: its
    options): the process and its URL; stopped on exit."""
    argv = [sys.executable, "-m", "tests.sglang_stand_in", "--model", model, "--log", str(log)]
    server = subprocess.Popen(
        lab.in_namespace(host, [*argv, *more]),
        cwd=Path(__file__).resolve().parents[1],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        yield server, f"http://127.0.0.1:{int(server.stdout.readline())}"
    finally:
        server.terminate()
        server.wait(timeout=30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, required=True)
    parser.add_argument("--log", type=Path, required=True, help="JSON line per request")
    parser.add_argument("--model-path", help="what /get_model_info names (default: --model)")
    parser.add_argument("--mode", choices=("ok", "error", "no-info"), default="ok")
    args = parser.parse_args()
    server = serve(greedy_with(args.model), args.model_path or str(args.model))
    StandIn.log, StandIn.mode = args.log, args.mode
    print(server.server_address[1], flush=True)
    server.serve_forever()


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "remote"))
    main()
