"""The inventory: which hosts exist, how to reach them, and where things live on each.

Loaded from `--inventory`, else `$DFLASH_INVENTORY`, else `./inventory.yaml`. Validation is
strict: an unknown key is an error (a typo must never be silently ignored), and every error
names the file, the key path, what was expected and what was found.
"""

from __future__ import annotations

import os
import re
import string
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal

import yaml
from pydantic import (
    AfterValidator,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from dflash_ops.core.containers import Container
from dflash_ops.core.errors import InventoryError
from dflash_ops.core.features_host import (
    CommandContainer,
    GpuList,
    GpuMemory,
    memory_needs_gpus,
    with_packages,
)
from dflash_ops.core.inventory_errors import (
    UniqueKeyLoader,
    describe,
    validation_error,
    yaml_problem,
)
from dflash_ops.core.metrics_log import MetricsLog
from dflash_ops.core.sglang_launch import SglangLaunch
from dflash_ops.core.strict import Strict
from dflash_ops.core.transfer_settings import TransferSettings
from dflash_ops.core.units import parse_bwlimit

DEFAULT_INVENTORY = "inventory.yaml"
ENV_VAR = "DFLASH_INVENTORY"


# --- hosts --------------------------------------------------------------------------------


# A host name, an ssh-config alias, an IPv4 or an IPv6 address: nothing a shell or a path
# would read specially. Addresses reach shell commands (e.g. the trainer-side reachability
# probe); they are quoted there too, but a value like "host;rm -rf ~" is refused up front.
_ADDRESS = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._:%-]*")


def _plain_address(value: str) -> str:
    if not _ADDRESS.fullmatch(value):
        raise ValueError(
            "a host name, ssh-config alias or IP address (letters, digits and . - _ : only)"
        )
    return value


class _SshHost(Strict):
    # a name from ssh config / DNS (the example) or an address (the lab)
    address: Annotated[str, AfterValidator(_plain_address)]
    user: str | None = None
    # None: as the ssh config says for `address` (Port), else 22
    port: int | None = Field(default=None, ge=1, le=65535)
    identity_file: str | None = None
    known_hosts: str = "~/.ssh/known_hosts"
    connect_timeout: int = Field(default=10, ge=1, le=3600)
    # `sudo`: every command on the host runs through `sudo -n` (a non-root login whose
    # passwordless sudo reaches what needs root: pct, root-only checkpoints, root's dirs).
    become: Literal["sudo"] | None = None


def _step_pattern(value: str) -> str:
    """A path pattern naming the step once as `{step}` and nothing else in braces."""
    expected = "a path with {step} exactly once and no other {…} placeholder"
    try:
        fields = [field for _, field, _, _ in string.Formatter().parse(value) if field is not None]
    except ValueError:
        raise ValueError(f"{expected} (unbalanced braces)") from None
    if fields != ["step"]:
        raise ValueError(expected)
    return value


StepPattern = Annotated[str, AfterValidator(_step_pattern)]


class DrafterProfile(Strict):
    """What is known about the trainer's checkpoints beyond the checkpoints themselves, sent
    to the harness as its --drafter-profile (remote/dflash_eval/drafter/profile.py): the settings a
    checkpoint without config needs, parameter renames, and the pickle policy."""

    name: str | None = None
    config_file: str | None = None  # a DFlash config.json on this workstation
    block_size: int | None = Field(default=None, ge=2, le=1024)
    target_layer_ids: list[int] | None = None
    mask_token_id: int | None = Field(default=None, ge=0, le=1 << 24)
    num_target_layers: int | None = Field(default=None, ge=1, le=1024)
    rope_parameters: dict[str, Any] | None = None
    dtype: Literal["float32", "bfloat16"] | None = None  # the drafter's, for evaluation
    target_dtype: Literal["auto", "float32", "bfloat16"] | None = None
    parameter_prefix: str | None = None
    parameter_renames: list[list[str]] | None = None  # [[regex, replacement], …]
    accept_default: list[str] | None = None  # default rules confirmed (target_layer_ids, rope)
    accept_keys: list[str] | None = None  # drafter config keys known to change nothing
    safe_globals: list[str] | None = None  # named pickle globals (e.g. argparse, numpy)


# A training run's name is a directory of every staging area ({staging}/NAME/step_N): one
# path component a shell reads literally, and never the name of a default-run step directory.
_RUN_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
_STEP_DIRECTORY = re.compile(r"step_\d+")


def _run_name(value: str) -> str:
    if not _RUN_NAME.fullmatch(value) or _STEP_DIRECTORY.fullmatch(value):
        raise ValueError(
            "a training run name: a letter or digit, then letters, digits and . - _ (at most "
            "64), not step_N"
        )
    return value


RunName = Annotated[str, AfterValidator(_run_name)]


