"""Real Redis beyond one server for the tests: a 3+3 Redis Cluster and a Sentinel group.

Both are real ``redis-server`` processes on free loopback ports (the cluster bus
ports are chosen with ``cluster-port``, not assumed at port + 10000), started by
session fixtures (``tests/conftest.py``) once and only when a test asks. The
timeouts are short so a failover takes seconds: ``cluster-node-timeout`` and the
Sentinels' ``down-after-milliseconds`` are :data:`NODE_TIMEOUT_MS`.

A failover test kills a master with SIGKILL (:meth:`kill_master`) and then calls
:meth:`heal`, which restarts the dead process (it comes back as a replica of the
promoted one) and waits until the set is whole again, so the next test finds a
master with a linked replica.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import pytest
import redis

from pipeline.runtime.ports import free_port

#: Failure detection of both the cluster and the Sentinels, in ms.
NODE_TIMEOUT_MS = 1000
#: Deadline of a start or a heal (a loaded machine is slow).
WAIT_S = 60.0


def missing_tools() -> str | None:
    """Why the HA fixtures cannot run here (None: they can)."""
    for tool in ("redis-server", "redis-cli"):
        if shutil.which(tool) is None:
            return f"{tool} not on PATH (scripts/ensure-redis.sh installs it)"
    return None


def _wait(cond: Callable[[], object], what: str, within_s: float = WAIT_S) -> None:
    deadline = time.monotonic() + within_s
    while True:
        try:
            if cond():
                return
        except (redis.RedisError, OSError):
            pass
        if time.monotonic() > deadline:
            raise TimeoutError(f"redis HA fixture: {what} not reached in {within_s}s")
        time.sleep(0.05)


class Server:
    """One ``redis-server`` process (data node or Sentinel) with fixed arguments."""

    def __init__(self, directory: Path, port: int, args: list[str]) -> None:
        self.directory = directory
        self.port = port
        self.args = args
        self.proc: subprocess.Popen[bytes] | None = None
        directory.mkdir(parents=True, exist_ok=True)

    def start(self, *, replica_of: int | None = None) -> None:
        """Start with the fixed arguments; ``replica_of``: as a replica of the server on that
        port instead of whatever master the fixed arguments name."""
        exe = shutil.which("redis-server")
        assert exe is not None
        args = self.args
        if replica_of is not None:
            at = args.index("--replicaof") if "--replicaof" in args else len(args)
            args = [*args[:at], *args[at + 3 :], "--replicaof", "127.0.0.1", str(replica_of)]
        log = open(self.directory / "server.log", "ab")  # noqa: SIM115 - the child owns it
        try:
            self.proc = subprocess.Popen(
                [exe, *args], cwd=self.directory, stdout=log, stderr=subprocess.STDOUT
            )
        finally:
            log.close()
        _wait(self.client().ping, f"redis-server on {self.port} answering", 20)

    def client(self) -> redis.Redis:
        return redis.Redis(port=self.port, socket_timeout=5, socket_connect_timeout=1)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        """SIGKILL, as a crash would."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)


def _data_args(port: int, directory: Path) -> list[str]:
    # a replica's full sync starts at once (Redis waits 5 s for more replicas by default:
    # 5 s of every start and of every heal)
    return [
        "--port", str(port), "--bind", "127.0.0.1", "--dir", str(directory),
        "--save", "", "--appendonly", "no", "--daemonize", "no",
        "--repl-diskless-sync-delay", "0",
    ]  # fmt: skip


class _Group:
    """What both layouts share: started once per session, made whole and empty per test."""

    @property
    def url(self) -> str:
        raise NotImplementedError

    def start(self) -> _Group:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError

    def wait_whole(self) -> None:
        raise NotImplementedError

    def flush(self) -> None:
        raise NotImplementedError

    def live_masters(self) -> list[Server]:
        raise NotImplementedError

    def wait_replicated(self) -> None:
        """Until every master's replicas hold all it has written (so that a kill loses
        nothing: what a test wrote before it is the ground truth after the failover)."""

        def caught_up() -> bool:
            for master in self.live_masters():
                info = master.client().info("replication")
                offsets = [v["offset"] for k, v in info.items() if k.startswith("slave")]
                if not offsets or min(offsets) < info["master_repl_offset"]:
                    return False
            return True

        _wait(caught_up, "replicas caught up with their masters")

    def ready_url(self) -> str:
        """The URL of this group, whole again (after a failover test's heal) and flushed."""
        self.wait_whole()
        self.flush()
        return str(self.url)


