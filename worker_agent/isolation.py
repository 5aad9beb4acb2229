"""Job isolation on a node (SPEC R8.4): what an agent run as root does so that a member cannot reach the
platform or another tenant.

Each member runs as its tenant's own unprivileged uid and gid (:func:`fairgang.isolation.tenant_uid`,
no supplementary groups), so it cannot read the agent's environment or memory (``/proc/<pid>/environ``
needs the same uid), signal the agent or another tenant's members, or open the agent's credential,
state, logs or a store file (each 0600/0700, owned by root). It owns exactly two places: its
checkpoint directory (mode 0700, handed over to the uid before each attempt, files included) and a
private temporary directory (``TMPDIR`` and ``HOME``, mode 0700, removed when the member ends). Its log
is written through the file descriptor the agent opened; the member never opens it.

An agent not run as root cannot change uid: it says so at start, and its members run as its own uid
(docs/architecture.md, "Trust boundaries", says what then holds).
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from fairgang.isolation import tenant_uid
from fairgang.settings import Settings

log = logging.getLogger("fairgang.isolation")


@dataclass(frozen=True)
class RunAs:
    """How this node runs members: the uid range of the tenants, and where private temporary directories go."""

    uid_base: int
    uid_span: int
    tmp_root: Path

    def uid(self, tenant: str, job_id: str) -> int:
        # A launch from a workflow older than the tenant field: the job gets a uid of its own.
        return tenant_uid(tenant or f"job:{job_id}", base=self.uid_base, span=self.uid_span)


def run_as_from(settings: Settings) -> RunAs | None:
    """The node's isolation, or None (with the reason logged) where members run as the agent's own uid."""
    if not settings.isolate_members:
        log.warning("FAIRGANG_ISOLATE_MEMBERS is off: members run as the agent's uid and can read its credential and files")
        return None
    if os.geteuid() != 0:
        log.warning(
            "the agent is not root (uid %d): members run as its own uid and can read its environment, credential and "
            "files, and other jobs' logs and checkpoints on this node; run the agent as root, or members in containers",
            os.geteuid(),
        )
        return None
    # Fail at start, not at the first launch, on a bad range.
    tenant_uid("", base=settings.job_uid_base, span=settings.job_uid_span)
    return RunAs(settings.job_uid_base, settings.job_uid_span, settings.job_tmp_root or Path(tempfile.gettempdir()) / "fairgang-jobs")


def make_dirs_traversable(path: Path) -> None:
    """``mkdir -p path``; each directory this creates gets mode 0711 (others may pass through, not list)."""
    missing = []
    parent = path
    while not parent.exists():
        missing.append(parent)
        parent = parent.parent
    path.mkdir(parents=True, exist_ok=True)
    for created in missing:
        with contextlib.suppress(FileNotFoundError):
            created.chmod(0o711)


def hand_over(path: Path, uid: int, run_as: RunAs) -> None:
    """Make ``path`` (created if missing) the uid's alone: owner and group, mode 0700, its contents too.

    A folder another tenant's uid owns is refused (PermissionError): admission keeps each tenant under its own
    checkpoint prefix, and this holds even where that prefix was misconfigured."""
    make_dirs_traversable(path.parent)
    path.mkdir(exist_ok=True)
    owner = path.stat().st_uid
    if owner != uid and run_as.uid_base <= owner < run_as.uid_base + run_as.uid_span:
        raise PermissionError(f"{path} belongs to another tenant's uid ({owner})")
    for root, dirs, files in os.walk(path):
        for name in [*dirs, *files]:
            entry = os.path.join(root, name)
            with contextlib.suppress(FileNotFoundError):
                if os.lstat(entry).st_uid != uid:
                    os.lchown(entry, uid, uid)
    os.chown(path, uid, uid)
    path.chmod(0o700)


def private_tmp(run_as: RunAs, uid: int, allocation_id: str, rank: int) -> Path:
    """A fresh temporary directory for one member (emptied first: a previous attempt's is not this one's)."""
    make_dirs_traversable(run_as.tmp_root)
    run_as.tmp_root.chmod(0o711)
    path = run_as.tmp_root / f"{allocation_id}-r{rank}"
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(mode=0o700)
    os.chown(path, uid, uid)
    return path


def drop_private_tmp(path: Path | None) -> None:
    if path is not None:
        shutil.rmtree(path, ignore_errors=True)


def read_token_file(path: Path) -> str:
    """The node's credential from its file, which only the agent's uid may read (ValueError says what is wrong)."""
    try:
        info = path.stat()
        token = path.read_text().strip()
    except OSError as err:
        raise ValueError(f"cannot read {path}: {err.strerror}") from None
    if info.st_mode & 0o077:
        raise ValueError(f"{path} is readable by others (mode {info.st_mode & 0o777:o}); make it 0600")
    if not token:
        raise ValueError(f"{path} is empty")
    return token


def write_token_file(path: Path, token: str) -> None:
    """Write a credential into a file only its owner can read (created 0600, never readable by others)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.parent.chmod(0o700)
    tmp = path.with_suffix(".tmp")
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(token + "\n")
    tmp.replace(path)


def keep_private(path: Path, mode: int = 0o700) -> None:
    """A directory of the agent's own (state, logs): created if missing, and only root may enter it."""
    path.mkdir(parents=True, exist_ok=True)
    path.chmod(mode)