class TrainingRun(Strict):
    """One training run on the trainer (`--run NAME`): where its checkpoints are and how to
    read them. A field left out is the trainer's own."""

    checkpoints: str | None = None  # directory inside the training environment
    layout: StepPattern | None = None
    complete_marker: StepPattern | None = None
    drafter: DrafterProfile | None = None
    metrics: MetricsLog | None = None  # its training log, read beside τ (core/metrics_log.py)


class TrainerHost(_SshHost):
    role: Literal["trainer"]
    container: Container | None = None
    # Directory inside the training environment: the default run's checkpoints. It may be
    # left out when `runs` names the runs (each with its own checkpoints).
    checkpoints: str | None = None
    layout: StepPattern = "step_{step}/checkpoint.pt"  # relative to `checkpoints`
    complete_marker: StepPattern | None = None  # relative to `checkpoints`, e.g. step_{step}/DONE
    tmp_dir: str = "/var/tmp"  # host-side scratch for `pct pull`
    drafter: DrafterProfile | None = None  # how to read this trainer's checkpoints
    # The training environment's interpreter (with its torch): --weights-only extracts with it.
    python: str = "python3"
    metrics: MetricsLog | None = None  # the default run's training log (core/metrics_log.py)
    runs: dict[RunName, TrainingRun] = Field(default_factory=dict)  # name → training run

    def checkpoint_dirs(self) -> dict[str | None, str]:
        """Every checkpoints directory to look at, once, under the first run that uses it
        (None: the trainer's own; a run that inherits it is not listed again)."""
        found: dict[str | None, str] = {None: self.checkpoints} if self.checkpoints else {}
        for name, run in self.runs.items():
            path = run.checkpoints or self.checkpoints
            if path and path not in found.values():
                found[name] = path
        return found


class VenvSpec(Strict):
    """The eval venv and what goes into it (see dflash_ops.provision)."""

    path: str
    python: str = "3.12"  # a version uv can find (or download), or an interpreter path
    torch: Literal["cpu", "cuda"] = "cpu"
    # Versions of torch / transformers / safetensors / requests or of `packages`:
    # "5.1.0" pins (==), a specifier like ">=5,<6" is used as written.
    versions: dict[str, str] = Field(default_factory=dict)
    packages: list[str] = Field(default_factory=list)  # more requirements, e.g. ["numpy<3"]
    # Package sources; None = the workstation pip's local find-links / file:// indexes that
    # also exist on the host (pip's settings are invisible to uv otherwise).
    find_links: list[str] | None = None
    extra_index_url: list[str] | None = None
    offline: bool = False  # uv --offline: only the cache, local files and file:// indexes
    wheelhouse: bool = False  # air-gapped: download on the workstation, push, install no-index
    uv_dir: str | None = None  # where uv is installed if missing; default {workdir}/bin
    cache_dir: str | None = None  # uv cache on the host; default {workdir}/uv-cache
    min_free: str = "2g"  # free space required before creating the venv and cache


class HarnessHost(_SshHost):
    """A host the harness runs on: an eval host, or a features host."""

    workdir: str
    venv: VenvSpec
    target_model: str
    sglang_url: str | None = None
    # torch threads per run (leave SGLang room)
    threads: int | None = Field(default=None, ge=1, le=4096)


class EvalHost(HarnessHost):
    role: Literal["eval"]
    checkpoints: str | None = None  # where staged checkpoints go; default {workdir}/checkpoints
    reference_drafter: str | None = None
    sglang: SglangLaunch | None = None  # how fab served-eval starts SGLang here


class FeaturesHost(HarnessHost):
    """Computes the target's features (`fab extract-features`) on a GPU box, maybe inside the
    training container, for the eval hosts. `gpus`, `gpu_memory`, `fla`: core/features_host.py."""

    role: Literal["features"]
    fla: bool = False  # install the kernels training used (fla, causal-conv1d) in the venv
    # Every command runs inside it, as the trainer's container is entered (pct, docker).
    container: CommandContainer = None
    gpus: GpuList | None = None  # split the target over these GPUs
    gpu_memory: GpuMemory | None = None  # bytes of weights per GPU ("40g")

    @model_validator(mode="before")
    @classmethod
    def _packages(cls, data: Any) -> Any:
        return with_packages(data)

    _memory_needs_gpus = field_validator("gpu_memory")(memory_needs_gpus)


HostEntry = TrainerHost | EvalHost | FeaturesHost
_HOST_MODELS: dict[str, type[_SshHost]] = {
    "trainer": TrainerHost,
    "eval": EvalHost,
    "features": FeaturesHost,
}


class LocalSettings(Strict):
    staging: Path | None = None  # keep a verified local copy (two-hop mode) when set
    results: Path = Path("results")


