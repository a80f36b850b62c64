"""A throwaway Redis Cluster that a fault scenario may fail over: three primaries, three replicas.

Each node is a ``redis-server --cluster-enabled yes`` in a directory of its own,
with the append-only file on and ``appendfsync always`` (as :class:`RedisServer`),
on a free loopback port whose cluster bus port (the port plus 10,000) is free
too. ``redis-cli --cluster create`` joins them, one replica per primary.
:meth:`ThrowawayRedisCluster.fail_over` SIGKILLs a primary and waits until the
cluster has promoted its replica; :meth:`ThrowawayRedisCluster.rejoin` starts
the killed node again, which comes back as a replica of its successor.
"""

from __future__ import annotations

import random
import shutil
import socket
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final, Self

from ._servers import ClosedOnExit, RedisServer, ServerUnavailable, running_servers

__all__ = ["Failover", "RedisClusterNode", "ThrowawayRedisCluster", "own_cluster", "track"]

_NODES: Final = 6
_BUS_OFFSET: Final = 10_000
_PORTS: Final = range(20_000, 40_000)
"""Where node ports are drawn from: their bus ports (plus 10,000) stay valid and clear of
the ephemeral range most systems hand out."""
_FAILOVER_TIMEOUT_S: Final = 60.0
NODE_TIMEOUT_MS: Final = 1_000
"""``cluster-node-timeout``: how long a silent primary takes to be judged failed."""


def _free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _cluster_port(taken: set[int]) -> int:
    """A free port whose bus port is free too, not among ``taken`` (nor their bus ports)."""
    while True:
        port = random.choice(_PORTS)
        clash = {port, port + _BUS_OFFSET} & (taken | {p + _BUS_OFFSET for p in taken})
        if not clash and _free(port) and _free(port + _BUS_OFFSET):
            return port


class RedisClusterNode(RedisServer):
    """One node of a throwaway Redis Cluster (a :class:`RedisServer` with cluster mode on)."""

    name = "redis-cluster-node"

    def __init__(self, port: int) -> None:
        super().__init__(appendfsync="always")
        self.port = port

    def _command(self) -> list[str]:
        return [*super()._command(), "--cluster-enabled", "yes",
                "--cluster-config-file", str(self.root / "nodes.conf"),
                "--cluster-node-timeout", str(NODE_TIMEOUT_MS),
                # A replica may always take over (else one whose link seems too old to
                # Redis' clock heuristics refuses, and the slots stay down).
                "--cluster-replica-validity-factor", "0",
                # A new replica syncs at once instead of after the default 5 s delay.
                "--repl-diskless-sync-delay", "0"]

    def cli(self, *args: str) -> str:
        """A ``redis-cli`` command against this node; its output."""
        result = subprocess.run(["redis-cli", "-h", "127.0.0.1", "-p", str(self.port), *args],
                                capture_output=True, text=True, timeout=10, check=False)
        return result.stdout


@dataclass(frozen=True, slots=True)
class Failover:
    """What :meth:`ThrowawayRedisCluster.fail_over` did."""

    killed_port: int
    promoted_port: int
    keys_on_killed: int
    """Keys the killed primary held just before the kill (the run's share on it)."""
    seconds: float
    """From the kill until the cluster reported ``cluster_state:ok`` with the replica promoted."""


