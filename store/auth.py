"""API tokens and who they belong to: tokens are stored as digests, a token maps to its :class:`Principal`.

Roles: the platform's ``admin``; a tenant's ``tenant_admin`` (what a member may, and its tenant's tokens);
a tenant ``tenant`` member; a ``node`` (one node's agent). A token made through the API has a name, who
made it and may expire; revoking one keeps its row (for the record) and refuses it from then on."""

from __future__ import annotations

import contextlib
import functools
import hashlib
import hmac
import secrets
import time
from dataclasses import dataclass

from sqlalchemy import delete, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession
from sqlmodel import col

from fairgang.settings import Settings
from store import audit
from store.db import Database
from store.models import ApiToken


@functools.cache
def _token_key() -> bytes | None:
    key = Settings().token_key
    return key.encode() if key else None


def reset_token_key() -> None:
    """Read ``FAIRGANG_TOKEN_KEY`` again (a process that set it after its first token)."""
    _token_key.cache_clear()


def hash_token(token: str) -> str:
    """A token's stored digest: HMAC-SHA256 under the platform's token key (``FAIRGANG_TOKEN_KEY``), so that a
    copy of the store does not let anyone try guesses offline; plain SHA-256 where no key is configured."""
    key = _token_key()
    if key is None:
        return hashlib.sha256(token.encode()).hexdigest()
    return hmac.new(key, token.encode(), hashlib.sha256).hexdigest()


def digests(token: str) -> tuple[str, ...]:
    """Every digest a stored token may have: keyed, and the plain one of a row stored before the key was set."""
    plain = hashlib.sha256(token.encode()).hexdigest()
    keyed = hash_token(token)
    return (keyed,) if keyed == plain else (keyed, plain)


ADMIN, TENANT_ADMIN, MEMBER, NODE = "admin", "tenant_admin", "tenant", "node"
#: Roles a token made through the API may have (a node's credential comes from its enrolment).
USER_ROLES = (ADMIN, TENANT_ADMIN, MEMBER)


@dataclass(frozen=True)
class Principal:
    """Who is calling: an admin, a tenant's admin or member, or a node agent (``node_id``: the one node it
    speaks for). ``token_id``: the token's row (None for one older than token names)."""

    role: str
    tenant: str | None = None
    node_id: str | None = None
    token_id: int | None = None

    @property
    def admin(self) -> bool:
        return self.role == ADMIN

    @property
    def user(self) -> bool:
        """A person's token: an admin, or a tenant's admin or member."""
        return self.role in USER_ROLES

    @property
    def name(self) -> str:
        """How the audit records name the caller."""
        who = self.tenant or self.node_id or "platform"
        return f"{self.role}:{who}#{self.token_id}"


@dataclass(frozen=True)
class TokenInfo:
    """A token as its owners see it: never its secret or its digest."""

    id: int
    name: str | None
    role: str
    tenant: str | None
    created_at: float
    created_by: str | None
    expires_at: float | None
    revoked_at: float | None


def _live(row: ApiToken, now: float) -> bool:
    return row.revoked_at is None and (row.expires_at is None or row.expires_at > now)


async def authenticate(db: Database, token: str, *, now: float | None = None) -> Principal | None:
    """The token's principal; None for an unknown, revoked or expired token."""
    now = time.time() if now is None else now
    known = digests(token)
    async with db.sessions() as session:
        rows = (await session.execute(select(ApiToken).where(col(ApiToken.token_hash).in_(known)))).scalars().all()
    # The keyed row wins over a plain one (written by a process that lacked the key).
    row = min(rows, key=lambda r: known.index(r.token_hash), default=None)
    if row is None or (row.role == NODE and not row.node_id) or not _live(row, now):
        return None
    if row.token_hash != known[0]:  # stored before the token key was set: keyed from now on
        with contextlib.suppress(IntegrityError):
            async with db.transaction() as session:
                await session.execute(update(ApiToken).where(col(ApiToken.id) == row.id).values(token_hash=known[0]))
    return Principal(role=row.role, tenant=row.tenant, node_id=row.node_id, token_id=row.id)


