"""`make demo`: the whole pipeline on a throwaway local lab, through the real `fab` tasks.

Lab up (two eval hosts, a tiny target, drafter checkpoints trained to steps 2000/4000/6000)
→ check-hosts → setup-eval-host → list/stage a checkpoint → a run-eval sweep over all three
steps spread across both eval hosts, on two named prompt sets (small local files shaped like
GSM8K and MT-Bench: the hub is never contacted) → compare (table with 95 % intervals, plots,
the HTML report) → lab down. Then the same sweep (with the reference drafter) on a second lab
whose target is the miniature Qwen3.6 (`dflash-lab up --content qwen3.6`: a vision-language wrapper
with hybrid attention, MTP weights and sharded bf16 files, loaded text-only; its reference
drafter has causal sliding-window layers). Each step prints the command it runs, so the demo
doubles as a walkthrough. Each lab is removed at the end of its part, also when a step fails
or the demo is interrupted; the results and plots are kept.

Each run builds its labs in a directory of its own, made for it (`tempfile.mkdtemp` under the
system temp dir, or `$DFLASH_DEMO_DIR` if no such directory exists yet), says where, and removes
only the labs in that directory: another person's demo, or a lab built by hand, is never
found, let alone taken down. A second demo in the same checkout (which would replace the
first one's `demo-results/`) is refused while the first runs.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from dflash_lab import lab
from dflash_ops.core.errors import LabError

KEEP = Path(os.environ.get("DFLASH_DEMO_RESULTS", "demo-results")).resolve()
BIN = Path(sys.executable).parent  # fab, and dflash-lab for the lab's own tasks
# Enough prompts and tokens to see τ move, small enough for 2 CPU cores.
HARNESS = ["--max-new-tokens", "96", "--ddtree", "4,8,16,32"]
QWEN36 = "qwen3.6"  # the second part's results, under the first's
# Shorter on the miniature Qwen3.6: its completions are decoded on CPU in float32 through
# transformers' pure-torch linear-attention kernel, about 3 tokens/s here.
QWEN36_RUN = ["--max-new-tokens", "48", "--ddtree", "4,8,16"]


def main() -> int:
    try:
        with results_lock(KEEP):
            root = run_directory(os.environ.get("DFLASH_DEMO_DIR"))
            print(
                f"demo: this run's labs are built in {root} (its own; removed at the end, "
                f"or by `dflash-lab down --dir {root / 'lab'}` if the demo is killed)",
                flush=True,
            )
            try:
                return demo(root)
            finally:
                take_down(root / "lab")
                shutil.rmtree(root / "sets", ignore_errors=True)
                shutil.rmtree(root / "datasets", ignore_errors=True)
                with contextlib.suppress(OSError):  # left only if a lab would not go
                    root.rmdir()
    except LabError as exc:
        print(f"demo: {exc}", file=sys.stderr)
        return 1


def demo(root: Path) -> int:
    """Both parts, each on a lab at `root`/lab; the exit status."""
    started = time.monotonic()
    lab_dir = root / "lab"
    env = {**os.environ, "DFLASH_INVENTORY": str(lab_dir / "inventory.yaml")}
    if not sys.stdout.isatty():  # a log file or a pipe: room for the wide tables
        env.setdefault("COLUMNS", "200")
    env |= {
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "DFLASH_DATASETS_CACHE": str(root / "datasets"),
    }
    dataset = demo_sets(root / "sets")
    sweep = ["fab", "run-eval", "--steps", "2000,4000,6000", "--dataset", dataset, "--reference"]
    today = [
        ["dflash-lab", "up", "--dir", str(lab_dir), "--content", "models", "--eval-hosts", "2"],
        ["fab", "check-hosts"],
        ["fab", "setup-eval-host"],
        ["fab", "list-checkpoints"],
        ["fab", "stage-checkpoint", "--step", "4000", "--to", "eval"],
        ["fab", "stage-checkpoint", "--step", "4000", "--to", "eval"],  # again: "already staged"
        [*sweep, *HARNESS],
        ["fab", "eval-status"],
        ["fab", "compare", "--plots", "--report"],
    ]
    qwen36 = [
        ["dflash-lab", "up", "--dir", str(lab_dir), "--content", "qwen3.6"],
        ["fab", "setup-eval-host"],
        [*sweep, *QWEN36_RUN],
        ["fab", "compare", "--plots", "--report"],
    ]
    shutil.rmtree(KEEP, ignore_errors=True)
    for steps, keep in ((today, KEEP), (qwen36, KEEP / QWEN36)):
        if not run_part(steps, env, lab_dir, keep):
            return 1
    print(f"\ndemo finished in {time.monotonic() - started:.0f} s")
    for where in (KEEP, KEEP / QWEN36):
        print(f"results (one directory per run): {where}")
        print(f"plots: {where / 'plots'}")
        print(f"report: {where / 'report.html'}")
    return 0


def run_directory(chosen: str | None) -> Path:
    """A new directory for this run alone: `chosen`, which must not exist yet (one that does
    may hold another demo's lab: refused, never cleared), else a private one made under the
    system temp dir."""
    if chosen is None:
        return Path(tempfile.mkdtemp(prefix="dflash-demo-"))
    root = Path(chosen).resolve()
    try:
        root.mkdir(mode=0o700, parents=True)
    except FileExistsError:
        raise LabError(
            f"DFLASH_DEMO_DIR {root} already exists (another demo's lab, or one of yours?); "
            "the demo builds only in a directory it makes: unset DFLASH_DEMO_DIR, or name one "
            "that does not exist"
        ) from None
    return root


@contextmanager
def results_lock(keep: Path) -> Iterator[None]:
    """Held while a demo runs: a second demo of the same checkout would replace `keep` under
    the first one's feet. The lock goes with the process, however it ends."""
    keep.parent.mkdir(parents=True, exist_ok=True)
    with open(keep.with_name(f"{keep.name}.lock"), "w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise LabError(
                f"another demo is running in this checkout (it writes {keep}); wait for it to "
                "end, or set DFLASH_DEMO_RESULTS to another directory"
            ) from None
        yield


def take_down(lab_dir: Path) -> None:
    """Remove the lab at `lab_dir` (always inside this run's own directory) by its record,
    if there is one (a `dflash-lab up` that failed has removed what it made, record included)."""
    if not (lab_dir / lab.STATE_FILE).exists():
        return
    print(f"\n$ dflash-lab down --dir {lab_dir}", flush=True)
    subprocess.run([BIN / "dflash-lab", "down", "--dir", str(lab_dir)])


def run_part(steps: list[list[str]], env: dict[str, str], lab_dir: Path, keep: Path) -> bool:
    """Run the steps (each a command line: fab, or dflash-lab for the lab) on a fresh lab at
    `lab_dir`, keep its results, and always take the lab down; False when a step failed."""
    try:
        for step in steps:
            print(f"\n$ {shlex.join(step)}", flush=True)
            if subprocess.run([BIN / step[0], *step[1:]], env=env).returncode != 0:
                print(f"\ndemo: `{shlex.join(step[:2])}` failed (see above)", file=sys.stderr)
                return False
        shutil.copytree(lab_dir / "workstation" / "results", keep)
    finally:
        take_down(lab_dir)
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
