"""uv on an eval host: the one it has, else a pinned, checksum-verified one.

uv is called by absolute path (a non-login SSH shell's PATH rarely has it). A uv the host
already has (ours in `{workdir}/bin`, ~/.local/bin, ~/.cargo/bin, PATH) is used as it is.
Otherwise, in order:

1. installer: curl the pinned uv wheel for the host's architecture from PyPI's file host to
   a temporary file, check its sha256 against UV_WHEELS, and only then unpack the `uv`
   binary out of it (unzip, else python3's zipfile). Those wheels hold uv's static musl
   build, so one file per architecture runs on any Linux, glibc or not.
2. pip: `python3 -m pip install --user --require-hashes` of `uv==UV_VERSION` with the pinned
   hashes, for a host whose pip reaches a mirror or proxy but not PyPI's file host: pip
   itself refuses a file whose sha256 is not pinned.
3. push: the workstation's own uv binary over SSH (same OS and architecture only; the one
   route for an air-gapped host).

Why not astral's `curl -sSf https://astral.sh/uv/install.sh | sh` any more: that script is
unversioned, and it runs whatever it downloads next; pinning the script's hash would leave
the binary to the script's own checks. A wheel is one file whose sha256 PyPI publishes and
we pin here, so the bytes we run are the bytes we checked. To move to a newer uv, take the
new version's wheel URLs and sha256s from https://pypi.org/simple/uv/ (JSON: send
`Accept: application/vnd.pypi.simple.v1+json`).
"""

from __future__ import annotations

import platform
import shlex
import shutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from dflash_ops.core.errors import HostError
from dflash_ops.core.inventory import HarnessHost
from dflash_ops.provision.state import HostState
from dflash_ops.remote.connection import SHARED_UMASK, Host, with_umask
from dflash_ops.remote.layout import EvalLayout
from dflash_ops.remote.messages import stderr_reason

UV_VERSION = "0.13.9"
PYPI_FILES = "https://files.pythonhosted.org/packages"


@dataclass(frozen=True)
class PinnedWheel:
    url: str
    sha256: str

    @property
    def filename(self) -> str:
        return self.url.rpartition("/")[2]

    @property
    def member(self) -> str:
        """The uv binary inside the wheel."""
        version = self.filename.split("-")[1]
        return f"uv-{version}.data/scripts/uv"


# `uname -m` -> the static (musl) build of UV_VERSION, from https://pypi.org/simple/uv/.
UV_WHEELS = {
    "x86_64": PinnedWheel(
        f"{PYPI_FILES}/fe/fe/794884de0efd3ac77a427cab21aa72c0483e100c55a42cd5cbb02c141b84/"
        "uv-0.13.9-py3-none-musllinux_1_1_x86_64.whl",
        "2c45530751517d6c3bbc69a19473f6effe47cce047bede01ffd8af7ea7b36b25",
    ),
    "aarch64": PinnedWheel(
        f"{PYPI_FILES}/57/15/94b6cd62ac3ff6550288328e8035288875197cbc183f51554b266a69877b/"
        "uv-0.13.9-py3-none-manylinux_2_17_aarch64.manylinux2014_aarch64.musllinux_1_1_aarch64.whl",
        "5435c5ce14a56431208ca0996416d310f1598e8c2c8ba707688985a16bb82dbe",
    ),
}
# Every UV_VERSION wheel pip may choose on an x86_64 or aarch64 Linux host (glibc or musl):
# with --require-hashes pip refuses any file whose sha256 is not one of these.
UV_PIP_HASHES = (
    "2c45530751517d6c3bbc69a19473f6effe47cce047bede01ffd8af7ea7b36b25",  # musllinux x86_64
    "d7f459fe4fd247d830351c75686d3996ace3c6f3f728eb0e85a30b7ada0cef19",  # manylinux x86_64
    "5435c5ce14a56431208ca0996416d310f1598e8c2c8ba707688985a16bb82dbe",  # many/musl aarch64
    "ecb6028d79dc96fbeafffe5c8af62a7099487ebc05a701e76714eebcffd06375",  # manylinux_2_28 aarch64
)

