"""The long-running service: the run loop, the worker, outages, recovery and the ops thread."""
