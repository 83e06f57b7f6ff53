"""Node agent tokens: issued once, stored as their sha256 (node_agent_tokens), rotated and revoked.

`gpuaas host token` calls these as the owner; the service looks tokens up by `token_hash`.
"""

from __future__ import annotations

import hashlib
import secrets
from typing import Any

import psycopg

from reconciler import codes as reconciler_codes
from schemas import agentwire, dberrors
from schemas.errors import PermanentError


def new_token() -> str:
    return agentwire.TOKEN_PREFIX + secrets.token_urlsafe(32)


def token_hash(token: str) -> str:
    # The token is 256 random bits: a plain sha256 is enough (no dictionary to guess from), and a lookup by hash.
    return hashlib.sha256(token.encode()).hexdigest()


def issue_token(conn: psycopg.Connection[Any], node: str, *, rotate: bool) -> str:
    """A new token for `node`, stored hashed (run as the owner); `rotate` replaces one that exists."""
    token = new_token()
    with dberrors.wrapped(f"issue the agent token of {node}"), conn.transaction():
        if conn.execute("SELECT 1 FROM nodes WHERE name = %s", (node,)).fetchone() is None:
            raise PermanentError(f"no node {node!r} in the store", code=reconciler_codes.HOST_TOKEN_NO_NODE)
        if rotate:
            sql = (
                "INSERT INTO node_agent_tokens (node_name, token_sha256) VALUES (%s, %s) ON CONFLICT (node_name)"
                " DO UPDATE SET token_sha256 = EXCLUDED.token_sha256, rotated_at = now()"
            )
        else:
            sql = (
                "INSERT INTO node_agent_tokens (node_name, token_sha256) VALUES (%s, %s)"
                " ON CONFLICT (node_name) DO NOTHING"
            )
        if conn.execute(sql + " RETURNING node_name", (node, token_hash(token))).fetchone() is None:
            raise PermanentError(
                f"node {node} has a token already: `gpuaas host token rotate {node}` replaces it",
                code=reconciler_codes.HOST_TOKEN_EXISTS,
            )
    return token


def revoke_token(conn: psycopg.Connection[Any], node: str) -> bool:
    with dberrors.wrapped(f"revoke the agent token of {node}"):
        return (
            conn.execute("DELETE FROM node_agent_tokens WHERE node_name = %s RETURNING 1", (node,)).fetchone()
            is not None
        )
