"""What `check` and `status` say about the Slurm partition of executor slurm: one line per node (up or why not,
the targets whose GRES and image feature it has), read from `sinfo --json`."""

from __future__ import annotations

import time
from collections.abc import Sequence

from saigeedged.adapters.slurm import leftout
from saigeedged.adapters.slurm.cluster import Slurm, images
from saigeedged.adapters.slurm.leftout import Left
from saigeedged.config import Config
from saigeedged.engines import CONTAINER_TARGETS
from saigeedged.errors import SaigeError
from saigeedged.executor import ClusterNode, feature, serves
from saigeedged.guards import printable


def node_line(node: ClusterNode, wanted: dict[str, str], left_out: Sequence[Left] = ()) -> str:
    """`name  up|down  targets...`: a target counts when the node has its GRES and its image's feature; what it
    lacks is named, so the operator knows which `Feature=`/`Gres=` to add; and what the daemon leaves it out of, until
    when and why (its agent could not serve: unfit.py)."""
    served = serves(node, wanted)
    lacks = [f"{t} (needs Gres={t}:1 Feature={feature(wanted[t])})" for t in CONTAINER_TARGETS if t not in served]
    state = "up" if node.up else f"down ({node.state}{': ' + node.reason if node.reason else ''})"
    left = [f"{left.of} by the daemon until {time.strftime('%H:%M:%S', time.localtime(left.until))}: {left.why}"
            for left in left_out if left.node == node.name]
    return printable(f"{node.name:<24} {state:<8} serves {', '.join(served) or 'nothing'}"
                     + (f"; lacks {', '.join(lacks)}" if lacks else "") + "".join(f"; {said}" for said in left))


def lines(config: Config, nodes: Sequence[ClusterNode] | None = None) -> list[str]:
    """A header and a line per node of the partition; one line saying why when Slurm does not answer."""
    head = f"PARTITION {config.executor.partition}"
    try:
        found = list(nodes) if nodes is not None else Slurm(config.executor).nodes(fresh=True)
    except SaigeError as exc:
        return [head, printable(f"slurm not answering: {exc.message}")]
    left = leftout.current(config.state_dir, time.time())
    return [head, *(node_line(n, images(config), left) for n in found)] if found else [head, "no nodes"]
