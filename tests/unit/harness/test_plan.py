"""`python -m dflash_eval plan`: the cache counted with eval's own keys (cold 0/n, after an
eval n/n), memory and time derived from the host facts it is given, and nothing written."""

from __future__ import annotations

import hashlib
import io
import json
from pathlib import Path

import pytest
import torch
from dflash_eval import cli
from dflash_eval.contract.errors import HarnessError
from dflash_eval.contract.progress import Progress
from dflash_eval.plan.drafter import UNKNOWN_UNTIL_STAGED, UNREADABLE
from dflash_eval.plan.dry_run import HostFacts, make_plan, summary_lines
from dflash_eval.plan.estimate import (
    ANCHOR_WALK_S,
    DECODE_LAYER_STEP_S,
    DISK_BYTES_PER_SECOND,
    FORWARD_LAYER_PASS_S,
    LOAD_START_S,
    Machine,
    Phase,
    fixed_seconds,
    gflops_per_core,
    parse_cpuinfo,
)
from dflash_eval.run.evaluate import run_eval
from dflash_eval.run.options import EvalOptions
from dflash_eval.target.dtype import parse_meminfo

from .helpers import save_tiny_qwen3_5

GIB = 2**30
CPUINFO = """processor\t: 0
vendor_id\t: GenuineIntel
flags\t\t: fpu sse2 avx2 avx512f avx512_bf16 amx_bf16 amx_tile
processor\t: 1
flags\t\t: fpu sse2 avx2 avx512f avx512_bf16 amx_bf16 amx_tile
"""
AVX2_ONLY = "processor\t: 0\nflags\t\t: fpu sse2 avx2\n"
MEMINFO = "MemTotal:       65536000 kB\nMemAvailable:   {kb} kB\n"


def facts(cpuinfo: str = CPUINFO, available_kb: int = 32 * 2**20, cores: int = 8) -> HostFacts:
    return HostFacts(parse_meminfo(MEMINFO.format(kb=available_kb)), parse_cpuinfo(cpuinfo), cores)


def options(lab, tmp_path: Path, **overrides) -> EvalOptions:
    chosen = EvalOptions(
        checkpoint=lab.checkpoints[6000],
        target=lab.target_dir,
        out=tmp_path / "r.json",
        prompts=lab.prompts,
        num_prompts=3,
        max_new_tokens=24,
        cache_dir=tmp_path / "cache",
        ddtree=[4],
    )
    for name, value in overrides.items():
        setattr(chosen, name, value)
    return chosen


def tree_digest(*roots: Path) -> dict[str, str]:
    """Every path under the roots with the sha256 of its content (directories as such)."""
    listing = {}
    for root in roots:
        for path in sorted([root, *root.rglob("*")]) if root.exists() else []:
            content = path.read_bytes() if path.is_file() else b"<dir>"
            listing[str(path)] = hashlib.sha256(content).hexdigest()
    return listing


def test_a_cold_cache_counts_no_hits_and_an_eval_fills_it(lab, tmp_path):
    chosen = options(lab, tmp_path)
    watched = (tmp_path, Path(lab.target_dir), Path(lab.checkpoints[6000]).parent)
    before = tree_digest(*watched)
    cold = make_plan(chosen, facts())
    assert tree_digest(*watched) == before  # no cache entry, no output, no directory
    assert cold["cache"]["completions"] == {"hits": 0, "total": 3}
    assert cold["cache"]["hidden_states"] == {"hits": 0, "total": 3}
    assert cold["cache"]["completions_to_compute"] == 3
    assert cold["target"]["body_loads"] is True
    assert cold["drafter"]["source"] == "checkpoint"
    assert cold["drafter"]["block_size"] == 8 and cold["drafter"]["target_layer_ids"]
    assert cold["run"] == {
        "mode": "greedy",
        "sampling": None,
        "paths": 1,
        "threads": 6,
        "device": "cpu",
    }

    run_eval(chosen, Progress(quiet=True))
    warm = make_plan(chosen, facts())
    assert warm["cache"]["completions"] == {"hits": 3, "total": 3}
    assert warm["cache"]["hidden_states"] == {"hits": 3, "total": 3}
    assert warm["cache"]["completions_to_compute"] == 0
    assert warm["target"]["body_loads"] is False
    # Less to compute, less time: the completions and the forwards are gone from the estimate.
    assert warm["estimate"]["phases"]["completions"] == 0
    assert warm["estimate"]["phases"]["hidden_states"] == 0
    assert cold["estimate"]["phases"]["completions"] > 0

    longer = make_plan(options(lab, tmp_path, max_new_tokens=25), facts())
    assert longer["cache"]["completions"]["hits"] == 0  # another key, as eval would see it
    sglang = make_plan(options(lab, tmp_path, sglang_url="http://u:pw@127.0.0.1:9/"), facts())
    assert sglang["cache"]["completions"]["hits"] == 0  # SGLang's completions are keyed apart
    assert "completions" not in sglang["estimate"]["phases"]  # the server computes them


