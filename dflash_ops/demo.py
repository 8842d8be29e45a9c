"""`make demo`: the whole pipeline on a throwaway local lab, through the real `fab` tasks.

Each step prints the command it runs, so the demo doubles as a walkthrough. The lab is
removed at the end, also when a step fails or the demo is interrupted.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

from dflash_ops import lab

ROOT = Path(os.environ.get("DFLASH_DEMO_DIR", "/tmp/dflash-demo"))
FAB = str(Path(sys.executable).parent / "fab")


def main() -> int:
    if (ROOT / lab.STATE_FILE).exists():  # left over from an interrupted demo
        lab.load(ROOT).down()
    started = time.monotonic()
    env = {**os.environ, "DFLASH_INVENTORY": str(ROOT / "inventory.yaml")}
    steps = [
        ["lab-up", "--dir", str(ROOT)],
        ["check-hosts"],
    ]
    try:
        for step in steps:
            print(f"\n$ fab {shlex.join(step)}", flush=True)
            if subprocess.run([FAB, *step], env=env).returncode != 0:
                print(f"\ndemo: `fab {step[0]}` failed (see above)", file=sys.stderr)
                return 1
    finally:
        print(f"\n$ fab lab-down --dir {ROOT}", flush=True)
        subprocess.run([FAB, "lab-down", "--dir", str(ROOT)], env=env)
    print(f"\ndemo finished in {time.monotonic() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
