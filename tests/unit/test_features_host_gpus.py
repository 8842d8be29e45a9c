"""A features host at real scale in the inventory: the GPUs the target is split over, a cap
per GPU, a container it runs in, and the packages those need; how the harness is then
invoked there. (Unit tier: no sshd.)"""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from dflash_ops.core.errors import OpsError
from dflash_ops.core.inventory import parse
from dflash_ops.features.extract import features_command
from dflash_ops.features.spec import FeatureRequest
from dflash_ops.provision.packages import requirements, split_built_against_torch
from dflash_ops.remote.connection import Host
from tests.inventory_documents import features_host, minimal_document


def _with_gpu_host(tmp_path: Path, **gpu):
    raw = minimal_document(container={"kind": "pct", "id": 200})
    raw["hosts"]["gpu"] = features_host(address="t", **gpu)
    return parse(raw, tmp_path / "inventory.yaml")


def _refusal(tmp_path: Path, **gpu) -> str:
    with pytest.raises(OpsError) as caught:
        _with_gpu_host(tmp_path, **gpu)
    return str(caught.value)


def test_gpus_and_a_cap_are_read_and_bring_accelerate(tmp_path):
    entry = _with_gpu_host(tmp_path, gpus=[4, 5, 6, 7], gpu_memory="40g", fla=True).hosts["gpu"]
    assert entry.gpus == [4, 5, 6, 7]
    assert entry.gpu_memory == 40 * 2**30
    assert entry.venv.packages == ["flash-linear-attention", "causal-conv1d", "accelerate"]
    bare = _with_gpu_host(tmp_path).hosts["gpu"]
    assert (bare.gpus, bare.gpu_memory, bare.venv.packages) == (None, None, [])


def test_bad_gpu_settings_name_the_key_what_was_expected_and_what_was_found(tmp_path):
    inventory = tmp_path / "inventory.yaml"
    assert _refusal(tmp_path, gpus=[4, 4]) == (
        f"{inventory}: hosts.gpu.gpus: expected a non-empty list of distinct GPU numbers ≥ 0, "
        "as nvidia-smi counts them, found a list"
    )
    assert "hosts.gpu.gpus: expected a list, found '4,5' (a string)" in _refusal(
        tmp_path, gpus="4,5"
    )
    assert (
        "hosts.gpu.gpu_memory: expected bytes of target weights per GPU of at least 1.0 GiB, "
        "e.g. 40g, found 40 (a number)"
    ) in _refusal(tmp_path, gpus=[0], gpu_memory=40)
    assert "hosts.gpu.gpu_memory: expected a cap per GPU of `gpus`, which is not set" in (
        _refusal(tmp_path, gpu_memory="40g")
    )


def test_a_features_container_must_be_one_commands_run_in(tmp_path):
    message = _refusal(tmp_path, container={"kind": "rootfs", "path": "/srv/ct"})
    expected = "a container that commands run in (kind pct or docker)"
    assert f"hosts.gpu.container: expected {expected}, found" in message
    assert "hosts.gpu.container.kind: expected one of pct, rootfs, docker, found 'lxd'" in (
        _refusal(tmp_path, container={"kind": "lxd", "id": 1})
    )


def test_every_command_on_a_features_host_in_a_container_runs_inside_it(tmp_path):
    inventory = _with_gpu_host(tmp_path, container={"kind": "pct", "id": 200})
    gpu, trainer = Host(inventory, "gpu"), Host(inventory, "trainer")
    assert gpu.login_command("ls /w") == "pct exec 200 -- sh -c 'umask 022; ls /w'"
    assert gpu.ssh_argv("cat /w/x")[-1] == "pct exec 200 -- sh -c 'umask 022; cat /w/x'"
    assert gpu.through_shell  # uploads and downloads go through `cat` inside, not SFTP
    # The trainer's own container is entered per command by staging, never here.
    assert trainer.login_command("ls /ckpt") == "umask 022; ls /ckpt"
    assert not trainer.through_shell


def test_the_harness_sees_only_the_inventory_s_gpus_and_is_told_to_shard(tmp_path):
    entry = _with_gpu_host(tmp_path, gpus=[4, 5, 6, 7], gpu_memory="40g").hosts["gpu"]
    request = FeatureRequest(layers=(1, 2), block_size=16)
    argv = shlex.split(features_command(entry, "gpu", "/h", request, "/w/features/s", {}))
    assert argv[:4] == [
        "env",
        "PYTHONPATH=/h",
        "CUDA_DEVICE_ORDER=PCI_BUS_ID",
        "CUDA_VISIBLE_DEVICES=4,5,6,7",
    ]
    assert argv[argv.index("--shard-gpus") + 1 : argv.index("--shard-gpus") + 3] == [
        "--gpu-memory",
        str(40 * 2**30),
    ]
    plain = _with_gpu_host(tmp_path).hosts["gpu"]
    argv = shlex.split(features_command(plain, "gpu", "/h", request, "/w/features/s", {}))
    assert "--shard-gpus" not in argv and not any(a.startswith("CUDA_") for a in argv)


def test_causal_conv1d_is_installed_after_torch_without_build_isolation(tmp_path):
    entry = _with_gpu_host(tmp_path, fla=True, venv={"path": "/v", "torch": "cuda"})
    first, later = split_built_against_torch(requirements(entry.hosts["gpu"].venv))
    assert later == ["causal-conv1d"]
    assert first[0] == "torch" and first[-1] == "flash-linear-attention"
    assert not any("conv1d" in requirement for requirement in first)
    pinned = split_built_against_torch(["torch", "causal_conv1d==1.7.0"])
    assert pinned == (["torch"], ["causal_conv1d==1.7.0"])