class Inventory(Strict):
    """The whole file, with relative local paths resolved against the file's directory."""

    path: Path  # where it was read from (not a key in the file)
    hosts: dict[str, HostEntry]
    local: LocalSettings = LocalSettings()
    transfer: TransferSettings = TransferSettings()
    ssh_config: str | None = None  # OpenSSH client config; default ~/.ssh/config
    lab: Path | None = None  # set by the lab: its state file, checked before any connection
    # The training run chosen with --run (None: the trainer's own checkpoints); not a key in
    # the file: `for_run` sets it.
    training_run: str | None = None
    # Its fields that the file does not set: path (where it was read) and training_run.
    NOT_KEYS: ClassVar[tuple[str, ...]] = ("path", "training_run")

    @property
    def trainer_name(self) -> str:
        return next(name for name, host in self.hosts.items() if host.role == "trainer")

    @property
    def trainer(self) -> TrainerHost:
        return self.hosts[self.trainer_name]  # type: ignore[return-value]

    def require_run(self, name: str | None) -> str | None:
        """`name` when the trainer lists that training run (None passes): else what it lists."""
        runs = self.trainer.runs
        if name is None or name in runs:
            return name
        where = f"hosts.{self.trainer_name}.runs"
        listed = f"its runs: {', '.join(runs)}" if runs else f"it lists none ({where})"
        raise InventoryError(
            f"{self.path}: no training run named {name!r} on {self.trainer_name}; {listed}"
        )

    def for_run(self, name: str | None) -> Inventory:
        """This inventory as training run `name` sees it: the trainer's checkpoints, layout,
        completeness marker, drafter profile and metrics log are the run's (each the
        trainer's own where the run leaves it out), and `training_run` is set. None: the
        trainer's own checkpoints, unchanged; without those, its only run (several: an error
        naming them)."""
        trainer = self.trainer
        if name is None:
            if trainer.checkpoints is not None:
                return self
            if len(trainer.runs) > 1:
                raise InventoryError(
                    f"{self.path}: {self.trainer_name} has several training runs "
                    f"({', '.join(trainer.runs)}) and no checkpoints of its own: pick one "
                    "with --run NAME"
                )
            name = next(iter(trainer.runs))
        run = trainer.runs[self.require_run(name)]
        chosen = trainer.model_copy(
            update={
                "checkpoints": run.checkpoints or trainer.checkpoints,
                "layout": run.layout or trainer.layout,
                "complete_marker": run.complete_marker or trainer.complete_marker,
                "drafter": run.drafter or trainer.drafter,
                "metrics": run.metrics or trainer.metrics,
            }
        )
        hosts = {**self.hosts, self.trainer_name: chosen}
        return self.model_copy(update={"hosts": hosts, "training_run": name})

    @property
    def eval_hosts(self) -> dict[str, EvalHost]:
        return {name: host for name, host in self.hosts.items() if isinstance(host, EvalHost)}

    def eval_host(self, name: str | None) -> tuple[str, EvalHost]:
        """The named eval host, or the only one when `name` is None."""
        return self._one_of(self.eval_hosts, "eval", name)  # type: ignore[return-value]

    @property
    def features_hosts(self) -> dict[str, FeaturesHost]:
        return {name: host for name, host in self.hosts.items() if isinstance(host, FeaturesHost)}

    def features_host(self, name: str | None) -> tuple[str, FeaturesHost]:
        """The named features host, or the only one when `name` is None."""
        if not self.features_hosts:
            raise InventoryError(
                f"{self.path}: no host with role: features; add one (a GPU box with the "
                "target model: workdir, venv, target_model) to compute features there"
            )
        return self._one_of(self.features_hosts, "features", name)  # type: ignore[return-value]

    @property
    def harness_hosts(self) -> dict[str, HarnessHost]:
        """Every host the harness runs on (eval and features hosts), in inventory order."""
        return {name: host for name, host in self.hosts.items() if isinstance(host, HarnessHost)}

    def harness_host(self, name: str | None) -> tuple[str, HarnessHost]:
        """The named eval or features host, or the only one when `name` is None."""
        return self._one_of(self.harness_hosts, "eval or features", name)

    def _one_of(
        self, hosts: dict[str, HarnessHost], role: str, name: str | None
    ) -> tuple[str, HarnessHost]:
        if name is None:
            if len(hosts) > 1:
                raise InventoryError(
                    f"{self.path}: several {role} hosts ({', '.join(hosts)}); pick one with --host"
                )
            name = next(iter(hosts))
        if name not in hosts:
            raise InventoryError(
                f"{self.path}: no {role} host named {name!r}; {role} hosts: {', '.join(hosts)}"
            )
        return name, hosts[name]


