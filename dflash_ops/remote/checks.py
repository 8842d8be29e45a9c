"""`fab check-hosts`: is every host of the inventory usable, and if not, why.

Each check yields a row (host, check, status, detail). A failed *required* check makes the
task exit non-zero; 'warn' and 'info' rows never do. Checks that need more than this package
(the harness's own, run on the host) are given by the caller as `more`, run for every host
that answers.
"""

from __future__ import annotations

import shlex
import shutil
import socket
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from enum import Enum

from dflash_ops.core.errors import HostError, HostKeyError, UnreachableError
from dflash_ops.core.inventory import (
    EvalHost,
    HarnessHost,
    HostEntry,
    Inventory,
    TrainerHost,
)
from dflash_ops.core.units import format_bytes
from dflash_ops.remote import probes
from dflash_ops.remote.connection import Host
from dflash_ops.remote.containers import environment_of
from dflash_ops.remote.layout import EvalLayout
from dflash_ops.remote.messages import host_error_row, sudo_advice


class Status(Enum):
    OK = "ok"
    FAIL = "fail"
    WARN = "warn"
    INFO = "info"
    SKIPPED = "skipped"


@dataclass(frozen=True)
class Row:
    host: str
    check: str
    status: Status
    detail: str


HostCheck = Callable[[Host, HostEntry], Iterable[Row]]


def check_inventory(inventory: Inventory, more: Sequence[HostCheck] = ()) -> list[Row]:
    rows: list[Row] = list(check_workstation(inventory))
    for name in inventory.hosts:
        host = Host(inventory, name)
        try:
            rows.extend(check_host(host, more))
        finally:
            host.close()
    rows.extend(check_routes(inventory))
    return rows


def failed(rows: list[Row]) -> list[Row]:
    return [row for row in rows if row.status is Status.FAIL]


def check_workstation(inventory: Inventory) -> Iterator[Row]:
    ssh = shutil.which("ssh")
    yield Row(
        "workstation",
        "tool ssh",
        Status.OK if ssh else Status.FAIL,
        ssh or "OpenSSH client not found: install openssh-client",
    )
    local = inventory.local
    for label, path in (("staging dir", local.staging), ("results dir", local.results)):
        if path is None:
            yield Row("workstation", label, Status.INFO, "not set (checkpoints stream through)")
            continue
        free = probes.local_free_bytes(path)
        state = "exists" if path.is_dir() else "will be created"
        yield Row("workstation", label, Status.OK, f"{path} {state} ({format_bytes(free)} free)")


def check_host(host: Host, more: Sequence[HostCheck] = ()) -> Iterator[Row]:
    name, entry = host.name, host.entry
    try:
        reachable = reachability(host)
    except HostError as exc:
        yield Row(name, "ssh config", Status.FAIL, host_error_row(exc))
        return
    yield reachable
    if reachable.status is Status.FAIL:
        yield Row(name, "remaining checks", Status.SKIPPED, "host unreachable")
        return
    try:
        host.open()
    except HostKeyError as exc:
        yield Row(name, "host key", Status.FAIL, host_error_row(exc))
        yield Row(name, "remaining checks", Status.SKIPPED, "host key not verified")
        return
    except HostError as exc:
        verified = not isinstance(exc, UnreachableError)
        if verified:
            yield Row(name, "host key", Status.OK, f"matches {host.known_hosts}")
        yield Row(name, "authenticated", Status.FAIL, host_error_row(exc))
        return
    yield Row(name, "host key", Status.OK, f"matches {host.known_hosts}")
    yield Row(name, "authenticated", Status.OK, f"as {host.connection.user}")
    if host.becomes_root:
        sudo = _sudo_row(host)
        yield sudo
        if sudo.status is Status.FAIL:
            yield Row(name, "remaining checks", Status.SKIPPED, "every command needs sudo")
            return
    try:
        if isinstance(entry, TrainerHost):
            yield from _check_trainer(host, entry)
        else:
            yield from _check_eval(host, entry)
        for check in more:
            yield from check(host, entry)
        yield from _check_machine(host)
    except HostError as exc:
        yield Row(name, "remaining checks", Status.FAIL, host_error_row(exc))


