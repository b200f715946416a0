"""The scale-out rig: N latchkey instances on loopback behind HAProxy
(health-checked on /health/ready), one PostgreSQL, a Redis Cluster (3
masters, each with a replica) and a real SMTP server. Every instance has
the same secret and issuer, as docs/deploy.md says a deployment must.

`scripts/loadtest rig` starts it and keeps it up until Ctrl-C; the fault
suite (loadtest/faults.py) and the scaling run (loadtest/scaling.py) drive
it from Python. Each part can be stopped, frozen and started again: that is
what the faults are made of. Everything it starts listens on 127.0.0.1 and
is stopped (and its files removed) by `stop()`."""

import base64
import os
import random
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from .common import ROOT, RunError, free_port, http, say, wait_port, wait_until
from .tools import apt_install, pip_install

ISSUER = "http://latchkey.rig"
HEALTH_INTERVAL_MS = 500  # HAProxy's check interval; 2 failures mark a server down, 2 successes up


def free_cluster_port():
    """A free port whose cluster-bus port (+10000) is free too: Redis Cluster
    needs the port under 55536, below Linux's ephemeral range."""
    for _ in range(500):
        p = random.randrange(20000, 30000)
        try:
            for q in (p, p + 10000):
                with socket.socket() as s:
                    s.bind(("127.0.0.1", q))
        except OSError:
            continue
        return p
    raise RunError("no free port pair for a Redis Cluster node")


def pg_bin():
    for d in sorted(Path("/usr/lib/postgresql").glob("*/bin"), reverse=True):
        if (d / "initdb").exists():
            return d
    if shutil.which("initdb"):
        return Path(shutil.which("initdb")).parent
    return None


def ensure_rig_tools():
    """Installs what the rig needs from Debian and PyPI when it is missing."""
    missing = []
    if not pg_bin():
        missing.append("postgresql")
    if not shutil.which("redis-server") or not shutil.which("redis-cli"):
        missing.append("redis-server")
    if not shutil.which("haproxy"):
        missing.append("haproxy")
    if missing:
        say(f"installing {' '.join(missing)} with apt-get")
        apt_install(missing)
    try:
        import aiosmtpd  # noqa: F401
    except ImportError:
        marker = Path(sys.prefix) / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "EXTERNALLY-MANAGED"
        if marker.exists():
            apt_install(["python3-aiosmtpd"])
        else:
            pip_install(sys.executable, ["aiosmtpd"])


def as_nobody(cmd):
    return ["runuser", "-u", "nobody", "--", *cmd] if os.geteuid() == 0 else cmd


class Postgres:
    """A throwaway PostgreSQL cluster that can be restarted and stopped."""

    def __init__(self, root):
        self.bin = pg_bin()
        if not self.bin:
            raise RunError("PostgreSQL server binaries not found (apt-get install -y postgresql)")
        self.dir = root / "pg"
        self.dir.mkdir()
        if os.geteuid() == 0:
            shutil.chown(root, "nobody")
            shutil.chown(self.dir, "nobody")
        self.data = self.dir / "data"
        self.log = self.dir / "log"
        self.port = free_port()

    def url(self, db="latchkey"):
        return f"postgres://postgres@127.0.0.1:{self.port}/{db}"

    def _ctl(self, *args):
        # Output to a file, never a pipe: a postmaster that pg_ctl starts
        # inherits it and would hold a pipe open for ever.
        with open(self.dir / "pg_ctl.log", "a") as out:
            r = subprocess.run(as_nobody([str(self.bin / "pg_ctl"), "-D", str(self.data), *args]),
                               stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=self.dir)
        if r.returncode != 0:
            tail = (self.dir / "pg_ctl.log").read_text(errors="replace")[-500:]
            raise RunError(f"pg_ctl {' '.join(args)} failed: {tail}")

    def init(self):
        r = subprocess.run(as_nobody([str(self.bin / "initdb"), "-D", str(self.data), "-U", "postgres",
                                      "--auth=trust", "-E", "UTF8"]), capture_output=True, text=True, cwd=self.dir)
        if r.returncode != 0:
            raise RunError(f"initdb failed: {r.stderr.strip()[-500:]}")
        self.start()
        r = subprocess.run([str(self.bin / "psql"), self.url("postgres"), "-q", "-c", "CREATE DATABASE latchkey"],
                           capture_output=True, text=True)
        if r.returncode != 0:
            raise RunError(f"CREATE DATABASE failed: {r.stderr.strip()}")

    def start(self):
        opts = (f"-p {self.port} -k {self.dir} -c listen_addresses=127.0.0.1 -c max_connections=200 "
                "-c fsync=on -c synchronous_commit=on")
        self._ctl("-o", opts, "-l", str(self.log), "-w", "-t", "60", "start")

    def restart_fast(self):
        self._ctl("-m", "fast", "-l", str(self.log), "-w", "-t", "60", "restart")

    def stop_fast(self):
        self._ctl("-m", "fast", "-w", "-t", "60", "stop")

    def stop(self):
        if (self.data / "postmaster.pid").exists():
            try:
                self._ctl("-m", "immediate", "-w", "-t", "30", "stop")
            except RunError as e:
                say(f"warning: {e}")

    def sql(self, statement, db="latchkey"):
        """Rows of one statement, as lists of text (psql -At, unit separator)."""
        r = subprocess.run([str(self.bin / "psql"), self.url(db), "-At", "-F", "\x1f", "-v", "ON_ERROR_STOP=1",
                            "-c", statement], capture_output=True, text=True)
        if r.returncode != 0:
            raise RunError(f"psql failed: {r.stderr.strip()[-500:]}")
        return [line.split("\x1f") for line in r.stdout.splitlines() if line]


