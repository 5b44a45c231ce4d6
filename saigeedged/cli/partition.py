"""What `check` and `status` say about the Slurm partition of executor slurm: one line per node (up or why not,
the targets whose GRES and image feature it has), read from `sinfo --json`."""

from __future__ import annotations

from collections.abc import Sequence

from saigeedged.adapters.slurm.cluster import Slurm, images
from saigeedged.config import Config
from saigeedged.engines import CONTAINER_TARGETS
from saigeedged.errors import SaigeError
from saigeedged.executor import ClusterNode, feature, serves
from saigeedged.guards import printable


def node_line(node: ClusterNode, wanted: dict[str, str]) -> str:
    """`name  up|down  targets...`: a target counts when the node has its GRES and its image's feature; what it
    lacks is named, so the operator knows which `Feature=`/`Gres=` to add."""
    served = serves(node, wanted)
    lacks = [f"{t} (needs Gres={t}:1 Feature={feature(wanted[t])})" for t in CONTAINER_TARGETS if t not in served]
    state = "up" if node.up else f"down ({node.state}{': ' + node.reason if node.reason else ''})"
    return printable(f"{node.name:<24} {state:<8} serves {', '.join(served) or 'nothing'}"
                     + (f"; lacks {', '.join(lacks)}" if lacks else ""))


def lines(config: Config, nodes: Sequence[ClusterNode] | None = None) -> list[str]:
    """A header and a line per node of the partition; one line saying why when Slurm does not answer."""
    head = f"PARTITION {config.executor.partition}"
    try:
        found = list(nodes) if nodes is not None else Slurm(config.executor).nodes(fresh=True)
    except SaigeError as exc:
        return [head, printable(f"slurm not answering: {exc.message}")]
    return [head, *(node_line(n, images(config)) for n in found)] if found else [head, "no nodes"]