def with_bwlimit(inventory: Inventory, bwlimit: str | None) -> Inventory:
    """The inventory with `--bwlimit` in place of `transfer.bwlimit` (None: unchanged;
    'none' or 0: no limit)."""
    if bwlimit is None:
        return inventory
    try:
        rate = parse_bwlimit(bwlimit)
    except ValueError as exc:
        raise InventoryError(f"--bwlimit: {exc}") from None
    transfer = inventory.transfer.model_copy(update={"bwlimit": rate})
    return inventory.model_copy(update={"transfer": transfer})


def resolve_path(explicit: str | os.PathLike | None = None) -> Path:
    """`--inventory`, else $DFLASH_INVENTORY, else ./inventory.yaml."""
    return Path(explicit or os.environ.get(ENV_VAR) or DEFAULT_INVENTORY)


def load(explicit: str | os.PathLike | None = None) -> Inventory:
    path = resolve_path(explicit)
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as exc:
        line = exc.object[: exc.start].count(b"\n") + 1
        byte = exc.object[exc.start]
        raise InventoryError(
            f"{path}: line {line}: expected UTF-8 text, found the byte 0x{byte:02x}; save the "
            "file as UTF-8"
        ) from None
    except FileNotFoundError:
        raise InventoryError(
            f"{path}: inventory not found. Pass --inventory PATH, set ${ENV_VAR}, or copy "
            "the example inventory.yaml and edit it."
        ) from None
    except OSError as exc:
        raise InventoryError(f"{path}: cannot read inventory: {exc.strerror}") from None
    try:
        raw = yaml.load(text, Loader=UniqueKeyLoader)  # a SafeLoader: no arbitrary objects
    except yaml.YAMLError as exc:
        raise InventoryError(f"{path}: {yaml_problem(exc)}") from None
    return parse(raw, path)


def parse(raw: Any, path: Path) -> Inventory:
    """Validate an already-parsed YAML document."""
    if not isinstance(raw, dict):
        raise InventoryError(f"{path}: expected a mapping with 'hosts', found {describe(raw)}")
    raw_hosts = raw.get("hosts")
    if not isinstance(raw_hosts, dict) or not raw_hosts:
        raise InventoryError(
            f"{path}: hosts: expected a mapping of host names to host entries, "
            f"found {describe(raw_hosts)}"
        )
    for name in raw_hosts:
        if not isinstance(name, str):
            raise InventoryError(
                f"{path}: hosts: expected host names that are strings, found {describe(name)}; "
                f'quote it: "{name}"'
            )
    hosts = {name: _parse_host(name, entry, path) for name, entry in raw_hosts.items()}
    roles = [host.role for host in hosts.values()]
    if roles.count("trainer") != 1:
        raise InventoryError(
            f"{path}: hosts: expected exactly one host with role: trainer, "
            f"found {roles.count('trainer')}"
        )
    if "eval" not in roles:
        raise InventoryError(f"{path}: hosts: expected at least one host with role: eval")
    for not_a_key in Inventory.NOT_KEYS:
        if not_a_key in raw:
            raise InventoryError(f"{path}: {not_a_key}: unknown key at the top level")
    document = {**raw, "hosts": hosts, "path": path}
    try:
        inventory = Inventory.model_validate(document, strict=False)
    except ValidationError as exc:
        raise validation_error(path, exc, (), Inventory) from None
    base = path.parent
    local = inventory.local.model_copy(
        update={
            "staging": base / inventory.local.staging if inventory.local.staging else None,
            "results": base / inventory.local.results,
        }
    )
    return inventory.model_copy(update={"local": local})


def _require_checkpoints(name: str, trainer: TrainerHost, path: Path) -> None:
    """The trainer names its checkpoints directory, or every run names its own."""
    if trainer.checkpoints is not None:
        return
    if not trainer.runs:
        raise InventoryError(
            f"{path}: hosts.{name}.checkpoints: required key is missing (or list training "
            "runs under `runs`, each with its `checkpoints`)"
        )
    for run_name, run in trainer.runs.items():
        if run.checkpoints is None:
            raise InventoryError(
                f"{path}: hosts.{name}.runs.{run_name}.checkpoints: required key is missing "
                f"(the trainer has no `checkpoints` of its own to default to)"
            )


def _parse_host(name: str, entry: Any, path: Path) -> HostEntry:
    where = ("hosts", name)
    if not isinstance(entry, dict):
        raise InventoryError(f"{path}: hosts.{name}: expected a mapping, found {describe(entry)}")
    role = entry.get("role")
    model = _HOST_MODELS.get(role) if isinstance(role, str) else None
    if model is None:
        raise InventoryError(
            f"{path}: hosts.{name}.role: expected one of {', '.join(_HOST_MODELS)}, "
            f"found {describe(role)}"
        )
    try:
        host = model.model_validate(entry)
    except ValidationError as exc:
        raise validation_error(path, exc, where, model) from None
    if isinstance(host, TrainerHost):
        _require_checkpoints(name, host, path)
    return host  # type: ignore[return-value]
