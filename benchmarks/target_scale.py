"""Benchmark: the harness's time estimate (dflash_eval.plan.estimate) against real runs, per phase.

    .venv/bin/python benchmarks/target_scale.py [--sizes 30m,150m,600m] [--threads 2]
        [--prompts 4] [--max-new-tokens 32] [--save FILE] [--measured FILE] [--smoke]
    .venv/bin/python benchmarks/target_scale.py --fit FILE

For each size it builds a random hybrid target as Qwen3.5/3.6 is made (three linear-attention
layers to one full-attention layer, built from its config with random weights, saved in
bfloat16 as the release is) and a random drafter for it, then runs the harness's own command
line with the same flags, each in a fresh process as on an eval host: `plan` (the dry run's
estimate) and `eval` with an empty cache (the measured phases: results.json's timings_s). The
completions are decoded locally (what SGLang would otherwise serve). It prints, per phase,
the measured and the estimated seconds and their difference, and last:

    estimate vs measured, worst phase: N %

the largest |estimate − measured| / measured over every size's CPU-bound phases that take at
least 1 s (shorter ones are start-up noise: shown, not counted); reading the target's weights
waits on the disk and has its own line before it (DISK_PHASES). `--smoke` runs one tiny size with
a few tokens (the suite runs it so); its figures mean nothing.

A shared machine's load slows a run down by as much as the other processes take: each run's
`uptime` is recorded, and measured times are compared as if the run had had its cores to
itself (see `share`); on a shared machine, give the run's autogroup priority as
docs/estimate.md shows. `--save` keeps the measurements with the plan's work; `--fit` fits the
estimate's constants to them without running anything; `--measured` plans again against them
without running eval.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "remote"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._smoke import parse_args

ROOT = Path(__file__).resolve().parents[1]

# Estimated phase → the measured phase (results.json timings_s) it is compared with. The
# fidelity check runs inside the measured hidden_states phase, so the two are added.
MEASURED = {
    "hash_checkpoint": "hash",
    "load_target": "load_target",
    "completions": "completions",
    "hidden_states": "hidden_states",
    "fidelity": "hidden_states",
    "drafter": "drafter",
}
COUNTED_FROM_S = 1.0
# Reading the target's weights waits on the disk: another process's I/O slows it by 2-5x
# (measured), which the CPU share cannot undo, and the benchmark reads weights it has just
# written (a page-cache read says nothing about a cold one). It is shown and its worst error
# printed apart; the fit and the worst phase are over the CPU-bound phases.
DISK_PHASES = ("load_target",)
# What --fit adjusts: the compute rates' common factor, the streaming rate and the fixed costs
# of the CPU-bound phases (see dflash_eval.plan.estimate); not the disk rate or LOAD_START_S.
FITTED_CONSTANTS = (
    "FITTED",
    "BANDWIDTH_PER_CORE",
    "DECODE_LAYER_STEP_S",
    "FORWARD_LAYER_PASS_S",
    "ANCHOR_WALK_S",
)
BLOCK_SIZE = 16
DRAFTER_LAYERS = 2


@dataclass(frozen=True)
class Size:
    hidden: int
    intermediate: int
    layers: int  # three linear-attention layers to one full-attention layer
    heads: int
    kv_heads: int
    head_dim: int
    linear_key_heads: int
    linear_value_heads: int
    linear_head_dim: int


SIZES = {
    "smoke": Size(64, 128, 4, 4, 2, 16, 2, 4, 16),
    "30m": Size(512, 1536, 8, 8, 2, 64, 4, 8, 64),
    "150m": Size(1024, 2816, 12, 8, 2, 128, 8, 16, 64),
    "600m": Size(1536, 4096, 20, 12, 2, 128, 8, 16, 128),
}
SMOKE = {"sizes": "smoke", "prompts": 1, "max_new_tokens": 4, "threads": 1, "repeat": 1}


def build_target(directory: Path, size: Size, tokenizer_dir: Path) -> int:
    """A random Qwen3.5 text model saved in bfloat16 with the lab's tokenizer; its parameters."""
    import torch
    from transformers import AutoTokenizer, Qwen3_5ForCausalLM, Qwen3_5TextConfig

    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    config = Qwen3_5TextConfig(
        vocab_size=len(tokenizer),
        hidden_size=size.hidden,
        intermediate_size=size.intermediate,
        num_hidden_layers=size.layers,
        num_attention_heads=size.heads,
        num_key_value_heads=size.kv_heads,
        head_dim=size.head_dim,
        linear_num_key_heads=size.linear_key_heads,
        linear_num_value_heads=size.linear_value_heads,
        linear_key_head_dim=size.linear_head_dim,
        linear_value_head_dim=size.linear_head_dim,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(0)
    model = Qwen3_5ForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(str(directory))
    tokenizer.save_pretrained(str(directory))
    return sum(parameter.numel() for parameter in model.parameters())


def build_drafter(path: Path, size: Size, mask_token_id: int) -> None:
    """A random drafter reading three of the target's layers, saved as a training checkpoint."""
    import torch
    from dflash_eval.drafter.config import DrafterConfig
    from dflash_eval.drafter.model import DFlashDrafter

    config = DrafterConfig(
        hidden_size=size.hidden,
        intermediate_size=size.intermediate,
        num_hidden_layers=DRAFTER_LAYERS,
        num_attention_heads=size.heads,
        num_key_value_heads=size.kv_heads,
        head_dim=size.head_dim,
        target_layer_ids=(1, size.layers // 2, size.layers - 2),
        block_size=BLOCK_SIZE,
        mask_token_id=mask_token_id,
    )
    torch.manual_seed(1)
    drafter = DFlashDrafter(config)
    state = {f"module.{name}": tensor for name, tensor in drafter.state_dict().items()}
    torch.save({"model_state_dict": state, "config": config.to_hf_dict(), "step": 1}, path)


def harness(command: str, flags: list[str]) -> tuple[list[dict], float]:
    """The harness's command in a fresh process: its stdout events and the CPU seconds it
    used (all threads, user and system)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    done = subprocess.run(
        [sys.executable, "-m", "dflash_eval", command, *flags],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT / "remote")},
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        raise SystemExit(
            f"benchmark failed: dflash_eval {command} exited {done.returncode}:\n"
            f"{done.stderr[-3000:]}"
        )
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")], cpu


def measure(name: str, size: Size, args: argparse.Namespace, work: Path, models) -> dict:
    """The plan's estimate and (unless --measured has them) the run's timings for one size."""
    from transformers import AutoTokenizer

    from dflash_lab.models import MASK_TOKEN

    target = work / name / "target"
    parameters = build_target(target, size, models.target_dir)
    tokenizer = AutoTokenizer.from_pretrained(str(target))
    checkpoint = work / name / "checkpoint.pt"
    build_drafter(checkpoint, size, tokenizer.convert_tokens_to_ids(MASK_TOKEN))
    flags = [
        "--checkpoint", str(checkpoint),
        "--target", str(target),
        "--prompts", str(models.prompts),
        "--num-prompts", str(args.prompts),
        "--max-new-tokens", str(args.max_new_tokens),
        "--threads", str(args.threads),
        "--ddtree", "4,8",
    ]  # fmt: skip

    def empty_cache(repeat: int) -> list[str]:
        return ["--cache-dir", str(work / name / f"cache-{repeat}")]

    events, _ = harness("plan", [*flags, *empty_cache(0)])
    [plan] = [event["plan"] for event in events if event["event"] == "plan"]
    run = {"parameters": parameters, "estimate": plan["estimate"], "dtype": plan["target"]["dtype"]}
    if name in args.earlier:
        run.update({key: args.earlier[name][key] for key in ("measured", "cpu_seconds", "uptime")})
    else:
        repeats = []
        for repeat in range(args.repeat):  # each with an empty cache
            out = work / name / f"results-{repeat}.json"
            _, cpu = harness("eval", [*flags, *empty_cache(repeat), "--out", str(out)])
            repeats.append((json.loads(out.read_text())["timings_s"], cpu))
        run.update(median_of(repeats), uptime=uptime())
    shutil.rmtree(work / name)  # the largest target is GBs
    return run


def median_of(repeats: list[tuple[dict[str, float], float]]) -> dict:
    """Repeated runs of one size as one: each phase's median wall time, and CPU seconds at the
    median share (so `share` reads the typical run's), with every repeat kept."""
    phases = {phase for timings, _ in repeats for phase in timings}
    measured = {
        phase: statistics.median(timings.get(phase, 0.0) for timings, _ in repeats)
        for phase in sorted(phases)
    }
    shares = statistics.median(cpu / timings["total"] for timings, cpu in repeats)
    return {
        "measured": measured,
        "cpu_seconds": shares * measured["total"],
        "repeats": [{"measured": timings, "cpu_seconds": cpu} for timings, cpu in repeats],
    }


def share(run: dict) -> float:
    """The share of its threads' cores the run kept busy (CPU seconds / wall seconds /
    threads): measured times are compared as if the run had had its cores to itself, so that
    the load other processes put on a shared machine is not fitted into the constants. The
    scaling is the same for every phase (an average over the run)."""
    return run["cpu_seconds"] / run["measured"]["total"] / run["estimate"]["cores"]


def paired(run: dict, estimated: dict[str, float]) -> dict[str, tuple[float, float, float]]:
    """Per measured phase: (estimated s, measured wall s, measured s at full share)."""
    pairs: dict[str, list[float]] = {}
    for phase, seconds in estimated.items():
        if phase in MEASURED:
            pairs.setdefault(MEASURED[phase], [0.0])[0] += seconds
    wall = run["measured"]
    return {
        phase: (guess, wall.get(phase, 0.0), wall.get(phase, 0.0) * share(run))
        for phase, [guess] in pairs.items()
    }


def differences(run: dict, estimated: dict[str, float], disk: bool = False) -> list[float]:
    """(estimate − measured) / measured of the CPU-bound phases that count (at least
    COUNTED_FROM_S); `disk`: of the disk-bound ones instead."""
    return [
        (guess - real) / real
        for phase, (guess, _, real) in paired(run, estimated).items()
        if real >= COUNTED_FROM_S and (phase in DISK_PHASES) == disk
    ]


def compare(name: str, run: dict) -> list[float]:
    """Print one size's phases; the differences (fractions) of the phases that count."""
    estimate, measured = run["estimate"], run["measured"]
    print(
        f"{name}: {run['parameters'] / 1e6:.0f} M parameters (target in {run['dtype']}), "
        f"threads {estimate['cores']}, feature class {estimate['feature_class']}; measured at "
        f"{run['uptime']}; the run kept {share(run):.0%} of its cores busy"
    )
    pairs = paired(run, estimate["phases"])
    for phase, (guess, wall, real) in pairs.items():
        difference = (guess - real) / real if real > 0 else float("inf")
        note = "" if real >= COUNTED_FROM_S else f"  (under {COUNTED_FROM_S:g} s: not counted)"
        note += "  (disk-bound: apart)" if phase in DISK_PHASES else ""
        print(
            f"  {phase:>14}: measured {wall:8.2f} s wall, {real:7.2f} s at full share, "
            f"estimated {guess:7.2f} s, {difference:+6.0%}{note}"
        )
    others = sorted(set(measured) - set(pairs) - {"total"})
    print(f"  not estimated: {', '.join(f'{p} {measured[p]:.2f} s' for p in others)}")
    print(
        f"  total: measured {measured['total']:.2f} s wall, {measured['total'] * share(run):.2f} s "
        f"at full share, estimated {estimate['seconds']:.2f} s"
    )
    return differences(run, estimate["phases"])


def worst_disk_phase(runs: list[dict]) -> str:
    """The line of the disk-bound phases' worst error."""
    found = [abs(e) for run in runs for e in differences(run, run["estimate"]["phases"], True)]
    worst = f"{max(found) * 100:.0f} %" if found else "none counted"
    return f"reading the weights (disk-bound, not in the worst phase): {worst}"


def fit(runs: dict[str, dict]) -> None:
    """Print the constants of dflash_eval.plan.estimate that fit the saved runs best, the error of
    every counted phase with them, and the worst. The search is multiplicative, one constant
    at a time from the current values, and minimises the sum of |log(estimate / measured)|^6
    (close to the worst phase's error, but smooth enough not to stall on a ridge). The
    estimate's own Machine computes every guess: the search only sets the module's constants."""
    from dflash_eval.plan import estimate

    def errors() -> dict[str, list[float]]:
        found = {}
        for name, run in runs.items():
            machine = estimate.Machine(run["estimate"]["cores"], run["estimate"]["feature_class"])
            phases = {
                phase: machine.seconds(estimate.Phase(**work))
                for phase, work in run["estimate"]["work"].items()
            }
            found[name] = differences(run, phases)
        return found

    def cost() -> float:
        return sum(math.log1p(e) ** 6 for each in errors().values() for e in each)

    def worst() -> float:
        return max((abs(e) for each in errors().values() for e in each), default=0.0)

    print(f"with the current constants, worst phase: {worst() * 100:.0f} %")
    print(worst_disk_phase(list(runs.values())))
    best = cost()
    for _ in range(1000):
        improved = False
        for constant in FITTED_CONSTANTS:
            for factor in (0.5, 0.8, 0.95, 0.99, 1.01, 1.05, 1.25, 2.0):
                before = getattr(estimate, constant)
                setattr(estimate, constant, before * factor)
                if (now := cost()) < best * (1 - 1e-9):
                    best, improved = now, True
                else:
                    setattr(estimate, constant, before)
        if not improved:
            break
    for constant in FITTED_CONSTANTS:
        print(f"  {constant} = {getattr(estimate, constant):.3g}")
    for name, each in errors().items():
        print(f"  {name}: " + ", ".join(f"{e:+.0%}" for e in each))
    print(f"fitted, worst phase: {worst() * 100:.0f} %")


def saved_runs(files: list[Path]) -> dict[str, dict]:
    """The runs of several --save files, each named `FILE-STEM SIZE`."""
    return {
        f"{path.stem} {name}": run
        for path in files
        for name, run in json.loads(path.read_text()).items()
    }


def uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="30m,150m,600m", help=f"of {', '.join(SIZES)}")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument(
        "--repeat",
        type=int,
        default=3,
        help="eval runs per size, each phase's median kept (one run's phases vary by ~20 %%)",
    )
    parser.add_argument("--save", type=Path, help="write each size's measurements to this JSON")
    parser.add_argument(
        "--measured",
        type=Path,
        help="take the measurements from a --save file instead of running eval again (the "
        "estimate is planned anew: for checking constants fitted on a run)",
    )
    parser.add_argument(
        "--fit",
        type=Path,
        nargs="+",
        help="fit the estimate's constants to --save files together (no run) and print them: "
        "measure quiet and loaded, and fit both",
    )
    args = parse_args(parser, SMOKE)
    if args.fit:
        return fit(saved_runs(args.fit))
    args.earlier = json.loads(args.measured.read_text()) if args.measured else {}
    from dflash_lab.content import MODEL_CACHE
    from dflash_lab.models import build_lab_models

    models = build_lab_models(MODEL_CACHE)  # its tokenizer and prompts
    print(f"before: {uptime()}")
    counted, saved = [], {}
    with tempfile.TemporaryDirectory(prefix="dflash-target-scale-") as work:
        for name in args.sizes.split(","):
            if name not in SIZES:
                raise SystemExit(f"--sizes: {name} is not one of {', '.join(SIZES)}")
            run = measure(name, SIZES[name], args, Path(work), models)
            counted += compare(name, run)
            saved[name] = {
                key: run[key] for key in ("measured", "cpu_seconds", "uptime", "estimate")
            }
            if args.save:
                args.save.write_text(json.dumps(saved, indent=1) + "\n")
    print(f"after: {uptime()}")
    print(worst_disk_phase(list(saved.values())))
    worst = max((abs(d) for d in counted), default=0.0)
    print(f"estimate vs measured, worst phase: {worst * 100:.0f} %")


if __name__ == "__main__":
    main()
