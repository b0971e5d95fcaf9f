"""Routes that stay put when a replica dies mid-attempt (issue 39 point 1; docs/swarm.md "In-flight microbatches").

checkfree.swarm.config.route gives pipeline ``p`` the node ``nodes[p % len(nodes)]`` of each stage's serving list.
Removing one node from that compacted list moves *other* pipelines too, and a pipeline that changes node at a
stage loses the chain sum that node built for it (checkfree.swarm.node.compute.OrderedGradients), so every
pipeline would have to start over. Here each pipeline keeps, at every stage, the node the attempt's ``begin``
gave it (``begun``) while that node still serves (``members``); only a pipeline whose node at a stage died gets a
substitute there: the serving node at index ``p mod len(serving)``, the same on every node (a deterministic
function of the two member lists). With ``members == begun`` every route is checkfree.swarm.config.route's.

The supervisor (checkfree.swarm.supervisor.attempts) and every node (checkfree.swarm.node.relay,
.driver, .gradient_sync) compute the same routes from the same two lists.
"""

from __future__ import annotations

import logging

log = logging.getLogger(__name__)

Members = dict[int, list[int]]
"""Stage → its serving node ids, by replica slot."""


def pipelines(begun: Members, stage: int) -> int:
    """The attempt's number of pipelines: its stage-0 nodes at ``begin``. A member list without stage 0 (a stage's
    exchange tested on its own) counts one pipeline per replica of ``stage``."""
    return len(begun.get(0) or begun.get(stage, []))


def node_of(pipeline: int, stage: int, begun: Members, members: Members) -> int | None:
    """The node that carries ``pipeline`` at ``stage``: its node at ``begin`` (stage 0: ``begun[0][pipeline]``,
    a transformer stage: ``begun[stage][pipeline mod len]``) if that node still serves, else the serving node at
    index ``pipeline mod len(serving)``; None when the stage has no serving node or no such pipeline exists."""
    live = members.get(stage, [])
    if not live or pipeline < 0:
        return None
    at_begin = begun.get(stage, [])
    if stage == 0:
        if pipeline >= len(at_begin):
            return None
        home: int | None = at_begin[pipeline]
    else:
        home = at_begin[pipeline % len(at_begin)] if at_begin else None
    if home in live:
        return home
    return live[pipeline % len(live)]


def stable_route(
    pipeline: int, begun: Members, members: Members, n_stages: int, order: list[int]
) -> list[int] | None:
    """Node ids one microbatch of ``pipeline`` visits: [its stage-0 node, its node of order[0], …] (:func:`node_of`
    at each stage); None when the pipeline does not exist or a stage has no serving node. Equals
    checkfree.swarm.config.route when ``members == begun``."""
    if pipeline >= len(begun.get(0, [])):
        return None
    path = []
    for s in [0, *order]:
        node = node_of(pipeline, s, begun, members)
        if node is None:
            return None
        path.append(node)
    return path if len(path) == n_stages + 1 else None


def carried(node: int, stage: int, begun: Members, members: Members) -> list[int]:
    """The pipelines ``node`` carries at ``stage`` (ascending)."""
    return [p for p in range(pipelines(begun, stage)) if node_of(p, stage, begun, members) == node]


def moved(begun: Members, before: Members, after: Members, n_stages: int) -> list[int]:
    """The pipelines whose node at some stage differs between the member lists ``before`` and ``after`` (a death
    took one of their nodes, or a substitute moved): they start over on their new route (ascending)."""
    out = []
    for p in range(len(begun.get(0, []))):
        if any(node_of(p, s, begun, before) != node_of(p, s, begun, after) for s in range(n_stages + 1)):
            out.append(p)
    return out
