"""The files that carry a swarm's keys (checkfree.swarm.wire.auth), both ours (unknown keys refused):

- a machine's join token, ``<run_dir>/join_tokens/machine<START>.json``, what a launcher on another machine reads
  to join: ``{"version": 2, "bootstrap": ADDRESS, "supervisor_key": KEY, "machine": {"start", "end", "first",
  "every", "offset"}, "machine_secret": KEY}``; that the share is one of a swarm's (``offset < every``,
  ``start < end <= first``) is the reader's check (``Machine.from_json``);
- a node's key file, ``<run_dir>/keys/node<ID>.json``: its id, its CURVE secret, the supervisor's public key and
  the keys it admits until WELCOME.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictStr

from checkfree.schemas.fields import MAX_NAME, MAX_NODES, count

Z85_KEY = r"^[0-9A-Za-z.\-:+=^!/*?&<>()\[\]{}@%$#]{40}$"
"""A CURVE key or secret in Z85: 40 characters of its alphabet."""
Z85 = Annotated[StrictStr, Field(pattern=Z85_KEY, description="40 Z85 characters (a CURVE key)")]
NodeId = count(0, MAX_NODES, f"a node id in [0, {MAX_NODES:,}]")


class Share(BaseModel):
    """A machine's share of the swarm's node ids: initial ids START..END−1, replacement ids first + offset + every·k."""

    model_config = ConfigDict(strict=True, extra="forbid")
    start: NodeId
    end: NodeId
    first: NodeId
    every: count(1, MAX_NODES)
    offset: NodeId


class JoinToken(BaseModel):
    """One machine's join token (version 2: the machine's own secret, never the swarm's)."""

    model_config = ConfigDict(strict=True, extra="forbid")
    version: Literal[2]
    bootstrap: Annotated[
        StrictStr, Field(min_length=1, max_length=MAX_NAME, description="an address tcp://HOST:PORT")
    ]
    supervisor_key: Z85
    machine: Share
    machine_secret: Z85


class KeyFile(BaseModel):
    """A node's key file (``<run_dir>/keys/node<ID>.json``, written 0600 by the supervisor before the node starts):
    its id, its CURVE secret, the supervisor's public key and the public keys it admits until WELCOME."""

    model_config = ConfigDict(strict=True, extra="forbid")
    node: NodeId
    secret_key: Z85
    supervisor_key: Z85
    keys: Annotated[
        dict[Annotated[StrictStr, Field(pattern=r"^[0-9]{1,7}$")], Z85],
        Field(max_length=MAX_NODES, description="an object of node id -> public key"),
    ] = {}
