"""The README's commands name real tasks and real flags, and its links point at files that
exist: a renamed task or flag, or a moved doc, fails here instead of in a reader's shell.
(That they also work as written is what `make demo` and the lab runs of the first-evaluation
commands show.)"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

from invoke import Collection

import fabfile
from tests.unit.test_option_table import task_arguments

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"


def _tasks(collection: Collection | None = None) -> dict[str, set[str]]:
    """Task name → the long flags it takes (of the fabfile, unless another collection)."""
    collection = collection or Collection.from_module(fabfile)
    flags = {}
    for name in collection.task_names:
        arguments = task_arguments(collection[name])  # never the task's own help dict
        flags[name] = {f"--{name.replace('_', '-')}" for name in arguments}
    return flags


def _commands(text: str, program: str = "fab") -> list[list[str]]:
    """Every `PROGRAM …` command line in the text's code blocks and backticks (comments
    off)."""
    lines, inside = [], False
    for line in text.splitlines():
        if line.startswith("```"):
            inside = not inside
        elif inside:
            lines.append(line)
    lines += re.findall(rf"`({program} [^`]+)`", text)
    commands = []
    for line in lines:
        line = line.split("#", 1)[0].strip()
        if line.startswith(f"{program} ") and "TASK" not in line:
            commands.append(shlex.split(line)[1:])
    return commands


def test_every_fab_command_in_the_readme_names_a_task_and_its_flags():
    tasks = _tasks()
    commands = _commands(README.read_text())
    assert len(commands) >= 12  # the first evaluation and the everyday table
    for argv in commands:
        if argv[0] == "--list":
            continue
        assert argv[0] in tasks, f"README: fab {argv[0]}: no such task"
        for word in argv[1:]:
            flag = word.split("=", 1)[0]
            if flag.startswith("--"):
                assert flag in tasks[argv[0]], f"README: fab {shlex.join(argv)}: no {flag}"


def test_every_lab_command_in_the_readme_names_one_of_the_labs_tasks_and_its_flags():
    from dflash_lab.tasks import lab_tasks

    tasks = _tasks(lab_tasks())
    commands = _commands(README.read_text(), "dflash-lab")
    assert [argv[0] for argv in commands] == ["up", "down"]
    for argv in commands:
        flags = {word.split("=", 1)[0] for word in argv[1:] if word.startswith("--")}
        assert flags <= tasks[argv[0]], f"README: dflash-lab {shlex.join(argv)}"


def test_the_readme_states_the_two_ways_in_and_links_only_to_files_that_exist():
    text = README.read_text()
    assert "make demo" in text and "make test" in text
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(r"^demo:", makefile, re.M) and re.search(r"^test:", makefile, re.M)
    links = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", text)
    assert links and all((ROOT / link).is_file() for link in links), links
    assert "shared/" not in text  # nothing outside the repository


def test_the_readme_inventory_example_loads(tmp_path):
    from dflash_ops.core.inventory import load

    text = README.read_text()
    example = re.search(r"```yaml\n(.*?)```", text, re.S).group(1)
    path = tmp_path / "inventory.yaml"
    path.write_text(example)
    inventory = load(path)
    assert inventory.eval_host(None)[0] == "eval"
