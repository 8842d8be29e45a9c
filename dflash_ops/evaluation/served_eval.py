"""`fab served-eval --step N`: the acceptance length SGLang itself gets with a checkpoint.

On an eval host with an `sglang` section: the checkpoint staged and exported as a drafter
directory (export.py), the GPUs checked free and a free port of the range chosen, an SGLang
server of the tool's own started with the target and the drafter (`--speculative-algorithm
DFLASH`, `--speculative-num-draft-tokens` the drafter's block size, `CUDA_VISIBLE_DEVICES` the
section's GPUs), waited for until healthy, asked by the harness's `served-eval` (run-eval's
prompts, built as run-eval builds them), and stopped whatever happens, Ctrl-C included
(remote/sglang_launch.py: only the process it started, by its claim). The served record is
pulled to `local.results/served/ID/served.json`.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass
from pathlib import Path

from dflash_eval.contract.errors import HarnessError
from dflash_eval.contract.schema_served import ServedResults, parse_served

from dflash_ops.core.errors import HostError, InventoryError, ResultsError
from dflash_ops.core.files import write_atomic
from dflash_ops.core.inventory import EvalHost, Inventory
from dflash_ops.core.sglang_launch import SglangLaunch
from dflash_ops.evaluation import jobs
from dflash_ops.evaluation.export import export_on_host
from dflash_ops.evaluation.harness_command import drafter_profile
from dflash_ops.evaluation.run import RunReporter, ensure_ready, stage_checkpoint
from dflash_ops.remote import sglang_launch
from dflash_ops.remote.connection import Host
from dflash_ops.remote.layout import EvalLayout

SERVED_DIR = "served"  # under local.results, and under the eval host's workdir


@dataclass(frozen=True)
class ServedRequest:
    step: int
    host: str | None = None
    prompts: Path | None = None  # a local JSONL file, uploaded (as run-eval's --prompts)
    num_prompts: int | None = None
    max_new_tokens: int | None = None
    thinking: bool | None = None


def served_eval(inventory: Inventory, request: ServedRequest, reporter: RunReporter) -> Path:
    """One served evaluation; returns the pulled record's path."""
    name, entry = inventory.eval_host(request.host)
    if entry.sglang is None:
        raise InventoryError(
            f"{inventory.path}: hosts.{name}.sglang is not set: served-eval starts SGLang "
            "itself and needs the python of the SGLang environment, its GPUs and a port range "
            "there (docs/served.md)"
        )
    host = Host(inventory, name)
    try:
        harness = ensure_ready(host, entry, reporter.say)
        staged = stage_checkpoint(inventory, request.step, name, reporter)
        drafter = export_on_host(
            host, entry, harness, staged, drafter_profile(inventory), reporter.say
        )
        block = _block_size(host, drafter)
        sglang_launch.require_free_gpus(host, entry.sglang)
        port = sglang_launch.free_port(
            host, entry.sglang.python, entry.sglang.port_numbers(), entry.sglang_url
        )
        run_id = jobs.new_run_id(request.step, name, "served", inventory.training_run)
        server = sglang_launch.Server(f"{EvalLayout(entry).workdir}/{SERVED_DIR}/{run_id}", port)
        record = _serve_and_ask(Serving(host, entry, harness, server, drafter, block), request)
    finally:
        host.close()
    local = inventory.local.results / SERVED_DIR / run_id / "served.json"
    write_atomic(local, json.dumps(record, indent=2) + "\n")
    served = record["served"]
    macro, pooled = served["tau_macro"], served["tau_pooled"]
    reporter.say(
        f"step {request.step}  served τ macro {macro['value'] if macro else 'n/a'}  pooled "
        f"{pooled['value'] if pooled else 'n/a'}  ({served['convention']}) → {local}"
    )
    return local


@dataclass(frozen=True)
class Serving:
    """One served evaluation's server on its host: where it runs and what it serves."""

    host: Host
    entry: EvalHost
    harness: str  # the deployed harness directory
    server: sglang_launch.Server
    drafter: str  # the exported drafter directory
    block: int  # its block size: --speculative-num-draft-tokens

    @property
    def launch(self) -> SglangLaunch:
        assert self.entry.sglang is not None, "served_eval refuses a host without one"
        return self.entry.sglang


def _serve_and_ask(serving: Serving, request: ServedRequest) -> ServedResults:
    """Start the server, ask it, stop it (whatever happens: an error, Ctrl-C)."""
    entry, server = serving.entry, serving.server
    launch = ["--model-path", entry.target_model, "--speculative-algorithm", "DFLASH"]
    launch += ["--speculative-draft-model-path", serving.drafter]
    launch += ["--speculative-num-draft-tokens", str(serving.block)]
    launch += ["--host", "127.0.0.1", "--port", str(server.port)]
    try:
        sglang_launch.start(serving.host, serving.launch, server.directory, launch)
        sglang_launch.wait_healthy(
            serving.host, EvalLayout(entry).python, server, serving.launch.start_timeout
        )
        return _ask(serving, request)
    finally:
        sglang_launch.stop(serving.host, server.directory)


def _ask(serving: Serving, request: ServedRequest) -> ServedResults:
    host, server = serving.host, serving.server
    out = f"{server.directory}/served.json"
    argv = [EvalLayout(serving.entry).python, "-m", "dflash_eval", "served-eval"]
    argv += ["--target", serving.entry.target_model, "--sglang-url", server.url, "--out", out]
    argv += ["--num-draft-tokens", str(serving.block), "--drafter", serving.drafter]
    argv += ["--step", str(request.step), "--gpus", ",".join(map(str, serving.launch.gpus))]
    argv += ["--quiet"]
    if request.prompts is not None:
        uploaded = f"{server.directory}/prompts.jsonl"
        host.upload(request.prompts.read_bytes(), uploaded)
        argv += ["--prompts", uploaded]
    if request.num_prompts is not None:
        argv += ["--num-prompts", str(request.num_prompts)]
    if request.max_new_tokens is not None:
        argv += ["--max-new-tokens", str(request.max_new_tokens)]
    if request.thinking is not None:
        argv += ["--thinking", "on" if request.thinking else "off"]
    command = f"cd {shlex.quote(serving.harness)} && env PYTHONPATH={shlex.quote(serving.harness)} "
    result = host.run(command + shlex.join(argv), check=False)
    if not result.ok:
        raise HostError(host.name, f"served-eval failed: {result.stderr.strip() or 'no output'}")
    text = host.run(f"cat -- {shlex.quote(out)}").stdout
    try:
        return parse_served(json.loads(text))
    except (ValueError, HarnessError) as error:
        raise ResultsError(f"{host.name}:{out} is not a served record: {error}") from None


def _block_size(host: Host, drafter: str) -> int:
    """The exported drafter's block size (what SGLang drafts per round)."""
    text = host.run(f"cat -- {shlex.quote(drafter)}/config.json").stdout
    try:
        config = json.loads(text)
        block = config.get("block_size") or config["dflash_config"]["block_size"]
        return int(block)
    except (ValueError, KeyError, TypeError):
        raise HostError(host.name, f"{drafter}/config.json states no block_size") from None
