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
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar
from urllib.parse import urlsplit

Generate = Callable[[list[int], int], list[int]]
# DFLASH mode: (input_ids, max_new_tokens) → (output_ids, the speculative meta_info fields)
Speculate = Callable[[list[int], int], tuple[list[int], dict[str, Any]]]


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
    speculate: ClassVar[Speculate | None] = None  # DFLASH mode

    def do_GET(self):  # not in `requests`, which holds the /generate calls
        path = urlsplit(self.path).path
        if path == "/health" and StandIn.speculate is not None:
            self._reply(200, None)
        elif path.endswith("/get_model_info") and StandIn.mode != "no-info":
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
        spec: dict[str, Any] = {}
        if StandIn.speculate is not None:
            output_ids, spec = StandIn.speculate(body["input_ids"], count)
        else:
            output_ids = StandIn.generate(body["input_ids"], count)
        reply = {
            "text": "x" * len(output_ids),
            "meta_info": {
                "id": "1",
                "prompt_tokens": len(body["input_ids"]),
                "completion_tokens": len(output_ids),
                "finish_reason": {"type": "length", "length": len(output_ids)},
                **spec,
            },
        }
        if StandIn.mode == "ok":
            reply["output_ids"] = output_ids
        self._reply(200, reply)

    def _reply(self, status: int, payload: dict | None) -> None:
        data = b"" if payload is None else json.dumps(payload).encode()
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
    StandIn.speculate = None
    StandIn.model_path, StandIn.version = model_path, "0.0.0-stand-in"
    return ThreadingHTTPServer(("127.0.0.1", 0), StandIn)


def greedy_with(model_dir: Path) -> Generate:
    """The target's greedy continuation, as SGLang at temperature 0 would serve it. The
    target loads at the first /generate: a server only asked what it serves (check-hosts)
    starts without torch."""

    @functools.cache
    def loaded() -> Generate:
        import torch
        from dflash_eval.target.files import load_tokenizer, stop_token_ids
        from dflash_eval.target.model import load_target

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


def spec_fields(completion_tokens: int, lengths: list[int], block_size: int) -> dict[str, Any]:
    """SGLang's speculative meta_info for one request whose rounds committed `lengths` tokens
    (acc + 1 each) after the prefill's first token; none while no round ran, as SGLang."""
    verify_ct = len(lengths)
    if verify_ct == 0:
        return {}
    proposed = verify_ct * (block_size - 1)
    correct = sum(lengths) - verify_ct
    histogram = [0] * block_size
    for length in lengths:
        histogram[length - 1] += 1
    return {
        "spec_accept_rate": correct / proposed,
        "spec_accept_length": completion_tokens / verify_ct,
        "spec_num_correct_drafts": correct,
        "spec_num_proposed_drafts": proposed,
        "spec_verify_ct": verify_ct,
        "spec_accepted_drafts": correct,
        "spec_proposed_drafts": proposed,
        "spec_correct_drafts_histogram": histogram,
        "spec_accept_histogram": histogram,
    }


def dflash_with(target_dir: Path, drafter_dir: Path, block_size: int) -> Speculate:
    """SGLang's DFLASH decoding at T = 0 with these models, as the harness computes it: the
    target's greedy completion, its features, the drafter's blocks, the harness's walk."""
    import torch
    from dflash_eval.drafter.loaders import load_drafter
    from dflash_eval.reference.sequence import first_stop
    from dflash_eval.target.files import load_tokenizer, stop_token_ids
    from dflash_eval.target.model import DTYPES, load_target
    from dflash_eval.walk.metrics import Span, walk_prompt
    from dflash_eval.walk.predict import BorrowedHead, Predictor

    torch.set_num_threads(1)
    target = load_target(target_dir, "auto")
    stops = stop_token_ids(target_dir, load_tokenizer(target_dir))
    drafter = load_drafter(drafter_dir, target.shape, block_size=block_size)
    config, dtype = drafter.config, DTYPES[drafter.dtype]
    head = BorrowedHead.from_target(
        target.embed_weight, target.head_weight, config.mask_token_id, dtype
    )
    layers = list(config.target_layer_ids)

    def speculate(input_ids: list[int], max_new_tokens: int) -> tuple[list[int], dict]:
        reference = target.greedy(input_ids, max_new_tokens + block_size, stops)
        tokens, first, stop = input_ids + reference, len(input_ids), first_stop(reference, stops)
        span = Span(first, first + max_new_tokens, None if stop is None else first + stop)
        hidden = target.hidden_features(tokens, layers)
        features = torch.cat([hidden[i] for i in layers], dim=-1).to(dtype)
        predictor = Predictor(
            drafter.model, head, tokens, features, first, block_size, 1, last_anchor=span.limit - 1
        )
        lengths = walk_prompt(predictor, tokens, span, block_size).capped_lengths
        output = tokens[first : span.end]
        return output, spec_fields(len(output), lengths, block_size)

    return speculate


def serve_launched(argv: list[str]) -> None:
    """`python -m sglang.launch_server …` in DFLASH mode (the flags dflash-ops sends; another
    is refused, as SGLang refuses it): models loaded first, then port `--port` opened."""
    parser = argparse.ArgumentParser(prog="sglang.launch_server (stand-in)")
    parser.add_argument("--model-path", type=Path, required=True)
    parser.add_argument("--speculative-algorithm", choices=("DFLASH",), required=True)
    parser.add_argument("--speculative-draft-model-path", type=Path, required=True)
    parser.add_argument("--speculative-num-draft-tokens", type=int, required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=30000)
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--tp-size", type=int, default=1)
    args = parser.parse_args(argv)
    log = os.environ.get("SGLANG_STAND_IN_LOG")
    if log:
        launch = {"argv": argv, "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES")}
        with Path(log).open("a") as file:
            file.write(json.dumps({"launch": launch}) + "\n")
    speculate = dflash_with(
        args.model_path, args.speculative_draft_model_path, args.speculative_num_draft_tokens
    )
    StandIn.mode, StandIn.requests, StandIn.log = "ok", [], Path(log) if log else None
    StandIn.model_path, StandIn.speculate = str(args.model_path), speculate
    ThreadingHTTPServer((args.host, args.port), StandIn).serve_forever()


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