class ThrowawayRedisCluster(ClosedOnExit):
    """Six throwaway nodes joined into a cluster; :attr:`url` is a ``redis+cluster://`` URL."""

    name = "redis-cluster"

    def __init__(self) -> None:
        for tool in ("redis-server", "redis-cli"):
            if shutil.which(tool) is None:
                raise ServerUnavailable(f"{tool} not found on PATH")
        taken: set[int] = set()
        self.nodes: list[RedisClusterNode] = []
        for _ in range(_NODES):
            port = _cluster_port(taken)
            taken.add(port)
            self.nodes.append(RedisClusterNode(port))
        self.kills = 0

    @property
    def url(self) -> str:
        """``redis+cluster://`` over every node (any of them serves as a seed)."""
        return "redis+cluster://" + ",".join(f"127.0.0.1:{n.port}" for n in self.nodes)

    @property
    def ports(self) -> set[int]:
        """The nodes' ports."""
        return {n.port for n in self.nodes}

    @property
    def running(self) -> bool:
        """Whether every node is up."""
        return all(n.running for n in self.nodes)

    def start(self) -> Self:
        """Start the nodes and join them into a cluster (once); wait until it is healthy."""
        fresh = not any((n.root / "nodes.conf").exists() for n in self.nodes)
        for node in self.nodes:
            if not node.running:
                node.start()
        if fresh:
            subprocess.run(
                ["redis-cli", "--cluster", "create",
                 *(f"127.0.0.1:{n.port}" for n in self.nodes),
                 "--cluster-replicas", "1", "--cluster-yes"],
                capture_output=True, check=True, timeout=60)
        self._wait(lambda: self._healthy(len(self.nodes) // 2) and self._replicating(),
                   "become healthy")
        return self

    def primaries(self) -> dict[int, RedisClusterNode]:
        """The running primaries, by port (as the first live node sees the cluster)."""
        view = self._nodes_view()
        return {n.port: n for n in self.nodes
                if n.running and "master" in view.get(n.port, "")}

    def fail_over(self) -> Failover:
        """SIGKILL the primary holding the most keys; wait until its replica is promoted."""
        sizes = {port: int(node.cli("DBSIZE").strip() or 0)
                 for port, node in self.primaries().items()}
        port = max(sizes, key=lambda p: sizes[p])
        victim = next(n for n in self.nodes if n.port == port)
        before = set(self.primaries())
        started = time.monotonic()
        victim.kill()
        self.kills += 1
        self._wait(lambda: self._healthy(len(before), without=port), "promote a replica")
        promoted = set(self.primaries()) - before
        return Failover(port, promoted.pop() if promoted else 0, sizes[port],
                        time.monotonic() - started)

    def rejoin(self) -> None:
        """Start every killed node again: each rejoins as a replica."""
        for node in self.nodes:
            if not node.running:
                node.start()
        self._wait(lambda: self._healthy(len(self.nodes) // 2) and self._replicating(),
                   "take the node back")

    def close(self) -> None:
        """Stop every node and remove its directory (idempotent)."""
        for node in self.nodes:
            node.close()

    def _nodes_view(self) -> dict[int, str]:
        """``CLUSTER NODES`` of the first live node: port -> its flags."""
        for node in self.nodes:
            if node.running:
                view: dict[int, str] = {}
                for line in node.cli("CLUSTER", "NODES").splitlines():
                    fields = line.split()
                    if len(fields) > 2 and ":" in fields[1]:
                        port = int(fields[1].split("@", 1)[0].rsplit(":", 1)[1])
                        view[port] = fields[2]
                return view
        return {}

    def _healthy(self, primaries: int, without: int | None = None) -> bool:
        """Every live node says ``cluster_state:ok`` and sees ``primaries`` live primaries."""
        live = [n for n in self.nodes if n.running and n.port != without]
        if not all("cluster_state:ok" in n.cli("CLUSTER", "INFO") for n in live):
            return False
        view = self._nodes_view()
        masters = [p for p, flags in view.items()
                   if "master" in flags and "fail" not in flags and p != without]
        return len(masters) == primaries

    def _replicating(self) -> bool:
        """Every live replica has its link to its primary up (its first sync is done)."""
        for node in self.nodes:
            if node.running:
                info = node.cli("INFO", "replication")
                if "role:slave" in info and "master_link_status:up" not in info:
                    return False
        return True

    def _wait(self, condition: Callable[[], bool], what: str) -> None:
        deadline = time.monotonic() + _FAILOVER_TIMEOUT_S
        while not condition():
            if time.monotonic() >= deadline:
                logs = " | ".join(n._log_tail()[-300:] for n in self.nodes)
                raise RuntimeError(f"the Redis Cluster did not {what} within "
                                   f"{_FAILOVER_TIMEOUT_S} s: {logs}")
            time.sleep(0.1)  # polling the cluster's own view against a deadline

    def __repr__(self) -> str:
        ports = ",".join(str(n.port) for n in self.nodes)
        return f"ThrowawayRedisCluster(ports={ports}, kills={self.kills})"


_clusters: list[ThrowawayRedisCluster] = []


def own_cluster(url: str) -> ThrowawayRedisCluster | None:
    """The throwaway cluster of this process that ``url`` names (by a node's port), if any."""
    ports = {int(part.rsplit(":", 1)[1]) for part in
             url.split("://", 1)[-1].split("/", 1)[0].split("?", 1)[0].split(",")
             if ":" in part and part.rsplit(":", 1)[1].isdigit()}
    for cluster in _clusters:
        if ports & cluster.ports and any(n in running_servers() for n in cluster.nodes):
            return cluster
    return None


def track(cluster: ThrowawayRedisCluster) -> ThrowawayRedisCluster:
    """Remember ``cluster`` so that :func:`own_cluster` finds it."""
    _clusters.append(cluster)
    return cluster

