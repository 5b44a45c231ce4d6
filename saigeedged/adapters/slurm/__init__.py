"""Executor slurm: Slurm's commands (cluster), the daemon's view of a node's container (node), the node's agent (agent)."""
