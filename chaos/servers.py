"""Private MariaDB and Redis servers on free loopback ports, in a directory of the run's own.

Never the shared servers on 3306 and 6379: every server here is started by
the harness, listens on 127.0.0.1 on a port nobody held a moment before,
keeps its data under the run's temporary directory, and is killed when the
run ends, however it ends. The scenarios kill, freeze and restart them.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .tuning import Tuning

DATABASE_NAME = "chaos"


def free_port() -> int:
    """A loopback port nothing listens on now (the kernel's pick)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _wait_for(answers: Any, what: str, timeout: float, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with status {proc.returncode} while starting")
        if answers():
            return
        time.sleep(0.05)
    raise RuntimeError(f"{what} did not answer within {timeout:g}s")


class Server:
    """One server process: start, and the faults done to it (kill -9, freeze, thaw)."""

    name = "server"
    proc: subprocess.Popen[bytes] | None = None

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.port = free_port()

    def _spawn(self, args: list[str]) -> None:
        log = (self.directory / f"{self.name}.out").open("ab")
        # A session of its own: a Ctrl-C in the terminal reaches the harness, which cleans up.
        self.proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        log.close()

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        """SIGKILL and reap: the crash a scenario wants, or the cleanup at the end."""
        if self.proc is not None:
            if self.proc.poll() is None:
                os.kill(self.proc.pid, signal.SIGCONT)  # a frozen process dies as well, but reap it awake
                self.proc.kill()
            self.proc.wait()
            self.proc = None

    def freeze(self) -> None:
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGSTOP)

    def thaw(self) -> None:
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGCONT)


class PrivateMariaDB(Server):
    name = "mariadb"

    def __init__(self, directory: Path) -> None:
        super().__init__(directory)
        self.datadir = directory / "data"
        self.socket = directory / "mariadb.sock"

    @property
    def url(self) -> str:
        return f"mysql://root:@127.0.0.1:{self.port}/{DATABASE_NAME}"

    def install(self) -> None:
        """A fresh data directory (about 2 s): system tables only, root without a password."""
        self.directory.mkdir(parents=True, exist_ok=True)
        with (self.directory / "install.out").open("wb") as log:
            subprocess.run(
                ["mariadb-install-db", "--no-defaults", "--user=root", f"--datadir={self.datadir}",
                 "--auth-root-authentication-method=normal", "--skip-test-db", "--skip-name-resolve"],
                stdout=log, stderr=subprocess.STDOUT, check=True)

    def start(self, timeout: float = 90) -> None:
        """Start on the data directory as it is (after a kill -9: InnoDB recovers it) and wait."""
        self._spawn([
            "mariadbd", "--no-defaults", f"--datadir={self.datadir}", f"--port={self.port}",
            f"--socket={self.socket}", "--bind-address=127.0.0.1", "--user=root",
            "--skip-grant-tables", "--skip-name-resolve", "--max-connections=500",
            "--innodb-buffer-pool-size=256M", f"--log-error={self.directory / 'error.log'}",
            f"--pid-file={self.directory / 'mariadb.pid'}",
        ])
        assert self.proc is not None
        _wait_for(self.answers, "MariaDB", timeout, self.proc)

    def answers(self) -> bool:
        import MySQLdb

        try:
            connection = MySQLdb.connect(host="127.0.0.1", port=self.port, user="root",
                                         connect_timeout=1)
        except MySQLdb.Error:
            return False
        connection.close()
        return True

    def create_database(self) -> None:
        import MySQLdb

        connection = MySQLdb.connect(host="127.0.0.1", port=self.port, user="root")
        try:
            connection.cursor().execute(
                f"CREATE DATABASE IF NOT EXISTS {DATABASE_NAME} CHARACTER SET utf8mb4")
        finally:
            connection.close()


