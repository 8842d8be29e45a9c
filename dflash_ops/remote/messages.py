"""What a remote command's output and a host's failure say, as lines for people: the reason
in a command's stderr, the tail of its output, the advice for `become: sudo`, a HostError
without its host name."""

from __future__ import annotations

from dflash_ops.core.errors import HostError


def stderr_reason(text: str, skip_prefix: str | None = None) -> str:
    """The last non-blank line of a command's stderr: where ssh, curl, pip and the shell put
    why they failed. Lines starting with `skip_prefix` are data, not errors (the relay's
    digest line)."""
    lines = [
        line.strip()
        for line in text.splitlines()
        if line.strip() and not (skip_prefix and line.startswith(skip_prefix))
    ]
    return lines[-1] if lines else "no error output"


def output_tail(text: str, lines: int = 12) -> str:
    """The last `lines` lines of a command's output, indented under an error message."""
    return "\n".join("  " + line for line in text.strip().splitlines()[-lines:])


def sudo_advice(user: str | None, reason: str) -> str:
    """What `become: sudo` needs, when `sudo -n` said `reason`."""
    who = user or "the login user"
    if "command not found" in reason:
        return f"`become: sudo` needs sudo, which is not installed ({reason}): install it."
    return (
        f"`become: sudo` needs passwordless sudo for {who}, but `sudo -n` said: {reason}. "
        f"Add a NOPASSWD rule on the host (as root: `echo '{who} ALL=(root) NOPASSWD: ALL' > "
        f"/etc/sudoers.d/dflash-ops && chmod 0440 /etc/sudoers.d/dflash-ops`, check with "
        f"`visudo -c`), or log in as root and drop `become`."
    )


def host_error_row(exc: HostError) -> str:
    """The part of a HostError message after the host name (for tables keyed by host)."""
    return str(exc).removeprefix(f"{exc.host}: ")
