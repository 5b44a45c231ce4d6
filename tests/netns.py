"""Network namespaces for test engines: one veth pair to the host and one private /30 each, picked among free ones."""

from __future__ import annotations

import ipaddress
import json
import subprocess
from dataclasses import dataclass

# Candidate /30s come from these private ranges; a /30 overlapping any address or route of the host is skipped.
POOLS = ("10.213.0.0/24", "172.31.213.0/24", "192.168.213.0/24")


def ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], check=check, capture_output=True, text=True)


@dataclass(frozen=True)
class Netns:
    """A namespace NAME reached from the host through veth `host_if` (host_addr) <-> `ns_if` (addr), a /30."""

    name: str
    host_if: str
    host_addr: str
    addr: str

    @property
    def path(self) -> str:
        return f"/run/netns/{self.name}"

    @property
    def ns_if(self) -> str:
        return self.host_if[:-1] + "n"


def taken_networks() -> list[ipaddress.IPv4Network]:
    """Every IPv4 network the host already has an address or a route in (the default route excepted)."""
    nets = []
    for route in json.loads(ip("-j", "-4", "route", "show", "table", "all").stdout or "[]"):
        try:
            nets.append(ipaddress.IPv4Network(route.get("dst", "default"), strict=False))
        except ValueError:  # "default"
            continue
    for link in json.loads(ip("-j", "-4", "addr").stdout or "[]"):
        for addr in link.get("addr_info", []):
            nets.append(ipaddress.IPv4Network(f"{addr['local']}/{addr['prefixlen']}", strict=False))
    return [n for n in nets if n.prefixlen > 0]


def free_subnets(count: int) -> list[ipaddress.IPv4Network]:
    """`count` /30s of POOLS that overlap nothing on the host (call under the allocation lock)."""
    taken = taken_networks()
    found = []
    for pool in POOLS:
        for subnet in ipaddress.IPv4Network(pool).subnets(new_prefix=30):
            if not any(subnet.overlaps(t) for t in taken):
                found.append(subnet)
                if len(found) == count:
                    return found
    raise RuntimeError(f"no free /30 left in {POOLS} for {count} test namespaces")


def create(name: str, host_if: str, subnet: ipaddress.IPv4Network) -> Netns:
    """Add namespace `name` with a veth pair, the first host address on the host side, the second inside."""
    host_addr, addr = (str(a) for a in list(subnet.hosts())[:2])
    ns = Netns(name, host_if, host_addr, addr)
    ip("netns", "add", name)
    try:
        ip("link", "add", host_if, "type", "veth", "peer", "name", ns.ns_if, "netns", name)
        ip("addr", "add", f"{host_addr}/{subnet.prefixlen}", "dev", host_if)
        ip("link", "set", host_if, "up")
        ip("-n", name, "addr", "add", f"{addr}/{subnet.prefixlen}", "dev", ns.ns_if)
        ip("-n", name, "link", "set", ns.ns_if, "up")
        ip("-n", name, "link", "set", "lo", "up")
    except subprocess.CalledProcessError as exc:
        delete(name, host_if)
        raise RuntimeError(f"creating namespace {name}: {exc.stderr.strip()}") from exc
    return ns


def delete(name: str, host_if: str) -> None:
    """Remove the namespace (its veth end goes with it) and the host end, whichever of them exists."""
    ip("netns", "delete", name, check=False)
    ip("link", "delete", host_if, check=False)


def names(prefix: str) -> list[str]:
    """Namespaces whose name starts with `prefix`."""
    listed = json.loads(ip("-j", "netns", "list").stdout or "[]")
    return [entry["name"] for entry in listed if entry["name"].startswith(prefix)]


def links(prefix: str) -> list[str]:
    """Host interfaces whose name starts with `prefix`."""
    listed = json.loads(ip("-j", "link", "show").stdout or "[]")
    return [entry["ifname"] for entry in listed if entry["ifname"].startswith(prefix)]


def pids(name: str) -> list[int]:
    """Processes living in namespace `name` (none when it is gone)."""
    out = ip("netns", "pids", name, check=False).stdout
    return [int(p) for p in out.split()]
