"""The lab's tasks, a program of their own: `dflash-lab up`, `dflash-lab down`, `dflash-lab
status` (a console script; `python -m dflash_lab.tasks` is the same). They are kept out of the
fabfile so that `fab --list` and `dflash-ops --list` show the user's tasks alone.
"""

from __future__ import annotations

import sys
from pathlib import Path

from invoke import Collection
from invoke.exceptions import Exit

from dflash_lab import lab
from dflash_ops.ui.console import console
from dflash_ops.ui.program import make_program
from dflash_ops.ui.task import ops_task

LAB_DIR_HELP = f"lab directory (default: $DFLASH_LAB_DIR, else {lab.DEFAULT_ROOT})"


@ops_task(
    help={
        "dir": LAB_DIR_HELP,
        "eval_hosts": "how many eval hosts (eval, eval2, …)",
        "content": "'random' (checkpoint files of random bytes), 'models' (tiny Qwen3 target + "
        "trained drafter checkpoints) or 'qwen3.6' (the same on a miniature shaped as "
        "Qwen3.6-27B: vision wrapper, hybrid attention, MTP, shards)",
        "checkpoint_size": "size of each random checkpoint, e.g. 4m or 1.2g",
        "trainer_disk": "size of the trainer's disk (tmpfs)",
        "eval_disk": "size of each eval host's disk (tmpfs)",
        "workstation_disk": "size of the workstation's staging disk (tmpfs)",
        "sudo_hosts": "hosts that log in as a non-root user with `become: sudo`, "
        "comma-separated (root only: the lab makes that user)",
        "features_host": "also a features host (CPU) with the target, for extract-features",
    }
)
def lab_up(
    c,
    dir=None,
    eval_hosts=1,
    content="random",
    checkpoint_size="4m",
    trainer_disk="256m",
    eval_disk="3g",
    workstation_disk="256m",
    sudo_hosts=None,
    features_host=False,
):
    """Build the local lab: sshd hosts in network namespaces, disks, keys, inventory."""
    config = lab.LabConfig(
        root=Path(dir) if dir else lab.DEFAULT_ROOT,
        eval_hosts=eval_hosts,
        content=content,
        checkpoint_size=checkpoint_size,
        trainer_disk=trainer_disk,
        eval_disk=eval_disk,
        workstation_disk=workstation_disk,
        sudo_hosts=tuple(name.strip() for name in sudo_hosts.split(",")) if sudo_hosts else (),
        features_host=features_host,
    )
    built = lab.up(config, lab.content_generator(content))
    console.print(
        f"lab up at {built.root} ({built.state.mode} mode): {', '.join(built.state.hosts)}"
    )
    console.print(f"export DFLASH_INVENTORY={built.inventory_path}")


@ops_task(help={"dir": LAB_DIR_HELP})
def lab_down(c, dir=None):
    """Remove the lab: processes, mounts, namespaces, links and files."""
    problems = lab.load(Path(dir) if dir else lab.DEFAULT_ROOT).down()
    if problems:
        raise Exit("dflash-lab down left things behind:\n  " + "\n  ".join(problems), code=1)
    console.print("lab removed")


@ops_task(help={"dir": LAB_DIR_HELP})
def lab_status(c, dir=None):
    """Show the lab's hosts, addresses, sshd state and inventory path."""
    current = lab.load(Path(dir) if dir else lab.DEFAULT_ROOT)
    for name, record in current.state.hosts.items():
        state = "sshd running" if current.sshd_running(name) else "sshd STOPPED"
        console.print(f"{name:10} {record.address}:{record.port}  {state}  {record.data_dir}")
    console.print(f"inventory: {current.inventory_path}")


def lab_tasks() -> Collection:
    tasks = Collection()
    for name, body in (("up", lab_up), ("down", lab_down), ("status", lab_status)):
        tasks.add_task(body, name=name)
    return tasks


def main(argv: list[str] | None = None) -> None:
    """The `dflash-lab` console script."""
    make_program("dflash-lab", lab_tasks()).run(sys.argv if argv is None else argv)


if __name__ == "__main__":
    main()