def _info(row: ApiToken) -> TokenInfo:
    assert row.id is not None
    return TokenInfo(row.id, row.name, row.role, row.tenant, row.created_at, row.created_by, row.expires_at, row.revoked_at)


def new_user_token() -> str:
    """A fresh random token for a person (160 random bits)."""
    return "fgt-" + secrets.token_hex(20)


async def create_token(
    db: Database, *, role: str, tenant: str | None, name: str, created_by: str, expires_at: float | None, now: float | None = None
) -> tuple[str, TokenInfo]:
    """A new token (its secret is returned once, never stored) for a role of :data:`USER_ROLES`."""
    assert role in USER_ROLES and (role == ADMIN) == (tenant is None), (role, tenant)
    now = time.time() if now is None else now
    secret = new_user_token()
    row = ApiToken(
        token_hash=hash_token(secret), role=role, tenant=tenant, created_at=now, name=name, created_by=created_by, expires_at=expires_at
    )
    async with db.transaction() as session:
        session.add(row)
        await session.flush()
        info = _info(row)
        audit.record(
            session, actor=created_by, action="token.create", target=f"token:{info.id}", before=None, after=_audited(info), now=now
        )
    return secret, info


async def list_tokens(db: Database, *, tenant: str | None = None, everyone: bool = False) -> list[TokenInfo]:
    """People's tokens, oldest first: the tenant's, or (``everyone``) all of them. Nodes' credentials are not listed."""
    query = select(ApiToken).where(col(ApiToken.role).in_(USER_ROLES)).order_by(col(ApiToken.id))
    if not everyone:
        query = query.where(col(ApiToken.tenant) == tenant)
    async with db.sessions() as session:
        return [_info(row) for row in (await session.execute(query)).scalars()]


def _audited(info: TokenInfo) -> dict[str, object]:
    return {"name": info.name, "role": info.role, "tenant": info.tenant, "expires_at": info.expires_at, "revoked_at": info.revoked_at}


async def revoke_token(
    db: Database, token_id: int, *, tenant: str | None = None, everyone: bool = False, actor: str = "admin", now: float | None = None
) -> TokenInfo | None:
    """Revoke a person's token of the tenant (or, ``everyone``, any); None if there is none such. A repeat keeps the first time."""
    now = time.time() if now is None else now
    async with db.transaction() as session:
        row = await session.get(ApiToken, token_id)
        if row is None or row.role not in USER_ROLES or (not everyone and row.tenant != tenant):
            return None
        if row.revoked_at is None:
            before = _audited(_info(row))
            row.revoked_at = now
            audit.record(
                session, actor=actor, action="token.revoke", target=f"token:{token_id}", before=before, after=_audited(_info(row)), now=now
            )
        await session.flush()
        return _info(row)


async def set_node_credential(session: AsyncSession, node_id: str, token: str, *, now: float | None = None) -> None:
    """Make ``token`` the node's only credential (in the caller's transaction): earlier ones stop working."""
    now = time.time() if now is None else now
    known = digests(token)
    earlier = (col(ApiToken.role) == "node", col(ApiToken.node_id) == node_id, col(ApiToken.token_hash).not_in(known))
    await session.execute(delete(ApiToken).where(*earlier))
    existing = (await session.execute(select(ApiToken).where(col(ApiToken.token_hash).in_(known)))).scalars().first()
    if existing is None:
        session.add(ApiToken(token_hash=known[0], role="node", node_id=node_id, created_at=now))
    else:
        existing.token_hash, existing.role, existing.tenant, existing.node_id = known[0], "node", None, node_id


async def revoke_node_credentials(session: AsyncSession, node_id: str) -> None:
    """The node's credentials stop working (in the caller's transaction)."""
    await session.execute(delete(ApiToken).where(col(ApiToken.role) == "node", col(ApiToken.node_id) == node_id))


def new_node_token() -> str:
    """A fresh random node credential (an admin's enrolment)."""
    return "fgn-" + secrets.token_hex(20)