def test_sampled_paths_multiply_the_completions_the_forwards_and_the_walks(lab, tmp_path):
    sampled = {"temperature": 8.0, "top_k": 40}
    one = make_plan(options(lab, tmp_path, **sampled, paths=1), facts())
    three = make_plan(options(lab, tmp_path, **sampled, paths=3), facts())
    assert three["cache"]["completions"] == {"hits": 0, "total": 9}
    assert three["cache"]["paths"] == 3 and one["cache"]["paths"] == 1
    # The plan prints the run's decisions as `eval` makes them (run/prepared.py).
    assert three["run"]["mode"] == "sampled" and three["run"]["paths"] == 3
    assert (
        three["run"]["sampling"]["temperature"] == 8.0 and three["run"]["sampling"]["top_k"] == 40
    )
    for phase in ("completions", "hidden_states", "drafter"):
        ratio = three["estimate"]["phases"][phase] / one["estimate"]["phases"][phase]
        assert ratio == pytest.approx(3, rel=0.01), phase
    assert "(3 sampled paths per prompt)" in "\n".join(summary_lines(three))


def test_a_completion_past_the_targets_context_is_a_problem_as_the_run_refuses_it(lab, tmp_path):
    too_long = options(lab, tmp_path, max_new_tokens=1020)  # the lab target holds 1024
    plan = make_plan(too_long, facts())
    refusals = [p for p in plan["problems"] if "past the target's context of 1024" in p]
    assert len(refusals) == 3, plan["problems"]  # each of the 3 prompts, named
    assert all(p.startswith("the run would refuse to start: Prompt ") for p in refusals)
    with pytest.raises(HarnessError) as refused:
        run_eval(too_long, Progress(quiet=True))
    assert str(refused.value) in refusals[0]
    assert not [p for p in make_plan(options(lab, tmp_path), facts())["problems"] if "context" in p]


def test_a_later_turn_is_unknown_until_the_turn_before_is_cached(lab, tmp_path):
    prompts = tmp_path / "turns.jsonl"
    prompts.write_text(json.dumps({"id": "chat", "turns": ["def add(a, b):", "and sub?"]}) + "\n")
    chosen = options(lab, tmp_path, prompts=prompts, num_prompts=None)
    cold = make_plan(chosen, facts())
    assert cold["cache"]["completions"] == {"hits": 0, "total": 2}
    assert cold["cache"]["unknown"] == 1  # its prompt holds the first turn's reply
    run_eval(chosen, Progress(quiet=True))
    warm = make_plan(chosen, facts())
    assert warm["cache"]["completions"] == {"hits": 2, "total": 2}
    assert warm["cache"]["hidden_states"] == {"hits": 2, "total": 2}
    assert warm["cache"]["unknown"] == 0


def test_other_drafter_layers_miss_the_hidden_states_only(lab, tmp_path):
    chosen = options(lab, tmp_path, num_prompts=2)
    run_eval(chosen, Progress(quiet=True))
    layers = make_plan(chosen, facts())["drafter"]["target_layer_ids"]
    other = options(lab, tmp_path, num_prompts=2, target_layer_ids=[0, *layers[1:]])
    plan = make_plan(other, facts())
    if plan["problems"]:  # the checkpoint refuses other layers: then so would eval
        pytest.skip(f"drafter refuses other layers: {plan['problems']}")
    assert plan["cache"]["completions"]["hits"] == 2
    assert plan["cache"]["hidden_states"]["hits"] == 0