# Unpack one member of a zip where the host has no unzip.
UNZIP_PY = (
    "import shutil, sys, zipfile\n"
    "with zipfile.ZipFile(sys.argv[1]) as wheel, open(sys.argv[3], 'wb') as out:\n"
    "    shutil.copyfileobj(wheel.open(sys.argv[2]), out)\n"
)
# The installer route; its inputs arrive as shell variables (see download_uv).
DOWNLOAD_SCRIPT = """
for tool in curl sha256sum; do
  command -v $tool >/dev/null || { echo "no $tool" >&2; exit 2; }
done
wheel=$(mktemp "$target.wheel.XXXXXX") || exit 2
trap 'rm -f "$wheel" "$target.part"' EXIT
curl -fsSL --proto-redir =https --connect-timeout 5 --max-time 300 -o "$wheel" "$url" || exit 3
got=$(sha256sum "$wheel" | cut -d ' ' -f 1)
if [ "$got" != "$pinned" ]; then
  echo "REFUSED $name: its sha256 is $got, not the pinned $pinned (deleted, not run)" >&2
  exit 4
fi
if command -v unzip >/dev/null; then unzip -p "$wheel" "$member" > "$target.part"
elif command -v python3 >/dev/null; then python3 -c "$unzip_py" "$wheel" "$member" "$target.part"
else echo "no unzip or python3 to unpack $name" >&2; false; fi || exit 5
chmod 755 "$target.part" && mv -f "$target.part" "$target"
"""
ONLINE_TIMEOUT = 400  # seconds for one online route: a ~19 MB wheel on a slow link

Say = Callable[[str], None]


def ensure_uv(host: Host, entry: HarnessHost, state: HostState, say: Say) -> tuple[str, str]:
    """A working uv on the host: (absolute path, how it was obtained)."""
    if state.uv:
        say(f"{host.name}: using {state.uv_version or 'uv'} at {state.uv}")
        return state.uv, "present"
    directory = EvalLayout(entry).uv_dir
    target = f"{directory}/uv"
    host.run(with_umask(SHARED_UMASK, f"mkdir -p {shlex.quote(directory)}"))
    machine = host.run("uname -sm").stdout.split()
    if entry.venv.offline or entry.venv.wheelhouse:
        # An offline host must not try the network: go straight to pushing our own uv.
        failures = ["offline host: installer and pip not tried"]
    else:
        method, failures = _install_online(host, target, machine)
        if method:
            say(f"{host.name}: uv installed with {method} at {target}")
            return target, method.split()[0]
    push_uv(host, target, machine)
    if not uv_works(host, target):
        raise HostError(
            host.name,
            f"no working uv: tried {'; '.join(failures)}; the pushed workstation binary at "
            f"{target} does not run there either. Install uv on the host and rerun.",
        )
    say(
        f"{host.name}: uv pushed from the workstation to {target} "
        f"(no installer or index there: {'; '.join(failures)})"
    )
    return target, "pushed"


def _install_online(host: Host, target: str, machine: list[str]) -> tuple[str | None, list[str]]:
    """The pinned wheel, else pip: how uv got installed (None: neither way) and why each way
    failed."""
    wheel = UV_WHEELS.get(machine[-1]) if machine[:1] == ["Linux"] else None
    if wheel is None:
        failures = [f"installer: no pinned uv wheel for {' '.join(machine)}"]
    else:
        failure = download_uv(host, target, wheel)
        if failure is None:
            return f"installer (uv {UV_VERSION} wheel, sha256 checked)", []
        failures = [f"installer: {failure}"]
    failure = pip_install_uv(host, target)
    if failure is None:
        return f"pip (uv=={UV_VERSION}, --require-hashes)", []
    return None, [*failures, f"pip: {failure}"]


