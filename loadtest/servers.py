"""The servers a run starts and stops: latchkey (with its backend: embedded,
or a throwaway PostgreSQL database + Redis prefix), a throwaway Redis, and
named groups of processes (upstreams, gateways, HAProxy)."""

import base64
import contextlib
import os
import re
import secrets
import shutil
import subprocess
import tempfile
import urllib.parse
from pathlib import Path

from .common import RunError, free_port, http, pinned_server, result_dir, say, utc_now, wait_port, wait_until

ISSUER = "http://latchkey.bench"  # the issuer of the benchmarks' own services
SEED_PASSWORD = "loadtest-password"


class Backend:
    """Where latchkey keeps its data for one run of a service scenario."""

    def __init__(self, kind, workdir, stamp):
        self.kind = kind
        self.workdir = workdir
        self.env = {}
        self.description = ""
        self._admin_url = None
        self._dbname = None
        self._psql = None
        if kind == "embedded":
            self.description = "embedded: SQLite and in-process caches, in a fresh temporary directory"
            return
        db = os.environ.get("LATCHKEY_TEST_DATABASE_URL")
        redis = os.environ.get("LATCHKEY_TEST_REDIS_URL")
        if not db or not redis:
            raise RunError("postgres backend: LATCHKEY_TEST_DATABASE_URL / LATCHKEY_TEST_REDIS_URL are not set "
                           "(scripts/with-services sets them)")
        self._psql = shutil.which("psql")
        pg_bin = os.environ.get("LATCHKEY_TEST_PG_BIN")
        if not self._psql and pg_bin and (Path(pg_bin) / "psql").exists():
            self._psql = str(Path(pg_bin) / "psql")
        if not self._psql:
            raise RunError("psql not found (apt-get install -y postgresql-client)")
        self._admin_url = db
        self._dbname = f"latchkey_loadtest_{stamp.replace('-', '_')}_{os.getpid()}"
        self._psql_cmd(f'CREATE DATABASE "{self._dbname}"')
        u = urllib.parse.urlsplit(db)
        self.env["LATCHKEY_DATABASE_URL"] = urllib.parse.urlunsplit(u._replace(path="/" + self._dbname))
        self.env["LATCHKEY_REDIS_URL"] = redis
        self.env["LATCHKEY_REDIS_KEY_PREFIX"] = f"latchkey-loadtest-{stamp}-{os.getpid()}:"
        self.description = (f"postgres: PostgreSQL (fresh database {self._dbname}) + Redis "
                            f"(key prefix {self.env['LATCHKEY_REDIS_KEY_PREFIX']}), throwaway servers from "
                            "scripts/with-services unless LATCHKEY_TEST_DATABASE_URL / _REDIS_URL named others")

    def _psql_cmd(self, sql):
        r = subprocess.run([self._psql, self._admin_url, "-v", "ON_ERROR_STOP=1", "-q", "-c", sql],
                           capture_output=True, text=True)
        if r.returncode != 0:
            raise RunError(f"psql {sql!r} failed: {r.stderr.strip()}")

    def drop(self):
        if self._dbname:
            try:
                self._psql_cmd(f'DROP DATABASE IF EXISTS "{self._dbname}" WITH (FORCE)')
            except RunError as e:
                say(f"warning: {e}")


def server_env(backend, port, admin_port=None):
    """The service scenarios' latchkey: the caller's LATCHKEY_* settings stay
    (they are named in the report), the backend's replace any of the caller's."""
    env = dict(os.environ)
    # The embedded backend must not pick up a database or Redis from the caller.
    for k in ("LATCHKEY_DATABASE_URL", "LATCHKEY_REDIS_URL", "LATCHKEY_REDIS_KEY_PREFIX",
              "LATCHKEY_DATA_DIR", "LATCHKEY_LISTEN", "LATCHKEY_ISSUER", "LATCHKEY_BIN"):
        env.pop(k, None)
    env.update(backend.env)
    env["LATCHKEY_LISTEN"] = f"127.0.0.1:{port}"
    # /metrics is served on the admin listener only.
    env["LATCHKEY_ADMIN_LISTEN"] = f"127.0.0.1:{admin_port}" if admin_port else "off"
    env["LATCHKEY_RATE_LIMIT"] = "off"
    env["LATCHKEY_LOG"] = "warn"
    return env