class RedisCluster:
    """3 masters and 3 replicas, cluster-node-timeout 1 s (a dead master's
    replica takes over within about 2 s)."""

    def __init__(self, root, masters=3, replicas=1):
        self.root = root
        self.n = masters * (1 + replicas)
        self.replicas = replicas
        self.ports = [free_cluster_port() for _ in range(self.n)]
        self.procs = {}

    def seeds(self):
        return ",".join(f"redis://127.0.0.1:{p}" for p in self.ports)

    def start_node(self, port):
        d = self.root / f"redis-{port}"
        d.mkdir(exist_ok=True)
        log = open(d / "log", "a")
        self.procs[port] = subprocess.Popen(
            ["redis-server", "--bind", "127.0.0.1", "--port", str(port), "--save", "", "--appendonly", "no",
             "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf", "--cluster-node-timeout", "1000",
             "--dir", str(d)], stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        log.close()
        wait_port(port)

    def start(self):
        for p in self.ports:
            self.start_node(p)
        r = subprocess.run(["redis-cli", "--cluster", "create", *[f"127.0.0.1:{p}" for p in self.ports],
                            "--cluster-replicas", str(self.replicas), "--cluster-yes"],
                           capture_output=True, text=True, stdin=subprocess.DEVNULL)
        if r.returncode != 0:
            raise RunError(f"redis-cli --cluster create failed: {(r.stdout + r.stderr)[-800:]}")
        self.wait_ok()

    def cli(self, port, *args, timeout=3):
        try:
            r = subprocess.run(["redis-cli", "-p", str(port), *args], capture_output=True, text=True,
                               timeout=timeout)
            return r.stdout
        except subprocess.TimeoutExpired:
            return ""

    def wait_ok(self, timeout=30):
        """Until every live node says cluster_state:ok and every slot has a master."""
        def ok():
            for p, proc in self.procs.items():
                if proc.poll() is None and "cluster_state:ok" not in self.cli(p, "cluster", "info"):
                    return False
            return True
        wait_until(ok, "Redis Cluster state ok", timeout=timeout, interval=0.2)

    def masters(self):
        """Ports of the nodes that are masters now (as a live node sees it)."""
        for p, proc in self.procs.items():
            if proc.poll() is not None:
                continue
            out = self.cli(p, "cluster", "nodes")
            if out:
                return [int(line.split()[1].split("@")[0].rsplit(":", 1)[1]) for line in out.splitlines()
                        if "master" in line.split()[2] and "fail" not in line.split()[2]]
        return []

    def kill(self, port):
        p = self.procs.pop(port)
        p.kill()
        p.wait()

    def freeze(self):
        for p in self.procs.values():
            p.send_signal(signal.SIGSTOP)

    def thaw(self):
        for p in self.procs.values():
            p.send_signal(signal.SIGCONT)

    def stop(self):
        for p in self.procs.values():
            p.send_signal(signal.SIGCONT)
            p.kill()
            p.wait()
        self.procs.clear()


class SmtpSink:
    """tests/support/smtp_sink.py: a real SMTP server storing each message
    as a file; stopping and starting it again keeps its port and its files."""

    def __init__(self, root):
        self.dir = root / "mail"
        self.dir.mkdir()
        self.port = free_port()
        self.proc = None

    def start(self):
        log = open(self.dir.parent / "smtp.log", "a")
        self.proc = subprocess.Popen([sys.executable, str(ROOT / "tests" / "support" / "smtp_sink.py"),
                                      str(self.dir), str(self.port), "plain"], stdout=subprocess.PIPE,
                                     stderr=log, stdin=subprocess.DEVNULL, text=True)
        log.close()
        line = self.proc.stdout.readline()
        if not line.startswith("READY"):
            raise RunError(f"the SMTP sink did not start: {line!r}")

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.proc = None


class Instance:
    def __init__(self, rig, i):
        self.rig = rig
        self.i = i
        self.port = free_port()
        self.admin_port = free_port()
        self.dir = rig.root / f"latchkey-{i}"
        self.dir.mkdir()
        self.proc = None
        # Another build than the rig's (a rolling upgrade's).
        self.binary = None

    @property
    def base(self):
        return f"http://127.0.0.1:{self.port}"

    @property
    def admin(self):
        return f"http://127.0.0.1:{self.admin_port}"

    def env(self):
        env = {k: v for k, v in os.environ.items() if not k.startswith("LATCHKEY_")}
        env.update(self.rig.shared_env)
        env.update({
            "LATCHKEY_LISTEN": f"127.0.0.1:{self.port}",
            "LATCHKEY_ADMIN_LISTEN": f"127.0.0.1:{self.admin_port}",
            "LATCHKEY_DATA_DIR": str(self.dir),
        })
        return env

    def start(self, wait=True):
        log = open(self.dir / "log", "a")
        self.proc = subprocess.Popen([str(self.binary or self.rig.binary), "serve"], env=self.env(), cwd=self.dir,
                                     stdout=log,
                                     stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        log.close()
        if wait:
            self.wait_ready()

    def wait_ready(self, timeout=60):
        wait_until(lambda: http("GET", f"{self.base}/health/ready", timeout=1)[0] == 200,
                   f"latchkey instance {self.i}", timeout=timeout, interval=0.1, proc=self.proc)

    def kill(self):
        self.proc.kill()
        self.proc.wait()

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


class Haproxy:
    def __init__(self, rig):
        self.rig = rig
        self.port = free_port()
        self.stats_port = free_port()
        self.proc = None

    def config(self, servers=None):
        servers = "\n".join(
            f"    server latchkey{i.i} 127.0.0.1:{i.port} check inter {HEALTH_INTERVAL_MS}ms fall 2 rise 2"
            for i in self.rig.instances[:servers])
        errors = self.rig.root / "haproxy-503.http"
        # HAProxy's own 503 (no server up) says when to retry, as latchkey's do.
        errors.write_text("HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n"
                          "retry-after: 1\r\ncache-control: no-store\r\nconnection: close\r\n\r\n"
                          '{"error":"UNAVAILABLE","message":"No instance is ready; retry shortly."}\n')
        return f"""global
    maxconn 4096
    log stdout format raw local0 info
defaults
    mode http
    log global
    option httplog
    timeout connect 1s
    timeout client 30s
    timeout server 10s
    timeout http-request 10s
    option http-buffer-request
    # A request whose instance died before answering goes to another
    # instance: retries are safe because every POST of the mix is
    # idempotent within its window (a refresh inside the grace period
    # returns the same successor; a register repeated with its password
    # while its code lives changes nothing). A 503 is not retried: it carries
    # Retry-After for the client, and HAProxy 2.6 closes some retried
    # requests without an answer once no server is left.
    retries 2
    option redispatch 1
    retry-on conn-failure empty-response
    errorfile 503 {errors}
frontend public
    bind 127.0.0.1:{self.port}
    option forwardfor
    # No instance ready (a shared dependency down): answer at once, with
    # Retry-After, rather than queue the request.
    http-request return status 503 content-type application/json hdr retry-after 1 hdr cache-control no-store string '{{"error":"UNAVAILABLE","message":"No instance is ready; retry shortly."}}' if {{ nbsrv(latchkey) eq 0 }}
    default_backend latchkey
frontend stats
    bind 127.0.0.1:{self.stats_port}
    http-request use-service prometheus-exporter if {{ path /metrics }}
    stats enable
    stats uri /stats
backend latchkey
    balance roundrobin
    option httpchk GET /health/ready
    http-check expect status 200
{servers}
"""

    def start(self, servers=None):
        """With the first `servers` instances (default: all)."""
        cfg = self.rig.root / "haproxy.cfg"
        cfg.write_text(self.config(servers))
        log = open(self.rig.root / "haproxy.log", "a")
        self.proc = subprocess.Popen(["haproxy", "-f", str(cfg), "-db"], stdout=log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL)
        log.close()
        wait_port(self.port)

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(10)

    def restart(self, servers=None):
        self.stop()
        self.start(servers)
        wait_until(lambda: http("GET", f"http://127.0.0.1:{self.port}/health/ready", timeout=1)[0] == 200,
                   "HAProxy", timeout=20)


class Rig:
    def __init__(self, binary, instances=3, redis_replicas=1, settings=None):
        self.binary = binary
        self.root = Path(tempfile.mkdtemp(prefix="latchkey-rig-"))
        os.chmod(self.root, 0o755)
        self.pg = Postgres(self.root)
        self.redis = RedisCluster(self.root, replicas=redis_replicas)
        self.smtp = SmtpSink(self.root)
        self.instances = [Instance(self, i) for i in range(instances)]
        self.lb = Haproxy(self)
        self.settings = settings or {}
        self.shared_env = {}

    @property
    def base(self):
        return f"http://127.0.0.1:{self.lb.port}"

    def start(self):
        ensure_rig_tools()
        self.pg.init()
        self.redis.start()
        self.smtp.start()
        self.shared_env = {
            "LATCHKEY_DATABASE_URL": self.pg.url(),
            "LATCHKEY_REDIS_URL": self.redis.seeds(),
            "LATCHKEY_REDIS_CLUSTER": "true",
            # Every instance shares this Redis: it must not take them all out of the balancer.
            "LATCHKEY_REDIS_READINESS": "reported",
            "LATCHKEY_SECRET_KEY": base64.b64encode(secrets.token_bytes(32)).decode(),
            "LATCHKEY_ISSUER": ISSUER,
            "LATCHKEY_MAIL": f"smtp://127.0.0.1:{self.smtp.port}?tls=none",
            "LATCHKEY_TRUSTED_PROXIES": "127.0.0.1",
            "LATCHKEY_LOG": "warn",
        }
        self.shared_env.update({f"LATCHKEY_{k.upper()}": str(v) for k, v in self.settings.items()})
        # The first instance applies the migrations alone; the others start together.
        self.instances[0].start()
        for inst in self.instances[1:]:
            inst.start(wait=False)
        for inst in self.instances[1:]:
            inst.wait_ready()
        self.lb.start()
        wait_until(lambda: http("GET", f"{self.base}/health/ready", timeout=1)[0] == 200, "HAProxy", timeout=20)

    def describe(self):
        lines = [f"HAProxy: {self.base} (stats http://127.0.0.1:{self.lb.stats_port}/stats)"]
        for i in self.instances:
            lines.append(f"latchkey {i.i}: {i.base} (admin {i.admin}), log {i.dir / 'log'}")
        lines.append(f"PostgreSQL: {self.pg.url()}")
        lines.append(f"Redis Cluster: {self.redis.seeds()}")
        lines.append(f"SMTP: 127.0.0.1:{self.smtp.port}, messages in {self.smtp.dir}")
        return "\n".join(lines)

    def stop(self, keep_logs=None):
        """Stops everything and removes the files; `keep_logs`: a folder
        that receives the logs first (HAProxy, each instance, PostgreSQL)."""
        for part in [self.lb, *self.instances, self.smtp, self.redis, self.pg]:
            try:
                part.stop()
            except BaseException as e:  # keep stopping the rest, even on a second Ctrl-C
                say(f"warning: stopping {type(part).__name__}: {e!r}")
        if keep_logs:
            keep_logs = Path(keep_logs)
            keep_logs.mkdir(parents=True, exist_ok=True)
            logs = {"haproxy.log": self.root / "haproxy.log", "smtp.log": self.root / "smtp.log",
                    "postgres.log": self.pg.log}
            logs.update({f"latchkey-{i.i}.log": i.dir / "log" for i in self.instances})
            for name, path in logs.items():
                if path.exists():
                    shutil.copy(path, keep_logs / name)
        shutil.rmtree(self.root, ignore_errors=True)


def main(argv):
    """scripts/loadtest rig [--instances N]: the rig until Ctrl-C."""
    import argparse

    from .tools import ensure_binary

    ap = argparse.ArgumentParser(prog="scripts/loadtest rig", description=__doc__.split("\n\n")[0])
    ap.add_argument("--instances", type=int, default=3)
    ap.add_argument("--binary", help="a latchkey binary (default: target/release/latchkey, built if stale)")
    a = ap.parse_args(argv)
    binary, _how = ensure_binary(a.binary)
    rig = Rig(binary, instances=a.instances)
    try:
        rig.start()
        print(rig.describe(), flush=True)
        say("up; Ctrl-C stops everything")
        while True:
            time.sleep(3600)
    finally:
        rig.stop()