G = TypeVar("G", bound=_Group)


def session_group(make: Callable[[], G], what: str) -> Iterator[G]:
    """A session fixture's body: ``make()`` started, stopped at the end; skipped (naming
    ``what``) where the tools are missing."""
    reason = missing_tools()
    if reason:
        pytest.skip(f"no {what}: {reason}")
    group = make()
    try:
        group.start()
        yield group
    finally:
        group.stop()


class LocalCluster(_Group):
    """Six cluster-mode ``redis-server``s made into 3 masters + 3 replicas by ``redis-cli``."""

    def __init__(self, directory: Path, *, node_timeout_ms: int = NODE_TIMEOUT_MS) -> None:
        self.nodes: list[Server] = []
        for i in range(6):
            port, bus = free_port(), free_port()
            d = directory / f"node{i}"
            args = _data_args(port, d) + [
                "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
                "--cluster-port", str(bus), "--cluster-node-timeout", str(node_timeout_ms),
            ]  # fmt: skip
            self.nodes.append(Server(d, port, args))

    @property
    def url(self) -> str:
        return "redis+cluster://" + ",".join(f"127.0.0.1:{n.port}" for n in self.nodes[:3])

    def start(self) -> LocalCluster:
        for node in self.nodes:
            node.start()
        subprocess.run(
            ["redis-cli", "--cluster", "create"]
            + [f"127.0.0.1:{n.port}" for n in self.nodes]
            + ["--cluster-replicas", "1", "--cluster-yes"],
            check=True,
            stdout=subprocess.DEVNULL,
            timeout=60,
        )
        self.wait_whole()
        return self

    def _state_ok(self, node: Server) -> bool:
        info = node.client().cluster("info")
        return bool(info["cluster_state"] == "ok")

    def live_masters(self) -> list[Server]:
        return self.masters()

    def masters(self) -> list[Server]:
        return [
            n
            for n in self.nodes
            if n.alive() and n.client().info("replication")["role"] == "master"
        ]

    def wait_whole(self) -> None:
        """Every node up and ``cluster_state:ok``, 3 masters each with a linked replica."""

        def whole() -> bool:
            if not all(n.alive() and self._state_ok(n) for n in self.nodes):
                return False
            linked = 0
            for node in self.nodes:
                info = node.client().info("replication")
                if info["role"] == "slave" and info.get("master_link_status") == "up":
                    linked += 1
            return linked == 3

        _wait(whole, "cluster whole (6 nodes ok, 3 replicas linked)")

    def master_of(self, key: str) -> Server:
        slot = int(self.nodes[0].client().cluster("keyslot", key))
        for node in self.masters():
            for entry in node.client().cluster("slots"):
                if entry[0] <= slot <= entry[1] and entry[2][1] == node.port:
                    return node
        raise LookupError(f"no master for slot {slot}")

    def replica(self) -> Server:
        """A live replica (killing it starts no failover)."""
        return next(
            n for n in self.nodes if n.alive() and n.client().info("replication")["role"] == "slave"
        )

    def kill_master(self, key: str) -> Server:
        """SIGKILL the master owning ``key``; return it (for :meth:`heal`)."""
        node = self.master_of(key)
        node.kill()
        return node

    def wait_failed_over(self, dead: Server) -> None:
        """Until every live node reports ``cluster_state:ok`` with no slot served by ``dead``
        (right after the kill the nodes still report ok: they have not noticed yet)."""
        live = [n for n in self.nodes if n is not dead and n.alive()]

        def failed_over(node: Server) -> bool:
            if not self._state_ok(node):
                return False
            return all(entry[2][1] != dead.port for entry in node.client().cluster("slots"))

        _wait(lambda: all(failed_over(n) for n in live), "cluster ok after failover")

    def heal(self) -> None:
        for node in self.nodes:
            if not node.alive():
                node.start()
        self.wait_whole()

    def flush(self) -> None:
        for node in self.masters():
            node.client().flushall()

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()