def download_uv(host: Host, target: str, wheel: PinnedWheel) -> str | None:
    """Fetch `wheel` to a temporary file, refuse it unless its sha256 is the pinned one, then
    unpack its uv binary to `target`. Returns why it failed (None: uv is at `target`)."""
    q = shlex.quote
    values = {
        "target": target,
        "url": wheel.url,
        "name": wheel.filename,
        "pinned": wheel.sha256,
        "member": wheel.member,
        "unzip_py": UNZIP_PY,
    }
    script = "".join(f"{name}={q(value)}\n" for name, value in values.items()) + DOWNLOAD_SCRIPT
    result = host.run(with_umask(SHARED_UMASK, script), check=False, timeout=ONLINE_TIMEOUT)
    if not result.ok:
        return stderr_reason(result.stderr)
    return None if uv_works(host, target) else f"{target} from {wheel.filename} does not run"


def pip_install_uv(
    host: Host, target: str, hashes: Sequence[str] = UV_PIP_HASHES, pip_args: Sequence[str] = ()
) -> str | None:
    """`python3 -m pip install --user --require-hashes uv==UV_VERSION` into a scratch user
    base, then move its uv to `target`. `pip_args`: where pip looks (default: the host's own
    pip configuration). Returns why it failed (None: uv is at `target`)."""
    q = shlex.quote
    scratch = f"{target}.pip"
    requirement = f"uv=={UV_VERSION} " + " ".join(f"--hash=sha256:{digest}" for digest in hashes)
    pip = [
        *("python3", "-m", "pip", "install", "--user", "--quiet", "--no-input"),
        *("--disable-pip-version-check", "--no-warn-script-location"),
        *("--retries", "1", "--timeout", "15", "--no-deps", "--only-binary=:all:"),
        *("--require-hashes", "-r", f"{scratch}/requirements.txt", *pip_args),
    ]
    script = (
        f"rm -rf {q(scratch)} && mkdir {q(scratch)} && "
        f"printf '%s\\n' {q(requirement)} > {q(scratch + '/requirements.txt')} && "
        f"PYTHONUSERBASE={q(scratch)} PIP_BREAK_SYSTEM_PACKAGES=1 timeout 300 {shlex.join(pip)} "
        f"&& mv -f {q(scratch + '/bin/uv')} {q(target)}; rc=$?; rm -rf {q(scratch)}; exit $rc"
    )
    result = host.run(with_umask(SHARED_UMASK, script), check=False, timeout=ONLINE_TIMEOUT)
    if "DO NOT MATCH THE HASHES" in result.stderr:
        return (
            f"REFUSED the uv {UV_VERSION} wheel pip found: its sha256 is not one pinned in "
            f"dflash_ops.provision.uv ({stderr_reason(result.stderr)})"
        )
    if not result.ok:
        return stderr_reason(result.stderr)
    return None if uv_works(host, target) else f"{target} from pip does not run"


def workstation_uv() -> Path:
    """The workstation's uv binary (the `uv` package is a dependency of dflash-ops)."""
    try:
        from uv import find_uv_bin

        return Path(find_uv_bin())
    except (ImportError, FileNotFoundError):
        found = shutil.which("uv")
        if found:
            return Path(found)
    raise HostError("workstation", "no uv binary here to push (pip install uv)")


def push_uv(host: Host, target: str, machine: list[str]) -> None:
    """Copy the workstation's uv binary (same OS and architecture only); `machine` is the
    host's `uname -sm`."""
    here = [platform.system(), platform.machine()]
    if machine != here:
        raise HostError(
            host.name,
            f"the host is {' '.join(machine)}, the workstation {' '.join(here)}: its uv "
            "binary would not run there. Install uv on the host (pip install uv) and rerun.",
        )
    binary = workstation_uv()
    host.upload(binary.read_bytes(), target + ".part")
    host.run(
        f"chmod 755 {shlex.quote(target + '.part')} && "
        f"mv -f {shlex.quote(target + '.part')} {shlex.quote(target)}"
    )


def uv_works(host: Host, path: str) -> bool:
    return host.run(f"{shlex.quote(path)} --version", check=False).ok