def reachability(host: Host) -> Row:
    """A direct TCP probe of where ssh goes (after the ssh config). Behind a ProxyJump or
    ProxyCommand there is nothing direct to probe: the SSH login that follows tells."""
    name, entry, endpoint = host.name, host.entry, host.endpoint
    alias = "" if endpoint.hostname == entry.address else f"{entry.address} → "
    if endpoint.proxy is not None:
        return Row(name, "reachable", Status.INFO, f"{alias}{endpoint} via {endpoint.proxy}")
    try:
        socket.getaddrinfo(endpoint.hostname, endpoint.port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as exc:
        reason = getattr(exc, "strerror", None) or exc
        return Row(
            name,
            "reachable",
            Status.FAIL,
            f"{alias}{endpoint.hostname} does not resolve ({reason}): check `address` in the "
            "inventory, or a Host/HostName entry in your ssh config",
        )
    if not host.port_open():
        return Row(
            name,
            "reachable",
            Status.FAIL,
            f"no SSH answer at {alias}{endpoint} within {entry.connect_timeout}s: is the "
            "host up and sshd running?",
        )
    return Row(name, "reachable", Status.OK, f"{alias}{endpoint}")


def _sudo_row(host: Host) -> Row:
    """`become: sudo`: can the login user run a command through `sudo -n` (no password)?"""
    answer = host.run("sudo -n true", check=False, as_login_user=True)
    if answer.ok:
        return Row(host.name, "sudo", Status.OK, "`sudo -n` works: commands run as root")
    reason = answer.stderr.strip().splitlines()[-1] if answer.stderr.strip() else "no output"
    return Row(host.name, "sudo", Status.FAIL, sudo_advice(host.entry.user, reason))


def _check_trainer(host: Host, entry: TrainerHost) -> Iterator[Row]:
    env = environment_of(entry.container)
    if env.tool == "pct" and not host.becomes_root and entry.user not in (None, "root"):
        yield Row(
            host.name,
            "root for pct",
            Status.WARN,
            f"`pct` needs root and the login user is {entry.user}: set `become: sudo` on "
            "this host (with passwordless sudo)",
        )
    status = env.status()
    if status is not None:
        answer = host.run(status.command, check=False)
        running = answer.ok and status.parse(answer.stdout)
        found = (answer.stdout or answer.stderr).strip() or f"exit {answer.exit_code}"
        yield Row(
            host.name,
            "container",
            Status.OK if running else Status.FAIL,
            f"{env.description}: {found}" + ("" if running else "; start it first"),
        )
        if not running:
            return
    elif env.host_rootfs() is not None:
        rootfs = env.host_rootfs()
        yield _directory_row(
            host.name,
            "container rootfs",
            rootfs,
            host.probe(probes.paths_info([rootfs]))[rootfs],
            Status.FAIL,
            "fix `container.path` in the inventory",
        )
    for run, directory in entry.checkpoint_dirs().items():  # the trainer's own, each run's
        listing = host.run(
            env.run_command("test -d {} && echo yes || echo no", directory), check=False
        )
        exists = listing.stdout.strip() == "yes"
        key = f"runs.{run}.checkpoints" if run else "checkpoints"
        yield Row(
            host.name,
            f"checkpoints dir ({run})" if run else "checkpoints dir",
            Status.OK if exists else Status.FAIL,
            f"{directory} in {env.description}"
            + ("" if exists else f": missing; fix `{key}` in the inventory"),
        )
    required = ["sha256sum", "tail", *filter(None, [env.tool])]
    yield from _tool_rows(host, required, optional=["python3"])


def _check_eval(host: Host, entry: HarnessHost) -> Iterator[Row]:
    """An eval host, or a features host (no staged checkpoints, no reference drafter)."""
    is_eval = isinstance(entry, EvalHost)
    required = {"target model": entry.target_model}
    reference = entry.reference_drafter if is_eval else None
    optional = {"reference drafter": reference} if reference else {}
    created = {"workdir": entry.workdir, "venv": entry.venv.path}
    if is_eval:
        created["staging dir"] = EvalLayout(entry).staging
    record = EvalLayout(entry).provision_record
    info = host.probe(
        probes.paths_info([*required.values(), *optional.values(), *created.values(), record])
    )
    for label, path in required.items():
        yield _directory_row(
            host.name, label, path, info[path], Status.FAIL, "fix the inventory or create it"
        )
    for label, path in optional.items():
        yield _directory_row(
            host.name, label, path, info[path], Status.WARN, "fix the inventory or create it"
        )
    for label, path in created.items():
        yield _directory_row(
            host.name, label, path, info[path], Status.WARN, "created by `fab setup-eval-host`"
        )
    if info[entry.venv.path].stat is not None and info[record].stat is None:
        yield Row(
            host.name,
            "venv origin",
            Status.WARN,
            f"{entry.venv.path} was not made by dflash-ops (no {record}): `fab "
            "setup-eval-host` leaves it alone unless told --adopt (install into it) or "
            "--replace (delete it)",
        )
    yield from _tool_rows(
        host,
        ["sha256sum"],
        optional=["python3", "uv", "systemd-run"],
        extra_dirs=["$HOME/.local/bin", "$HOME/.cargo/bin"],
    )
    venv_python = f"{entry.venv.path}/bin/python"
    if info[entry.venv.path].stat is not None and info[entry.target_model].stat is not None:
        yield _transformers_row(host, venv_python, entry.target_model)


def _transformers_row(host: Host, python: str, target: str) -> Row:
    """Before anything is staged: can the venv's transformers build the target's model_type?"""
    support = host.probe(probes.transformers_support(python, target))
    if support.error is None:
        return Row(
            host.name,
            "transformers",
            Status.OK,
            f"{support.version} builds the target's {support.model_type} config",
        )
    version = f"transformers {support.version}" if support.version else "the venv"
    return Row(
        host.name,
        "transformers",
        Status.FAIL,
        f"{version} cannot read {target}/config.json: {support.error}. Rerun `fab "
        "setup-eval-host` (it installs a tested transformers range), or set venv.versions."
        "transformers in the inventory to one that supports this model family",
    )


def _directory_row(
    host: str, label: str, path: str, info: probes.PathInfo, if_missing: Status, missing_hint: str
) -> Row:
    if info.stat is not None and info.stat.kind == "directory":
        return Row(host, label, Status.OK, f"{path} ({format_bytes(info.free)} free)")
    found = "missing" if info.stat is None else f"a {info.stat.kind}, not a directory"
    return Row(
        host,
        label,
        if_missing,
        f"{path}: {found}; {missing_hint} ({format_bytes(info.free)} free there)",
    )


def _tool_rows(
    host: Host, required: list[str], optional: list[str], extra_dirs: list[str] = ()
) -> Iterator[Row]:
    found = host.probe(probes.tools([*required, *optional], extra_dirs))
    for name in required:
        tool = found[name]
        yield Row(
            host.name,
            f"tool {name}",
            Status.OK if tool.present else Status.FAIL,
            " ".join(filter(None, (tool.path, tool.version)))
            if tool.present
            else "not found on PATH",
        )
    present = [f"{t.name} ({t.version})" for t in (found[n] for n in optional) if t.present]
    absent = [name for name in optional if not found[name].present]
    detail = ", ".join(present) or "none"
    if absent:
        detail += f"; not found: {', '.join(absent)}"
    yield Row(host.name, "other tools", Status.INFO, detail)


def _check_machine(host: Host) -> Iterator[Row]:
    machine = host.probe(probes.machine())
    yield Row(
        host.name,
        "machine",
        Status.INFO,
        f"{machine.cpus} CPUs, {format_bytes(machine.memory_available)} of "
        f"{format_bytes(machine.memory_total)} memory available",
    )


def check_routes(inventory: Inventory) -> Iterator[Row]:
    """Informational: can the trainer reach each eval host directly? (Usually not: that is
    why bytes relay through the workstation.) The eval host is probed where the
    workstation's ssh config says it is; the trainer may not know the alias."""
    trainer = Host(inventory, inventory.trainer_name)
    try:
        trainer.open()
        for name in inventory.eval_hosts:
            endpoint = Host(inventory, name).endpoint
            if endpoint.proxy is not None:
                detail = f"not probed: the workstation reaches {name} via {endpoint.proxy}"
            else:
                reachable = trainer.probe(probes.tcp_reachable(endpoint.hostname, endpoint.port))
                detail = f"direct TCP to {shlex.quote(endpoint.hostname)}:{endpoint.port}: " + (
                    "yes" if reachable else "no (transfers relay via the workstation)"
                )
            yield Row(trainer.name, f"reaches {name}", Status.INFO, detail)
    except HostError:
        return  # already reported in the trainer's own rows
    finally:
        trainer.close()