def test_memory_and_time_follow_the_host_facts(lab, tmp_path):
    chosen = options(lab, tmp_path)
    roomy = make_plan(chosen, facts(available_kb=32 * 2**20))
    target = roomy["target"]
    assert target["parameters"] > 0 and target["saved_dtype"] == "float32"
    assert target["memory_needed_bytes"] >= target["saved_bytes"]  # float32 as saved
    assert target["fits"] is True
    assert roomy["host"]["memory_available_bytes"] == 32 * GIB
    tight = make_plan(chosen, facts(available_kb=target["saved_bytes"] // 2048))
    assert tight["target"]["fits"] is False
    assert roomy["host"]["cpu"]["flags"] == [
        "amx_bf16",
        "amx_tile",
        "avx512_bf16",
        "avx512f",
        "avx2",
    ]
    assert roomy["estimate"]["feature_class"] == "amx-bf16"
    slow = make_plan(chosen, facts(AVX2_ONLY, cores=2))
    assert slow["estimate"]["feature_class"] == "avx2" and slow["estimate"]["cores"] == 2
    assert slow["estimate"]["seconds"] > roomy["estimate"]["seconds"] > 0
    threads = make_plan(options(lab, tmp_path, threads=3), facts())
    assert threads["estimate"]["cores"] == 3  # --threads is what the run uses


def test_the_estimate_assumes_the_threads_the_run_then_uses(lab, tmp_path):
    many = make_plan(options(lab, tmp_path), facts(cores=45))
    assert many["host"]["cores"] == 45 and many["host"]["threads"] == 43
    assert many["estimate"]["cores"] == 43  # 45 physical cores less the reserve
    chosen = options(lab, tmp_path, num_prompts=1, max_new_tokens=8)
    here = make_plan(chosen, HostFacts.read())
    run_eval(chosen, Progress(quiet=True))
    ran = json.loads(chosen.out.read_text())
    assert ran["host"]["torch_threads"] == here["estimate"]["cores"] == here["host"]["threads"]


def test_the_time_model_is_flops_over_rate_or_bytes_over_bandwidth():
    assert parse_cpuinfo(AVX2_ONLY).processors == 1
    assert parse_cpuinfo(CPUINFO).feature_class == "amx-bf16"
    assert parse_cpuinfo("processor : 0\nflags : avx512f avx512_bf16\n").feature_class == (
        "avx512-bf16"
    )
    assert parse_cpuinfo("").feature_class == "baseline"
    machine = Machine(2, "avx2")
    rate = 2 * gflops_per_core("avx2")["float32"] * 1e9
    assert machine.seconds(Phase(flops=rate * 3)) == pytest.approx(3.0)
    # bf16 without a bf16 unit is slower than float32 for the same work.
    assert machine.seconds(Phase(flops=rate, dtype="bfloat16")) > 1.0
    # A decode step streams the weights: bandwidth-bound when that takes longer.
    assert machine.seconds(Phase(flops=1.0, streamed_bytes=machine.bandwidth * 5)) == (
        pytest.approx(5.0)
    )
    assert machine.seconds(Phase(disk_bytes=2 * DISK_BYTES_PER_SECOND)) == pytest.approx(2.0)
    # Fixed costs add to the rest, whatever the cores.
    passes = Phase(
        flops=rate * 3,
        decode_layer_steps=40,
        forward_layer_passes=4,
        anchor_walks=7,
        target_loads=1,
    )
    fixed = 40 * DECODE_LAYER_STEP_S + 4 * FORWARD_LAYER_PASS_S + 7 * ANCHOR_WALK_S + LOAD_START_S
    assert fixed_seconds(passes) == pytest.approx(fixed)
    assert Machine(64, "avx2").seconds(passes) == pytest.approx(3.0 / 32 + fixed)


def test_without_a_staged_checkpoint_the_profile_or_unknown(lab, tmp_path):
    missing = tmp_path / "not-staged" / "checkpoint.pt"
    unknown = make_plan(options(lab, tmp_path, checkpoint=missing), facts())
    assert unknown["drafter"]["source"] == UNKNOWN_UNTIL_STAGED
    assert unknown["cache"]["unknown"] == 3
    assert unknown["target"]["body_loads"] is None
    assert not (tmp_path / "not-staged").exists()

    chosen = options(lab, tmp_path, num_prompts=2)
    run_eval(chosen, Progress(quiet=True))
    staged = make_plan(chosen, facts())["drafter"]
    profile = tmp_path / "profile.json"
    profile.write_text(
        json.dumps(
            {"block_size": staged["block_size"], "target_layer_ids": staged["target_layer_ids"]}
        )
    )
    planned = make_plan(
        options(lab, tmp_path, num_prompts=2, checkpoint=missing, drafter_profile=profile),
        facts(),
    )
    assert planned["drafter"]["source"] == "profile"
    assert planned["cache"]["completions"] == {"hits": 2, "total": 2}
    assert planned["cache"]["hidden_states"] == {"hits": 2, "total": 2}


def test_a_linear_attention_target_without_memory_for_float32_is_a_refusal(lab, tmp_path):
    target = save_tiny_qwen3_5(tmp_path / "t", lab.target_dir, 101, False, dtype=torch.bfloat16)
    chosen = options(lab, tmp_path, target=target, target_layer_ids=[1, 2], block_size=4)
    chosen.checkpoint = tmp_path / "absent.pt"
    roomy = make_plan(chosen, facts())
    assert roomy["target"]["dtype"] == "float32"  # what eval chooses for linear attention
    assert roomy["target"]["memory_needed_bytes"] > roomy["target"]["saved_bytes"] * 2
    assert roomy["drafter"]["source"] == "command line"
    refused = make_plan(chosen, facts(available_kb=1))
    assert refused["target"]["dtype"] is None
    assert any("would refuse" in problem for problem in refused["problems"])


def test_the_command_reads_its_inputs_from_stdin(lab, tmp_path, monkeypatch, capsys):
    prompts = [json.dumps({"id": f"s{i}", "prompt": f"count to {i}"}) for i in range(2)]
    monkeypatch.setattr("sys.stdin", io.StringIO(json.dumps({"prompts": "\n".join(prompts)})))
    argv = ["plan", "--checkpoint", str(lab.checkpoints[6000]), "--target", str(lab.target_dir)]
    argv += ["--cache-dir", str(tmp_path / "cache"), "--max-new-tokens", "8"]
    assert cli.main([*argv, "--inputs-on-stdin"]) == 0
    out, err = capsys.readouterr()
    [event] = [json.loads(line) for line in out.splitlines()]
    assert event["event"] == "plan"
    assert event["plan"]["prompts"] == {"count": 2, "source": "sent on stdin"}
    assert "cache: completions 0/2" in err
    assert list(tmp_path.iterdir()) == []  # not even the cache directory

    monkeypatch.setattr("sys.stdin", io.StringIO("[1, 2]"))
    assert cli.main([*argv, "--inputs-on-stdin"]) == 2
    assert "expected a JSON object" in capsys.readouterr().err
    assert cli.main(["plan", "--checkpoint", "x", "--target", str(tmp_path / "none")]) == 2
    assert "--target" in capsys.readouterr().err


def test_a_drafter_whose_weights_do_not_fit_its_config_is_a_problem_before_the_run(lab, tmp_path):
    """The dry run checks what the run checks before building anything: here an fc that
    reads 3 target layers while the config names 2 (the run would stop at loading)."""
    from dflash_lab.faulty import build_faulty_drafter

    plan = make_plan(options(lab, tmp_path, checkpoint=build_faulty_drafter(lab, "fc-width")))
    assert plan["drafter"]["source"] == UNREADABLE
    [problem] = [p for p in plan["problems"] if "fc.weight" in p]
    assert "takes 192 input features" in problem and "K=2 target layers" in problem
