"""`make demo`: the whole pipeline on a throwaway local lab, through the real `fab` tasks.

Lab up (two eval hosts, a tiny target, drafter checkpoints trained to steps 2000/4000/6000)
→ check-hosts → setup-eval-host → list/stage a checkpoint → a run-eval sweep over all three
steps spread across both eval hosts, on two named prompt sets (small local files shaped like
GSM8K and MT-Bench: the hub is never contacted) → compare (table with 95 % intervals, plots,
the HTML report) → lab down. Each step prints the
command it runs, so the demo doubles as a walkthrough. The lab is removed at the end, also
when a step fails or the demo is interrupted; the results and plots are kept.
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
    steps = [
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
            demo_sets(sets),
            "--reference",
            *HARNESS,
        ],
        ["eval-status"],
        ["compare"],
    ]
    try:
        for step in steps:
            print(f"\n$ fab {shlex.join(step)}", flush=True)
            if subprocess.run([FAB, *step], env=env).returncode != 0:
                print(f"\ndemo: `fab {step[0]}` failed (see above)", file=sys.stderr)
                return 1
        results = ROOT / "workstation" / "results"
        shutil.rmtree(KEEP, ignore_errors=True)
        shutil.copytree(results, KEEP)
    finally:
        print(f"\n$ fab lab-down --dir {ROOT}", flush=True)
        subprocess.run([FAB, "lab-down", "--dir", str(ROOT)], env=env)
        shutil.rmtree(sets, ignore_errors=True)
    print(f"\ndemo finished in {time.monotonic() - started:.0f} s")
    print(f"results (one directory per run): {KEEP}")
    print(f"plots: {KEEP / 'plots'}")
    print(f"report: {KEEP / 'report.html'}")
    return 0


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
