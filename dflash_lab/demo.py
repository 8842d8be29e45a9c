"""`make demo`: the whole pipeline on a throwaway local lab, through the real `fab` tasks.

Lab up (two eval hosts, a tiny target, drafter checkpoints trained to steps 2000/4000/6000)
→ check-hosts → setup-eval-host → list/stage a checkpoint → a run-eval sweep over all three
steps spread across both eval hosts, on two named prompt sets (small local files shaped like
GSM8K and MT-Bench: the hub is never contacted) → compare (table with 95 % intervals, plots,
the HTML report) → lab down. Then the same sweep (with the reference drafter) on a second lab
whose target is the miniature Qwen3.6 (`lab-up --content qwen3.6`: a vision-language wrapper
with hybrid attention, MTP weights and sharded bf16 files, loaded text-only; its reference
drafter has causal sliding-window layers). Each step prints the command it runs, so the demo
doubles as a walkthrough. Each lab is removed at the end of its part, also when a step fails
or the demo is interrupted; the results and plots are kept.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

from dflash_lab import lab

ROOT = Path(os.environ.get("DFLASH_DEMO_DIR", "/tmp/dflash-demo"))
KEEP = Path(os.environ.get("DFLASH_DEMO_RESULTS", "demo-results")).resolve()
FAB = str(Path(sys.executable).parent / "fab")
# Enough prompts and tokens to see τ move, small enough for 2 CPU cores.
HARNESS = ["--max-new-tokens", "96", "--ddtree", "4,8,16,32"]
QWEN36 = "qwen3.6"  # the second part's results, under the first's
# Shorter on the miniature Qwen3.6: its completions are decoded on CPU in float32 through
# transformers' pure-torch linear-attention kernel, about 3 tokens/s here.
QWEN36_RUN = ["--max-new-tokens", "48", "--ddtree", "4,8,16"]


def main() -> int:
    if (ROOT / lab.STATE_FILE).exists():  # left over from an interrupted demo
        lab.load(ROOT).down()
    started = time.monotonic()
    env = {**os.environ, "DFLASH_INVENTORY": str(ROOT / "inventory.yaml")}
    if not sys.stdout.isatty():  # a log file or a pipe: room for the wide tables
        env.setdefault("COLUMNS", "200")
    env |= {
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "DFLASH_DATASETS_CACHE": str(ROOT / "datasets"),
    }
    sets = ROOT.parent / f"{ROOT.name}-sets"
    dataset = demo_sets(sets)
    today = [
        ["lab-up", "--dir", str(ROOT), "--content", "models", "--eval-hosts", "2"],
        ["check-hosts"],
        ["setup-eval-host"],
        ["list-checkpoints"],
        ["stage-checkpoint", "--step", "4000", "--to", "eval"],
        ["stage-checkpoint", "--step", "4000", "--to", "eval"],  # again: "already staged"
        [
            "run-eval",
            "--steps",
            "2000,4000,6000",
            "--dataset",
            dataset,
            "--reference",
            *HARNESS,
        ],
        ["eval-status"],
        ["compare"],
    ]
    qwen36 = [
        ["lab-up", "--dir", str(ROOT), "--content", "qwen3.6"],
        ["setup-eval-host"],
        ["run-eval", "--steps", "2000,4000,6000", "--dataset", dataset, "--reference", *QWEN36_RUN],
        ["compare"],
    ]
    shutil.rmtree(KEEP, ignore_errors=True)
    try:
        for steps, keep in ((today, KEEP), (qwen36, KEEP / QWEN36)):
            if not run_part(steps, env, keep):
                return 1
    finally:
        shutil.rmtree(sets, ignore_errors=True)
    print(f"\ndemo finished in {time.monotonic() - started:.0f} s")
    for where in (KEEP, KEEP / QWEN36):
        print(f"results (one directory per run): {where}")
        print(f"plots: {where / 'plots'}")
        print(f"report: {where / 'report.html'}")
    return 0


def run_part(steps: list[list[str]], env: dict[str, str], keep: Path) -> bool:
    """Run the fab steps on a fresh lab, keep its results, and always take the lab down;
    False when a step failed."""
    try:
        for step in steps:
            print(f"\n$ fab {shlex.join(step)}", flush=True)
            if subprocess.run([FAB, *step], env=env).returncode != 0:
                print(f"\ndemo: `fab {step[0]}` failed (see above)", file=sys.stderr)
                return False
        shutil.copytree(ROOT / "workstation" / "results", keep)
    finally:
        print(f"\n$ fab lab-down --dir {ROOT}", flush=True)
        subprocess.run([FAB, "lab-down", "--dir", str(ROOT)], env=env)
    return True


def demo_sets(directory: Path) -> str:
    """`--dataset` for two small local sets, shaped as GSM8K (question/answer) and MT-Bench
    (two-turn conversations), in text the lab's character-level tokenizer knows."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    directory.mkdir(parents=True, exist_ok=True)
    questions = [
        "the quick brown fox?",
        "def add(a, b):",
        "x = [i * i for",
        "2 + 2 = 4, and",
        "for i in range(10):",
        "the cat sat on the",
    ]
    conversations = [
        {"prompt": ["Why is the sky blue?", "print('hello')"], "prompt_id": 81},
        {"prompt": ["SELECT name FROM users", "for (int i = 0;"], "prompt_id": 82},
        {"prompt": ["import os", "def main():"], "prompt_id": 83},
    ]
    gsm8k, mt_bench = directory / "gsm8k.parquet", directory / "mt_bench.parquet"
    pq.write_table(pa.Table.from_pylist([{"question": q, "answer": "4"} for q in questions]), gsm8k)
    pq.write_table(pa.Table.from_pylist(conversations), mt_bench)
    return f"gsm8k={gsm8k},mt-bench={mt_bench}"


if __name__ == "__main__":
    sys.exit(main())