SERVICE = "sluice"


class LocalSentinels(_Group):
    """A master, one replica and three Sentinels watching them as service :data:`SERVICE`."""

    def __init__(self, directory: Path, *, node_timeout_ms: int = NODE_TIMEOUT_MS) -> None:
        mport, rport = free_port(), free_port()
        self.data = [
            Server(directory / "a", mport, _data_args(mport, directory / "a")),
            Server(
                directory / "b",
                rport,
                _data_args(rport, directory / "b") + ["--replicaof", "127.0.0.1", str(mport)],
            ),
        ]
        self.sentinels: list[Server] = []
        for i in range(3):
            port = free_port()
            d = directory / f"sentinel{i}"
            d.mkdir(parents=True, exist_ok=True)
            conf = d / "sentinel.conf"
            conf.write_text(
                f"port {port}\nbind 127.0.0.1\ndir {d}\n"
                f"sentinel monitor {SERVICE} 127.0.0.1 {mport} 2\n"
                f"sentinel down-after-milliseconds {SERVICE} {node_timeout_ms}\n"
                f"sentinel failover-timeout {SERVICE} {max(3 * node_timeout_ms, 10_000)}\n"
                f"sentinel parallel-syncs {SERVICE} 1\n"
            )
            self.sentinels.append(Server(d, port, [str(conf), "--sentinel"]))

    @property
    def url(self) -> str:
        hosts = ",".join(f"127.0.0.1:{s.port}" for s in self.sentinels)
        return f"redis+sentinel://{hosts}/{SERVICE}/0"

    def start(self) -> LocalSentinels:
        for server in self.data + self.sentinels:
            server.start()
        self.wait_whole()
        return self

    def live_masters(self) -> list[Server]:
        return [self.master()]

    def master(self) -> Server:
        host, port = self.sentinels[0].client().sentinel_get_master_addr_by_name(SERVICE)
        return next(s for s in self.data if s.port == int(port))

    def wait_whole(self) -> None:
        """Both data nodes up, every Sentinel naming the same live master with a linked
        replica, and each Sentinel knowing the other two."""

        def whole() -> bool:
            if not all(s.alive() for s in self.data + self.sentinels):
                return False
            addrs = {
                tuple(s.client().sentinel_get_master_addr_by_name(SERVICE)) for s in self.sentinels
            }
            if len(addrs) != 1:
                return False
            master = self.master()
            info = master.client().info("replication")
            if info["role"] != "master" or info.get("connected_slaves", 0) < 1:
                return False
            replica = next(s for s in self.data if s is not master)
            rinfo = replica.client().info("replication")
            if rinfo.get("master_link_status") != "up" or int(rinfo["master_port"]) != master.port:
                return False
            for s in self.sentinels:
                state = s.client().sentinel_master(SERVICE)
                if int(state["num-other-sentinels"]) < 2 or int(state["num-slaves"]) < 1:
                    return False
                if state["flags"] != "master":
                    return False
            return True

        _wait(whole, "sentinel group whole (master, linked replica, 3 sentinels agreeing)")

    def kill_master(self) -> Server:
        node = self.master()
        node.kill()
        return node

    def wait_failed_over(self, dead: Server) -> None:
        _wait(lambda: self.master() is not dead, "sentinels promoting the replica")

    def heal(self) -> None:
        """Restart what died; a dead data node comes back as a replica of the master the
        Sentinels promoted meanwhile, as an operator would restart it. (Started as a
        master, it waited for the Sentinels to turn it into a replica: their INFO period
        and convert-to-slave delay, 8-12 s of every Sentinel failover test.)"""
        for server in self.sentinels:
            if not server.alive():
                server.start()
        master = self.master()
        for server in self.data:
            if not server.alive():
                server.start(replica_of=None if server is master else master.port)
        self.wait_whole()

    def flush(self) -> None:
        self.master().client().flushall()

    def stop(self) -> None:
        for server in self.sentinels + self.data:
            server.stop()