class PrivatePostgreSQL(Server):
    """PostgreSQL (the newest Debian installs under /usr/lib/postgresql), for the soak on that database.

    PostgreSQL refuses to run as root: as root, initdb and the server run as the ``postgres``
    user, started directly (``Popen(user=...)``, no ``runuser`` between), so the process the
    harness holds and kills is the server itself. That user must reach its data directory: the
    directories above it that lack it get the search bit for others (o+x: no listing, no
    reading). The superuser ``postgres`` logs in over TCP on loopback without a password (trust).
    """

    name = "postgresql"

    def __init__(self, directory: Path) -> None:
        super().__init__(directory)
        self.datadir = directory / "data"
        versions = sorted(Path("/usr/lib/postgresql").glob("*/bin/postgres"),
                          key=lambda path: int(path.parent.parent.name) if path.parent.parent.name.isdigit() else 0)
        self.bin = versions[-1].parent if versions else Path("/usr/lib/postgresql/15/bin")

    @property
    def url(self) -> str:
        return f"postgres://postgres@127.0.0.1:{self.port}/{DATABASE_NAME}"

    def _as_owner(self) -> dict[str, Any]:
        """Popen's keywords that run a process as the postgres user when the harness is root."""
        return {"user": "postgres", "group": "postgres"} if os.geteuid() == 0 else {}

    def install(self) -> None:
        """A fresh cluster (about 2 s): initdb into an empty data directory the server's user owns."""
        self.directory.mkdir(parents=True, exist_ok=True)
        if os.geteuid() == 0:
            shutil.chown(self.directory, "postgres", "postgres")
            for parent in self.directory.resolve().parents:
                mode = parent.stat().st_mode
                if mode & 0o001:
                    break
                parent.chmod(mode | 0o001)
        with (self.directory / "install.out").open("wb") as log:
            subprocess.run([str(self.bin / "initdb"), "-D", str(self.datadir), "-U", "postgres", "--auth=trust",
                            "-E", "UTF8", "--no-locale", "--no-sync"],
                           stdout=log, stderr=subprocess.STDOUT, check=True, **self._as_owner())

    def start(self, timeout: float = 90) -> None:
        """Start on the data directory as it is (after a kill -9: WAL recovery) and wait."""
        log = (self.directory / f"{self.name}.out").open("ab")
        self.proc = subprocess.Popen(
            [str(self.bin / "postgres"), "-D", str(self.datadir), "-p", str(self.port),
             "-c", "listen_addresses=127.0.0.1", "-c", f"unix_socket_directories={self.directory}",
             "-c", "max_connections=500", "-c", "shared_buffers=256MB"],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True, **self._as_owner())
        log.close()
        _wait_for(self.answers, "PostgreSQL", timeout, self.proc)

    def kill(self) -> None:
        """An immediate shutdown (SIGQUIT: no checkpoint, WAL recovery at the next start, as after a
        crash, but the backends and the shared memory go with it); after 10 s, SIGKILL to the
        server's whole process group. Then reap."""
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGCONT)
            os.kill(self.proc.pid, signal.SIGQUIT)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
        super().kill()

    def answers(self) -> bool:
        import psycopg

        try:
            psycopg.connect(host="127.0.0.1", port=self.port, user="postgres", dbname="postgres",
                            connect_timeout=1).close()
        except psycopg.Error:
            return False
        return True

    def create_database(self) -> None:
        import psycopg

        with psycopg.connect(host="127.0.0.1", port=self.port, user="postgres", dbname="postgres",
                             autocommit=True) as connection:
            exists = connection.execute("SELECT 1 FROM pg_database WHERE datname = %s", [DATABASE_NAME]).fetchone()
            if not exists:
                connection.execute(f"CREATE DATABASE {DATABASE_NAME}")


class PrivateRedis(Server):
    name = "redis"

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, *, aof: bool = False, fresh: bool = False, timeout: float = 30) -> None:
        """Start on this port; ``aof``: every write fsynced to an append-only file first.

        ``fresh`` empties the data directory first. Without ``aof`` nothing is
        ever written to disk, so a restart comes back empty.
        """
        data = self.directory / "data"
        if fresh:
            shutil.rmtree(data, ignore_errors=True)
        data.mkdir(parents=True, exist_ok=True)
        persistence = (["--appendonly", "yes", "--appendfsync", "always"] if aof
                       else ["--appendonly", "no"])
        self._spawn(["redis-server", "--port", str(self.port), "--bind", "127.0.0.1",
                     "--save", "", "--dir", str(data), *persistence, *self._mode()])
        assert self.proc is not None
        _wait_for(self.answers, "Redis", timeout, self.proc)

    def _mode(self) -> list[str]:
        """Further ``redis-server`` options: none for a standalone server."""
        return []

    def logs(self) -> list[Path]:
        return [self.directory / "redis.out"]

    def answers(self) -> bool:
        import redis

        try:
            return bool(redis.Redis(port=self.port, socket_timeout=1, socket_connect_timeout=1).ping())
        except redis.RedisError:
            return False


class ClusterNode(PrivateRedis):
    """One primary of a private Redis Cluster: its cluster bus on a free port of its own, and
    its node table (``nodes.conf``) in its data directory, so a restart rejoins the cluster
    with the slots it had (and, without persistence, none of its keys)."""

    def __init__(self, directory: Path) -> None:
        super().__init__(directory)
        self.bus_port = free_port()

    def _mode(self) -> list[str]:
        return ["--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
                "--cluster-port", str(self.bus_port), "--cluster-node-timeout", "2000"]

    def cluster_ok(self, primaries: int, nodes: int) -> bool:
        """Every slot served, as this node sees it, by the cluster's ``primaries``, and every one
        of its ``nodes`` known: the state can read ok while gossip has yet to reach a busy node."""
        import redis

        try:
            info = redis.Redis(port=self.port, socket_timeout=1, socket_connect_timeout=1).cluster("info")
        except redis.RedisError:
            return False
        return (info.get("cluster_state") == "ok" and str(info.get("cluster_slots_ok")) == "16384"
                and str(info.get("cluster_size")) == str(primaries)
                and str(info.get("cluster_known_nodes")) == str(nodes))


