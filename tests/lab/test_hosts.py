"""Real SSH into lab hosts: Fabric control plane, OpenSSH argv, host-key refusal, containers."""

from __future__ import annotations

import contextlib
import hashlib
import os
import shlex
import socket
import subprocess
import threading

import pytest

from dflash_lab import processes
from dflash_lab.teardown import NETNS_DIR
from dflash_ops.core.containers import RootfsContainer
from dflash_ops.core.errors import (
    AuthenticationError,
    HostKeyError,
    LabError,
    RemoteCommandError,
    UnreachableError,
)
from dflash_ops.core.inventory import Inventory
from dflash_ops.remote.connection import Host
from dflash_ops.remote.containers import environment_of


def with_host(inventory: Inventory, name: str, **changes) -> Inventory:
    entry = inventory.hosts[name].model_copy(update=changes)
    return inventory.model_copy(update={"hosts": {**inventory.hosts, name: entry}})


def test_fabric_runs_commands_on_each_host(inventory):
    for name in ("trainer", "eval"):
        host = Host(inventory, name)
        try:
            assert host.run("echo $DFLASH_LAB_HOST").stdout.strip() == name
            failing = host.run("echo oops >&2; exit 3", check=False)
            assert (failing.exit_code, failing.stderr.strip()) == (3, "oops")
            with pytest.raises(RemoteCommandError, match=rf"{name}: `exit 4` exited 4"):
                host.run("exit 4")
        finally:
            host.close()


def test_large_and_multibyte_output_comes_back_as_sent(inventory):
    """Captured output is read in large chunks and decoded incrementally: 8 MB come back whole
    (invoke's runner re-joined everything read so far after each 1000-byte read: 18 s of CPU),
    and a 3-byte character split between two reads is one character, not two U+FFFD."""
    host = Host(inventory, "eval")
    try:
        large = host.run("head -c 6000000 /dev/zero | base64 -w 76").stdout
        assert len(large) == 8_000_000 + 8_000_000 // 76 + 1
        assert set(large) == {"A", "\n"}
        euros = host.run("python3 -c \"print('€' * 300000, end='')\"").stdout
        assert euros == "€" * 300000
        invalid = host.run("printf 'a\\377b'").stdout
        assert invalid == "a\ufffdb"  # bytes that are not UTF-8 still come back, replaced
    finally:
        host.close()


def test_ssh_argv_reaches_the_same_host_with_strict_options(inventory):
    host = Host(inventory, "eval")
    argv = host.ssh_argv("echo $DFLASH_LAB_HOST")
    for option in ("BatchMode=yes", "StrictHostKeyChecking=yes", "Compression=no"):
        assert option in argv
    assert any(arg.startswith("Ciphers=^aes128-gcm") for arg in argv)
    result = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    assert (result.returncode, result.stdout.strip()) == (0, "eval")


def test_unknown_host_key_is_refused(inventory, tmp_path):
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    inv = with_host(inventory, "eval", known_hosts=str(empty))
    host = Host(inv, "eval")
    with pytest.raises(HostKeyError, match=r"eval: host key of .* is not in .*ssh-keyscan -p 22"):
        host.run("true")
    result = subprocess.run(host.ssh_argv("true"), capture_output=True, text=True, timeout=30)
    assert result.returncode == 255 and "Host key verification failed" in result.stderr
    assert empty.read_text() == ""  # nothing was added behind our back


def test_changed_host_key_is_refused(lab, inventory, tmp_path):
    # The trainer's key filed under the eval host's address: what a MITM would look like.
    trainer_key = (lab.root / "hosts/trainer/ssh_host_ed25519_key.pub").read_text().split()
    wrong = tmp_path / "known_hosts"
    wrong.write_text(f"{inventory.hosts['eval'].address} {trainer_key[0]} {trainer_key[1]}\n")
    host = Host(with_host(inventory, "eval", known_hosts=str(wrong)), "eval")
    with pytest.raises(HostKeyError, match=r"does NOT match .*Refusing to connect.*ssh-keygen -R"):
        host.run("true")


def test_a_missing_identity_file_is_named_not_blamed_on_the_host(inventory, tmp_path):
    missing = tmp_path / "no_such_key"
    host = Host(with_host(inventory, "eval", identity_file=str(missing)), "eval")
    with pytest.raises(AuthenticationError, match=rf"identity_file {missing} does not exist"):
        host.run("true")


def test_unreachable_host_is_reported_as_refused(inventory):
    host = Host(with_host(inventory, "eval", port=2), "eval")  # nothing listens on port 2
    with pytest.raises(UnreachableError, match=r"eval: cannot connect to .*:2: connection refused"):
        host.run("true")


PAYLOAD = bytes(range(256)) * 64


@pytest.fixture
def odd_file(lab):
    """A file with spaces and quotes in its name, inside the trainer's container."""
    in_container = '/workspace/it\'s a "weird" name.bin'
    lab.container_path(in_container).write_bytes(PAYLOAD)
    yield in_container
    lab.container_path(in_container).unlink()


@pytest.mark.parametrize("offset", [0, 1000])
def test_pct_stream_from_offset(inventory, odd_file, offset):
    env = environment_of(inventory.trainer.container)
    host = Host(inventory, "trainer")
    argv = host.ssh_argv(env.stream_command(odd_file, offset))
    streamed = subprocess.run(argv, capture_output=True, timeout=30)
    assert streamed.returncode == 0, streamed.stderr
    assert streamed.stdout == PAYLOAD[offset:]


