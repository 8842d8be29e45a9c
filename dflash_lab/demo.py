"""`make demo`: the whole pipeline on a throwaway local lab, through the real `fab` tasks.

Lab up (two eval hosts, a tiny target, drafter checkpoints trained to steps 2000/4000/6000)
→ check-hosts → setup-eval-host → list/stage a checkpoint → a run-eval sweep over all three
steps spread across both eval hosts → compare (table + plots) → lab down. Each step prints the
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
    prompts = str(ROOT / lab.LAB_PROMPTS)
    steps = [
        ["lab-up", "--dir", str(ROOT), "--content", "models", "--eval-hosts", "2"],
        ["check-hosts"],
        ["setup-eval-host"],
        ["list-checkpoints"],
        ["stage-checkpoint", "--step", "4000", "--to", "eval"],
        ["stage-checkpoint", "--step", "4000", "--to", "eval"],  # again: "already staged"
        ["run-eval", "--steps", "2000,4000,6000", "--prompts", prompts, "--reference", *HARNESS],
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
    print(f"\ndemo finished in {time.monotonic() - started:.0f} s")
    print(f"results (one directory per run): {KEEP}")
    print(
        f"plots: {KEEP / 'plots' / 'tau_vs_step.png'}, "
        f"{KEEP / 'plots' / 'acceptance_per_position.png'}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
