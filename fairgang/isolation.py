"""Which unprivileged uid a job's members run as on a node (SPEC R8.4): one per tenant.

Every node derives the same uid from the tenant's name (so a checkpoint directory on shared storage
is owned by one uid whichever node wrote it last), inside a range no login user or container user
namespace uses: ``[base, base + span)``. Two tenants whose names fall on the same uid would share
one; the cluster config is refused when that happens (:func:`uid_collisions`), and an agent refuses
to start a member whose uid another tenant's running member already holds on its node.

Pure: no I/O, no clock.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

#: The default range: above every ordinary user (and the usual /etc/subuid ranges), below 2**31.
DEFAULT_UID_BASE = 1_000_000_000
DEFAULT_UID_SPAN = 1_000_000_000


def tenant_uid(tenant: str, *, base: int = DEFAULT_UID_BASE, span: int = DEFAULT_UID_SPAN) -> int:
    """The uid (and gid) the tenant's members run as: the same on every node."""
    if span < 1 or base < 1 or base + span > 2**31:
        raise ValueError(f"the job uid range [{base}, {base + span}) must lie within [1, 2**31)")
    digest = hashlib.sha256(tenant.encode()).digest()
    return base + int.from_bytes(digest[:8], "big") % span


def uid_collisions(tenants: Iterable[str], *, base: int = DEFAULT_UID_BASE, span: int = DEFAULT_UID_SPAN) -> list[tuple[str, str]]:
    """Pairs of tenants whose members would run as the same uid (none, almost always)."""
    seen: dict[int, str] = {}
    clashes = []
    for tenant in sorted(set(tenants)):
        uid = tenant_uid(tenant, base=base, span=span)
        if uid in seen:
            clashes.append((seen[uid], tenant))
        else:
            seen[uid] = tenant
    return clashes