class PrivateRedisCluster:
    """The queue's Redis as a Redis Cluster of three primaries (``--redis-cluster``).

    It takes the faults a standalone server takes, on every node at once: a
    SIGKILL, a restart (empty, from each node's snapshot, or from its
    append-only file: each node keeps its slots), a freeze and a thaw. The
    scenarios cannot tell it from one server but for the URL. With ``replicas``, each primary
    has that many replicas (the nodes after the primaries), for a test that fails one over.
    """

    name = "redis-cluster"
    size = 3

    def __init__(self, directory: Path, replicas: int = 0) -> None:
        self.directory = directory
        self.replicas = replicas
        self.nodes = [ClusterNode(directory / f"node-{index}") for index in range(self.size * (1 + replicas))]
        self.created = False

    @property
    def port(self) -> int:
        return self.nodes[0].port

    @property
    def url(self) -> str:
        """The seed node: the client discovers the others from it."""
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def running(self) -> bool:
        return all(node.running for node in self.nodes)

    def start(self, *, aof: bool = False, fresh: bool = False, timeout: float = 30) -> None:
        """Start every node; a fresh start (or a first) creates the cluster, a later one waits for
        the nodes to find each other again. Returns once every slot is served."""
        for node in self.nodes:
            node.directory.mkdir(parents=True, exist_ok=True)
            node.start(aof=aof, fresh=fresh, timeout=timeout)
        if fresh or not self.created:
            # A node writes its table at its first start, alone in it: the cluster is made here.
            self._create()
            self.created = True
        deadline = time.monotonic() + timeout
        while not self.answers():
            if time.monotonic() > deadline:
                raise RuntimeError(f"the private Redis Cluster did not become ok within {timeout:g}s")
            time.sleep(0.05)

    def _create(self) -> None:
        with (self.directory / "create.out").open("ab") as log:
            subprocess.run(["redis-cli", "--cluster", "create",
                            *(f"127.0.0.1:{node.port}" for node in self.nodes),
                            "--cluster-replicas", str(self.replicas), "--cluster-yes"],
                           stdout=log, stderr=subprocess.STDOUT, check=True)

    def answers(self) -> bool:
        return all(node.cluster_ok(self.size, len(self.nodes)) for node in self.nodes)

    def kill(self) -> None:
        for node in self.nodes:
            node.kill()

    def freeze(self) -> None:
        for node in self.nodes:
            node.freeze()

    def thaw(self) -> None:
        for node in self.nodes:
            node.thaw()

    def logs(self) -> list[Path]:
        return [log for node in self.nodes for log in node.logs()]


@dataclass
class Servers:
    # The database: MariaDB for the fault runs; MariaDB or PostgreSQL for the soak (chaos.soak).
    mariadb: PrivateMariaDB | PrivatePostgreSQL
    # The queue's Redis, which the scenarios fault: a standalone server or a cluster.
    redis: PrivateRedis | PrivateRedisCluster
    # With a cluster for the queue, the shop's cache (django-redis, one server) has its own,
    # which no scenario touches.
    cache: PrivateRedis | None = None

    @property
    def cluster(self) -> bool:
        return isinstance(self.redis, PrivateRedisCluster)

    def kill_all(self) -> None:
        for server in (self.redis, self.cache, self.mariadb):
            if server is not None:
                server.kill()


def child_environment(servers: Servers, tuning: Tuning) -> dict[str, str]:
    """The environment of every process the harness starts, and of the harness itself.

    Inherited ``ORDER_TIMEOUT_*`` and Redis Cluster variables are dropped, so
    nothing from the caller's shell can point a process elsewhere.
    """
    root = str(Path(__file__).resolve().parent.parent)
    inherited = {key: value for key, value in os.environ.items()
                 if not key.startswith(("ORDER_TIMEOUT_", "CHAOS_", "SHOP_", "BENCH"))
                 and key not in ("REDIS_CLUSTER_URL", "CELERY_BROKER_URL", "CONN_MAX_AGE")}
    if servers.cache is not None:
        redis = {"REDIS_URL": servers.cache.url, "REDIS_CLUSTER_URL": servers.redis.url}
    else:
        redis = {"REDIS_URL": servers.redis.url}
    return {**inherited, **tuning.environment(), "DJANGO_SETTINGS_MODULE": "chaos.settings",
            "DATABASE_URL": servers.mariadb.url, **redis,
            # Persistent connections, as a long-running consumer has them.
            "CONN_MAX_AGE": "600", "SHOP_RECORD_EXPIRIES": "0",
            "PYTHONPATH": root, "PYTHONUNBUFFERED": "1"}
