"""``<run_dir>/revocations.json``: the machines ``swarm revoke`` asked the supervisor to shut out
(checkfree.swarm.supervisor.machines), ``{"format": "checkfree-swarm-revocations-v1", "machines": [START, ...]}``."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictInt

from checkfree.schemas.fields import MAX_NODES, MAX_SWARM_NODES

REVOCATIONS_FORMAT = "checkfree-swarm-revocations-v1"


class Revocations(BaseModel):
    """The revocation requests of one run: the STARTs of the machines to revoke, in the order asked."""

    model_config = ConfigDict(strict=True, extra="forbid")
    format: Annotated[Literal["checkfree-swarm-revocations-v1"], Field(description=repr(REVOCATIONS_FORMAT))]
    machines: Annotated[
        list[Annotated[StrictInt, Field(ge=0, lt=MAX_NODES)]],
        Field(
            max_length=MAX_SWARM_NODES, description=f"a list of machine STARTs (node ids below {MAX_NODES:,})"
        ),
    ]
