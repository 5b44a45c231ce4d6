"""The only package that talks to Docker: engines, their long-lived compiler containers, the steps exec'd in them.

api: typed Protocols of the docker-py calls and `connect`; spec: what a container must look like; lifecycle:
find, create, start, recreate; execs: steps, kills, reaping; detached: a step followed through its files;
engine: one engine, a worker's containers on it and the finishing stage's (Beside).
"""

from saigeedged.adapters.docker.api import ENGINE_ERRORS, DockerAPI, connect, reaching_engine
from saigeedged.adapters.docker.engine import Beside, Containers, Engine
from saigeedged.adapters.docker.execs import Container
from saigeedged.adapters.docker.spec import MANAGED_LABEL, Spec, exec_user, pick_runtime

__all__ = ["ENGINE_ERRORS", "MANAGED_LABEL", "Beside", "Container", "Containers", "DockerAPI", "Engine", "Spec", "connect",
           "exec_user", "pick_runtime", "reaching_engine"]