def test_pct_exec_sees_only_the_container(inventory, odd_file):
    env = environment_of(inventory.trainer.container)
    host = Host(inventory, "trainer")
    try:
        digest = host.run(env.run_command("sha256sum < {}", odd_file)).stdout.split()[0]
        assert digest == hashlib.sha256(PAYLOAD).hexdigest()
        # The container's / is its rootfs: the host's lab directory is not visible inside.
        inside = host.run(
            env.wrap(f"test -e {shlex.quote(str(inventory.path))} && echo host || echo isolated")
        ).stdout.strip()
        assert inside == "isolated"
    finally:
        host.close()


def test_rootfs_access_reads_through_the_host_path(lab, inventory, odd_file):
    trainer = inventory.trainer.model_copy(
        update={"container": RootfsContainer(kind="rootfs", path=str(lab.container_rootfs))}
    )
    env = environment_of(trainer.container)
    argv = Host(inventory, "trainer").ssh_argv(env.stream_command(odd_file, 10))
    assert subprocess.run(argv, capture_output=True, timeout=30).stdout == PAYLOAD[10:]


def test_stopped_container_is_reported(lab, inventory):
    host = Host(inventory, "trainer")
    lab.set_container_running(False)
    try:
        answer = host.run(environment_of(inventory.trainer.container).wrap("true"), check=False)
        assert answer.exit_code != 0 and "CT 200 not running" in answer.stderr
    finally:
        lab.set_container_running(True)
        host.close()


def test_connections_refused_once_the_lab_network_is_gone(make_lab):
    """Network safety: a lab address is used only while its namespace and veth exist."""
    from dflash_ops.core.inventory import load

    built = make_lab()
    inv = load(built.inventory_path)
    host = Host(inv, "eval")
    host.run("true")
    host.close()
    if built.state.mode != "netns":
        pytest.skip("loopback lab: no namespaces to lose")
    # The namespace goes as a crashed lab's would: its processes first. A session left in a
    # namespace whose name is gone would outlive the lab (its teardown finds them by name).
    netns = built.state.hosts["eval"].netns
    assert not processes.empty_namespace(os.stat(NETNS_DIR / netns).st_ino)
    subprocess.run(["ip", "netns", "del", netns], check=True)
    with pytest.raises(LabError, match=r"lab namespace .*-eval of eval is gone; refusing"):
        Host(inv, "eval").run("true")
    with pytest.raises(LabError, match="is gone"):
        Host(inv, "eval").ssh_argv("true")


class DroppingProxy:
    """A TCP proxy on the workstation's loopback to a lab host's sshd that closes the first
    `drops` connections as soon as they arrive (as sshd does past MaxStartups), then relays."""

    def __init__(self, upstream: tuple[str, int], drops: int):
        self.upstream, self.drops, self.accepted = upstream, drops, 0
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return  # closed
            self.accepted += 1
            if self.accepted <= self.drops:
                client.close()
                continue
            server = socket.create_connection(self.upstream)
            for source, sink in ((client, server), (server, client)):
                threading.Thread(target=self._pipe, args=(source, sink), daemon=True).start()

    @staticmethod
    def _pipe(source: socket.socket, sink: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := source.recv(65536):
                sink.sendall(data)
        with contextlib.suppress(OSError):
            sink.shutdown(socket.SHUT_WR)


def through_proxy(lab, inventory: Inventory, tmp_path, drops: int) -> tuple[Host, DroppingProxy]:
    """The eval host reached through a DroppingProxy, its key filed under the proxy's name."""
    entry = inventory.hosts["eval"]
    proxy = DroppingProxy((entry.address, entry.port or 22), drops)
    key = (lab.root / "hosts/eval/ssh_host_ed25519_key.pub").read_text().split()
    known = tmp_path / "known_hosts"
    known.write_text(f"[127.0.0.1]:{proxy.port} {key[0]} {key[1]}\n")
    changed = with_host(inventory, "eval", address="127.0.0.1", port=proxy.port)
    changed = with_host(changed, "eval", known_hosts=str(known))
    # Not a lab inventory any more: it names loopback, which the lab's own checks refuse.
    return Host(changed.model_copy(update={"lab": None}), "eval"), proxy


def test_a_session_dropped_during_the_handshake_is_tried_again(lab, inventory, tmp_path):
    host, proxy = through_proxy(lab, inventory, tmp_path, drops=2)
    try:
        assert host.run("echo $DFLASH_LAB_HOST").stdout.strip() == "eval"
    finally:
        host.close()
        proxy.listener.close()
    assert proxy.accepted == 3  # two dropped, the third connected


def test_a_server_that_keeps_dropping_sessions_is_one_line_after_three_attempts(
    lab, inventory, tmp_path
):
    host, proxy = through_proxy(lab, inventory, tmp_path, drops=99)
    try:
        with pytest.raises(UnreachableError) as failed:
            host.run("true")
    finally:
        proxy.listener.close()
    assert proxy.accepted == 3
    message = str(failed.value)
    assert message.startswith(f"eval: SSH to root@127.0.0.1:{proxy.port} failed: ")
    assert "(3 attempts: the server closed the session during the handshake)" in message
    assert "MaxStartups" in message and "\n" not in message