def bench_env(tmp, **settings):
    """The benchmarks' latchkey (gateway, limiter): none of the caller's
    LATCHKEY_* settings, data in `tmp`, a fresh secret, issuer ISSUER;
    `settings` are LATCHKEY_<NAME> values on top."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("LATCHKEY_")}
    env.update({
        "LATCHKEY_DATA_DIR": os.path.join(tmp, "data"),
        "LATCHKEY_SECRET_KEY": base64.b64encode(secrets.token_bytes(32)).decode(),
        "LATCHKEY_LOG": "warn",
        "LATCHKEY_ISSUER": ISSUER,
    })
    env.update({f"LATCHKEY_{k.upper()}": str(v) for k, v in settings.items()})
    return env


def seed_users(binary, env, count, password=None, cwd=None, log=None, extra=()):
    """`latchkey users seed --count N`: user1@loadtest.latchkey ... userN, verified
    (`extra`: more flags, such as --totp-secret); its standard output."""
    cmd = [str(binary), "users", "seed", "--count", str(count), *extra]
    if password:
        cmd += ["--password", password]
    r = subprocess.run(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=log or subprocess.PIPE, text=True)
    if log:
        log.write(r.stdout)
    if r.returncode != 0:
        raise RunError(f"{' '.join(cmd[1:])} failed: {(r.stderr or '').strip()[-500:] or 'see the seed log'}")
    return r.stdout.strip()


class Server:
    """latchkey serve for a service scenario, on free loopback ports."""

    def __init__(self, binary, backend, raw):
        self.binary = binary
        self.backend = backend
        self.raw = raw
        self.proc = None
        self.port = None
        self.admin_port = None
        self.exit_code = None

    @property
    def base_url(self):
        return f"http://127.0.0.1:{self.port}"

    def start(self):
        for attempt in range(3):
            self.port, self.admin_port = free_port(), free_port()
            with open(self.raw / "server.log", "a") as log:
                self.proc = subprocess.Popen(pinned_server([self.binary, "serve"]), cwd=self.backend.workdir,
                                             env=server_env(self.backend, self.port, self.admin_port), stdout=log,
                                             stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
            try:
                wait_until(lambda: http("GET", f"{self.base_url}/health/ready", timeout=1)[0] == 200,
                           "latchkey", timeout=60, interval=0.2, proc=self.proc)
                return
            except RunError:
                self.stop()
                say(f"latchkey did not become ready on port {self.port} (attempt {attempt + 1})")
        tail = (self.raw / "server.log").read_text(errors="replace").splitlines()[-20:]
        raise RunError("latchkey did not start; last lines of server.log:\n" + "\n".join(tail))

    def stop(self):
        if self.proc is not None:
            stop_after(self.proc, 20)
            self.exit_code = self.proc.returncode


class Procs:
    """Named background processes, each logging to a file; stopped with
    SIGTERM (then SIGKILL after 10 s)."""

    def __init__(self):
        self.items = {}

    def start(self, name, args, log, env=None, cwd=None):
        with open(log, "w") as f:
            p = subprocess.Popen([str(a) for a in args], stdout=f, stderr=subprocess.STDOUT, env=env, cwd=cwd,
                                 stdin=subprocess.DEVNULL)
        self.items[name] = p
        return p

    def stop(self, name):
        p = self.items.pop(name, None)
        if p:
            stop_after(p)

    def stop_all(self):
        for name in list(self.items):
            self.stop(name)

    def pids(self):
        return {p.pid for p in self.items.values()}


def start_redis(procs, log, name="redis"):
    """A throwaway redis-server on a free loopback port, no persistence: its URL."""
    port = free_port()
    procs.start(name, ["redis-server", "--bind", "127.0.0.1", "--port", str(port), "--save", "",
                       "--appendonly", "no"], log)
    wait_port(port)
    return f"redis://127.0.0.1:{port}"


def log_findings(path, limit=8):
    """WARN / ERROR lines of the server log, except the expected rate-limit-off warning."""
    if not path.exists():
        return 0, 0, []
    warns = errors = 0
    samples, seen = [], set()
    ansi = re.compile(r"\x1b\[[0-9;]*m")
    for line in path.read_text(errors="replace").splitlines():
        clean = ansi.sub("", line)
        if "LATCHKEY_RATE_LIMIT=off" in clean:
            continue
        if " ERROR " in clean or clean.startswith("ERROR") or '"level":"ERROR"' in clean:
            errors += 1
        elif " WARN " in clean or clean.startswith("WARN") or '"level":"WARN"' in clean:
            warns += 1
        else:
            continue
        key = re.sub(r"^\S+\s+", "", clean)[:160]
        key = re.sub(r"\d+", "N", key)
        if key not in seen and len(samples) < limit:
            seen.add(key)
            samples.append(clean[:300])
    return warns, errors, samples


def stop_after(proc, timeout=10):
    """SIGTERM, then SIGKILL after `timeout` seconds."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()



@contextlib.contextmanager
def bench_workspace(name, out=None):
    """A benchmark's (start time, result folder (`out`, or the default one),
    its raw/, a temporary directory, a Procs): the processes are stopped and
    the directory removed at the end, whatever happens."""
    started = utc_now()
    outdir = result_dir(started, name, out)
    tmp = tempfile.mkdtemp(prefix=f"latchkey-{name}-bench-")
    procs = Procs()
    try:
        yield started, outdir, outdir / "raw", tmp, procs
    finally:
        procs.stop_all()
        shutil.rmtree(tmp, ignore_errors=True)
