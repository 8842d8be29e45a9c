"""Completions from SGLang's native /generate, against a minimal local server (loopback)."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import ClassVar

import pytest
from dflash_eval.completions import SGLangClient
from dflash_eval.errors import HarnessError
from dflash_eval.evaluate import EvalOptions, run_eval
from dflash_eval.progress import Progress


class FakeSGLang(BaseHTTPRequestHandler):
    """Answers POST /generate like SGLang: text, output_ids and meta_info."""

    requests: ClassVar[list[dict]] = []
    mode: ClassVar[str] = "ok"

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        FakeSGLang.requests.append({"path": self.path, **body})
        if self.path != "/generate" or FakeSGLang.mode == "error":
            self._reply(500, {"error": "boom"})
            return
        count = body["sampling_params"]["max_new_tokens"]
        last = body["input_ids"][-1]
        output_ids = [5 + (last + i) % 90 for i in range(1, count + 1)]
        reply = {
            "text": "x" * count,
            "meta_info": {
                "id": "1",
                "prompt_tokens": len(body["input_ids"]),
                "completion_tokens": count,
                "finish_reason": {"type": "length", "length": count},
            },
        }
        if FakeSGLang.mode == "ok":
            reply["output_ids"] = output_ids
        self._reply(200, reply)

    def _reply(self, status, payload):
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


@pytest.fixture
def sglang_url():
    FakeSGLang.requests, FakeSGLang.mode = [], "ok"
    server = ThreadingHTTPServer(("127.0.0.1", 0), FakeSGLang)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_client_sends_greedy_request_and_reads_output_ids(sglang_url):
    output = SGLangClient(sglang_url).complete([7, 8, 9], 4)
    assert output == [5 + (9 + i) % 90 for i in range(1, 5)]
    request = FakeSGLang.requests[0]
    assert request["path"] == "/generate" and request["input_ids"] == [7, 8, 9]
    assert request["sampling_params"]["temperature"] == 0.0
    assert request["sampling_params"]["max_new_tokens"] == 4


def test_server_errors_and_missing_ids_are_explained(sglang_url):
    FakeSGLang.mode = "error"
    with pytest.raises(HarnessError, match="HTTP 500"):
        SGLangClient(sglang_url).complete([1], 2)
    FakeSGLang.mode = "no-ids"
    with pytest.raises(HarnessError, match="did not return output_ids"):
        SGLangClient(sglang_url).complete([1], 2)


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
    results = run_eval(
        EvalOptions(
            checkpoint=lab.checkpoints[2000],
            target=lab.target_dir,
            out=tmp_path / "r.json",
            prompts=lab.prompts,
            num_prompts=2,
            max_new_tokens=12,
            sglang_url=sglang_url,
            ddtree=[],
        ),
        Progress(quiet=True),
    )
    assert results["completions"] == {"source": "sglang", "sglang_url": sglang_url}
    assert len(FakeSGLang.requests) == 2
    assert [row["completion_tokens"] for row in results["per_prompt"]] == [12, 12]
