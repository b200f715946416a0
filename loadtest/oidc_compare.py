"""latchkey and Keycloak 26 as OpenID Providers, side by side in one run:
how many applications' sign-ins each serves at a latency a person accepts.

Usage (from the repository root):
  scripts/loadtest oidc-compare [--secs 15] [--accounts 500] [--factor 1.3]
                                [--refine 2] [--flows signin,sso]
                                [--keycloak-argon2] [--binary PATH]
                                [--keycloak-version 26.7.3]

Two flows, each driven by loadtest/k6/oidc-signin.js as a browser would
(redirects followed by hand, the page's form posted, cookies kept):
  (a) signin: a new sign-in through the provider's hosted page with a
      password, the code at the token endpoint, userinfo. Both providers
      pay one argon2id hash per sign-in: latchkey runs with its verified-
      credential cache off (docs/credential-cache.md), which would otherwise
      answer a repeated password without hashing; Keycloak has no such cache.
  (b) sso: a second application signing in an already signed-in browser
      (the session cookie), and its code at the token endpoint.

What runs, all on loopback:
- one throwaway PostgreSQL 15 with a database for each provider, and a
  Redis for latchkey (so latchkey runs on PostgreSQL + Redis, its
  many-instance backend, not the embedded one);
- latchkey (target/release/latchkey, built when stale) with ACCOUNTS seeded
  accounts and two confidential clients whose consent is `skip`;
- Keycloak (the Maven Central artifact org.keycloak:keycloak-quarkus-dist,
  fetched with mvn, unpacked under target/test-deps/, `kc.sh build` for
  PostgreSQL once) on Temurin 25, production mode over http, its heap
  capped at 1 GiB; a realm with the same accounts (its default argon2id
  hashing: 7 MiB, 5 passes) and the same two clients (consent off, PKCE
  S256).
- with --keycloak-argon2, a second latchkey ("latchkey-kc-argon2", its own
  database) whose argon2id has Keycloak's parameters (7 MiB, 5 passes), so
  that both providers pay the same hash. OWASP lists that set beside
  latchkey's default (19 MiB, 2 passes) as equivalent; which one is cheaper
  depends on the CPU's caches, and `latchkey hash-capacity` of each set on
  the providers' CPU is in the report.
- Pinning: both providers, PostgreSQL and Redis on CPU 1; k6 on CPU 0, so
  the generator's cost never counts against a provider.

The measurement: after a warm-up of each flow on each provider (Keycloak's
JIT compiles there), a ladder of open-model steps per flow and provider,
interleaved (latchkey's ladder then Keycloak's, per flow): constant arrival
rate RATE for SECS seconds, RATE multiplied by FACTOR after each step that
held, until a step's P95 of the whole flow exceeds the flow's limit (500 ms
sign-in, 100 ms single sign-on), fewer than 99 % of flows succeed, or k6
could not start 97 % of the planned flows. Then REFINE steps bisect
(geometrically) between the last rate that held and the first that did
not, so that a capacity is known to within FACTOR ** (1 / 2 ** REFINE)
rather than FACTOR. A provider's capacity is the highest rate asked that
held. The run ends with the password hash parameters Keycloak stored for
an account and `latchkey hash-capacity` (one thread, on the providers'
CPU) of each latchkey's parameters. The report (report.md, summary.json in
loadtest/results/<date>-oidc-compare/) has every step with P50 / P95 / P99,
the CPU each process used per flow (PostgreSQL's with its exited
backends), and every provider's peak RSS. The second latchkey of
--keycloak-argon2 runs only the flows that hash a password.
"""

import argparse
import base64
import json
import os
import secrets
import shutil
import signal
import subprocess
import time
import zipfile
from pathlib import Path

from .common import ROOT, RunError, cpu_seconds, free_port, git_revision, http, machine_info, proc_rss_kib, \
    proc_tree, reaped_cpu_seconds, say, utc_now, wait_until
from .rig import Postgres, ensure_rig_tools
from .runners import run_k6
from .servers import SEED_PASSWORD, bench_workspace, seed_users, start_redis
from .tools import ensure_binary

K6_SCRIPT = ROOT / "loadtest" / "k6" / "oidc-signin.js"
DEPS = ROOT / "target" / "test-deps"
JAVA_HOME = Path("/usr/lib/jvm/temurin-25-jdk-amd64")
KEYCLOAK_VERSION = "26.7.3"
REALM = "bench"
APPS = ("app1", "app2")
SERVER_CPU = 1
GENERATOR_CPU = 0
# The flows' latency limits and the share of Keycloak's capacity asked of
# latchkey (docs/performance.md, "Sign-in through the pages").
FLOWS = {
    "signin": {"p95_ms": 500, "start": 4.0, "goal": 3.0, "hashes": True},
    "sso": {"p95_ms": 100, "start": 20.0, "goal": 10.0, "hashes": False},
}
MIN_OK = 0.99
MIN_STARTED = 0.97


def redirect_uri(app):
    return f"https://{app}.loadtest.latchkey/callback"


def pin(pid, cpu):
    """Every thread of `pid` onto one CPU (threads made later inherit it)."""
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            os.sched_setaffinity(int(task.name), {cpu})
        except OSError:
            pass


def alive(pid):
    """Running (a zombie is not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def ensure_keycloak(version):
    """target/test-deps/keycloak-VERSION, fetched from Maven Central with mvn,
    unpacked and built for PostgreSQL (once)."""
    home = DEPS / f"keycloak-{version}"
    marker = home / ".built-for-postgres"
    if marker.exists():
        return home
    if not (JAVA_HOME / "bin" / "java").exists():
        raise RunError(f"Keycloak 26 needs Java 21 or newer: {JAVA_HOME} is missing")
    DEPS.mkdir(parents=True, exist_ok=True)
    zip_path = DEPS / f"keycloak-quarkus-dist-{version}.zip"
    if not zip_path.exists():
        say(f"fetching org.keycloak:keycloak-quarkus-dist:{version} with mvn")
        r = subprocess.run(["mvn", "-q", "dependency:copy",
                            f"-Dartifact=org.keycloak:keycloak-quarkus-dist:{version}:zip",
                            f"-DoutputDirectory={DEPS}"], capture_output=True, text=True)
        if r.returncode != 0 or not zip_path.exists():
            raise RunError(f"mvn could not fetch Keycloak {version}: {(r.stdout + r.stderr)[-800:]}")
    shutil.rmtree(home, ignore_errors=True)
    with zipfile.ZipFile(zip_path) as z:
        z.extractall(DEPS)
    for script in (home / "bin").glob("*.sh"):
        script.chmod(0o755)
    say("kc.sh build --db=postgres (once)")
    r = subprocess.run([str(home / "bin" / "kc.sh"), "build", "--db=postgres", "--health-enabled=true"],
                       env=java_env(), capture_output=True, text=True)
    if r.returncode != 0:
        raise RunError(f"kc.sh build failed: {(r.stdout + r.stderr)[-800:]}")
    marker.write_text(version)
    return home


def java_env(**extra):
    env = dict(os.environ, JAVA_HOME=str(JAVA_HOME), PATH=f"{JAVA_HOME / 'bin'}:{os.environ['PATH']}")
    env.update(extra)
    return env


def realm_json(accounts):
    def client(cid):
        return {"clientId": cid, "name": cid, "enabled": True, "protocol": "openid-connect",
                "publicClient": False, "secret": f"{cid}-secret", "clientAuthenticatorType": "client-secret",
                "standardFlowEnabled": True, "directAccessGrantsEnabled": False, "implicitFlowEnabled": False,
                "consentRequired": False, "redirectUris": [redirect_uri(cid)],
                "attributes": {"pkce.code.challenge.method": "S256"}}
    users = [{"username": f"user{i}@loadtest.latchkey", "email": f"user{i}@loadtest.latchkey",
              "emailVerified": True, "enabled": True, "firstName": "User", "lastName": str(i),
              "credentials": [{"type": "password", "value": SEED_PASSWORD, "temporary": False}]}
             for i in range(1, accounts + 1)]
    return {"realm": REALM, "enabled": True, "loginWithEmailAllowed": True, "sslRequired": "none",
            "clients": [client(c) for c in APPS], "users": users}


class Keycloak:
    def __init__(self, home, pg, tmp, procs, raw):
        self.home, self.pg, self.tmp, self.procs, self.raw = home, pg, Path(tmp), procs, raw
        self.port, self.management_port = free_port(), free_port()
        self.db = ["--db-url", f"jdbc:postgresql://127.0.0.1:{pg.port}/keycloak",
                   "--db-username", "postgres", "--db-password", "unused"]
        self.proc = None

    @property
    def issuer(self):
        return f"http://127.0.0.1:{self.port}/realms/{REALM}"

    def start(self, accounts):
        realm = self.tmp / "realm.json"
        realm.write_text(json.dumps(realm_json(accounts)))
        say(f"Keycloak: importing a realm with {accounts} accounts (each password hashed once)")
        with open(self.raw / "keycloak-import.log", "w") as log:
            r = subprocess.run([str(self.home / "bin" / "kc.sh"), "import", "--optimized", "--file", str(realm),
                                *self.db], env=java_env(), stdout=log, stderr=subprocess.STDOUT)
        if r.returncode != 0:
            raise RunError("kc.sh import failed: see raw/keycloak-import.log")
        self.proc = self.procs.start(
            "keycloak",
            ["taskset", "-c", str(SERVER_CPU), self.home / "bin" / "kc.sh", "start", "--optimized",
             "--http-enabled=true", "--http-host=127.0.0.1", f"--http-port={self.port}",
             f"--http-management-port={self.management_port}", "--hostname-strict=false", *self.db],
            self.raw / "keycloak.log", env=java_env(JAVA_OPTS_KC_HEAP="-Xms256m -Xmx1g"))
        wait_until(lambda: http("GET", f"http://127.0.0.1:{self.management_port}/health/ready", timeout=2)[0] == 200,
                   "Keycloak", timeout=180, interval=0.5, proc=self.proc)

    def pids(self):
        return proc_tree(self.proc.pid)

    def stop(self):
        """kc.sh runs java as its child: the whole tree is stopped."""
        if self.proc is None:
            return
        tree = self.pids()
        for sig in (signal.SIGTERM, signal.SIGKILL):
            for pid in tree:
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass
            deadline = time.time() + 30
            while time.time() < deadline and any(alive(p) for p in tree):
                time.sleep(0.2)
        self.procs.stop("keycloak")


# Keycloak 26's default password hashing (argon2id, 7 MiB, 5 passes, one
# lane): latchkey's settings for the same hash.
KEYCLOAK_ARGON2 = {"LATCHKEY_ARGON2_MEMORY_KIB": "7168", "LATCHKEY_ARGON2_ITERATIONS": "5"}


class Latchkey:
    """latchkey serve on PostgreSQL + Redis, with `settings` over the
    benchmark's own. Its database is `name` with `-` as `_` (created here
    unless it is the rig's own `latchkey`), its Redis keys start `name:`."""

    def __init__(self, binary, pg, redis_url, tmp, procs, raw, name="latchkey", settings=None):
        self.binary, self.procs, self.raw, self.name = binary, procs, raw, name
        self.settings = dict(settings or {})
        self.port = free_port()
        if name != "latchkey":
            pg.sql(f'CREATE DATABASE "{name.replace("-", "_")}"')
        env = {k: v for k, v in os.environ.items() if not k.startswith("LATCHKEY_")}
        env.update({
            "LATCHKEY_DATA_DIR": os.path.join(tmp, name),
            "LATCHKEY_DATABASE_URL": pg.url(name.replace("-", "_")),
            "LATCHKEY_REDIS_URL": redis_url,
            "LATCHKEY_REDIS_KEY_PREFIX": f"{name}:",
            "LATCHKEY_SECRET_KEY": base64.b64encode(secrets.token_bytes(32)).decode(),
            "LATCHKEY_ISSUER": self.issuer,
            "LATCHKEY_LISTEN": f"127.0.0.1:{self.port}",
            "LATCHKEY_ADMIN_LISTEN": "off",
            "LATCHKEY_RATE_LIMIT": "off",
            "LATCHKEY_CREDENTIAL_CACHE": "off",
            "LATCHKEY_LOG": "warn",
        })
        env.update(self.settings)
        self.env = env
        self.secrets = {}
        self.proc = None

    @property
    def issuer(self):
        return f"http://127.0.0.1:{self.port}"

    def start(self, accounts):
        with open(self.raw / f"{self.name}-setup.log", "w") as log:
            seed_users(self.binary, self.env, accounts, log=log)
            for app in APPS:
                r = subprocess.run([str(self.binary), "clients", "add", app, "--name", app, "--redirect-uri",
                                    redirect_uri(app), "--consent", "skip"], env=self.env, capture_output=True,
                                   text=True)
                log.write(r.stderr)
                if r.returncode != 0:
                    raise RunError(f"latchkey clients add {app} failed: {r.stderr[-500:]}")
                line = next((ln for ln in r.stdout.splitlines() if ln.startswith("client_secret:")), None)
                if not line:
                    raise RunError(f"latchkey clients add {app} printed no secret")
                self.secrets[app] = line.split(":", 1)[1].strip()
        self.proc = self.procs.start(self.name, ["taskset", "-c", str(SERVER_CPU), self.binary, "serve"],
                                     self.raw / f"{self.name}.log", env=self.env)
        wait_until(lambda: http("GET", f"{self.issuer}/health/ready", timeout=1)[0] == 200, self.name,
                   timeout=60, interval=0.2, proc=self.proc)

    def pids(self):
        return proc_tree(self.proc.pid)

    def hash_capacity(self, secs=5):
        """`latchkey hash-capacity` with this server's argon2id on one thread
        on the providers' CPU: its last line."""
        env = dict(self.env, LATCHKEY_HASH_THREADS="1")
        try:
            r = subprocess.run(["taskset", "-c", str(SERVER_CPU), str(self.binary), "hash-capacity", "--seconds",
                                str(secs)], env=env, capture_output=True, text=True, timeout=secs + 60)
        except subprocess.TimeoutExpired:
            return "hash-capacity did not finish"
        lines = (r.stdout + r.stderr).strip().splitlines()
        if r.returncode == 0 and lines:
            return lines[-1]
        return f"hash-capacity failed (exit {r.returncode}): {lines[-1] if lines else 'no output'}"


def measured(provider, flow):
    """Whether `provider` runs `flow`: a variant of latchkey's hash only
    where a password is hashed."""
    return provider in ("latchkey", "keycloak") or FLOWS[flow]["hashes"]


def keycloak_hash(pg):
    """The algorithm and parameters Keycloak stored with an account's
    password (its credential_data), or why they could not be read."""
    try:
        rows = pg.sql("SELECT credential_data FROM credential WHERE type = 'password' LIMIT 1", db="keycloak")
        data = json.loads(rows[0][0])
        params = {"iterations": data.get("hashIterations"), **data.get("additionalParameters", {})}
        params = ", ".join(f"{k} {v[0] if isinstance(v, list) and v else v}" for k, v in sorted(params.items()))
        return f"{data.get('algorithm')}: {params}"
    except (RunError, IndexError, ValueError, AttributeError) as e:
        return f"not read ({e})"


# Per group name, the process whose reaped children count too (set in main:
# PostgreSQL's postmaster, so that a backend or an autovacuum worker that
# exits during a step does not take its CPU time out of the step's figure).
REAPERS = {}


def process_cpu(groups):
    """CPU seconds so far of each named group of pids, with the children its
    reaper (REAPERS) waited for."""
    return {name: sum(cpu_seconds(p) or 0 for p in pids()) + (reaped_cpu_seconds(REAPERS[name])
                                                            if name in REAPERS else 0)
            for name, pids in groups.items()}


def step(name, provider, flow, rate, secs, accounts, raw, groups):
    """One k6 step: its figures, or None when k6 could not run it."""
    env = {"ISSUER": provider["issuer"], "FLOW": flow, "RATE": f"{rate:.2f}", "SECS": secs,
           "ACCOUNTS": accounts, "SEED_PASSWORD": SEED_PASSWORD, "SESSIONS": 100,
           "MAX_VUS": 600}
    for app in APPS:
        env[f"REDIRECT_{app}"] = redirect_uri(app)
        env[f"SECRET_{app}"] = provider["secrets"][app]
    summary = raw / f"{name}-{flow}-{rate:.2f}.json"
    cpu0 = process_cpu(groups)
    run = run_k6(K6_SCRIPT, env, summary, raw / "k6.log", quiet=True)
    cpu1 = process_cpu(groups)
    s = run["summary"]
    if not s or "flow" not in s.get("metrics", {}):
        raise RunError(f"k6 wrote no flow figures for {name} {flow} at {rate:.1f}/s: see raw/k6.log")
    m = s["metrics"]
    trend, ok = m["flow"], m.get("flow_ok", {})
    count = trend.get("count", 0)
    planned = rate * secs
    row = {
        "rate": round(rate, 2),
        "flows": count,
        "per_sec": round(count / secs, 2),
        "ok": ok.get("value", 0.0),
        "started": count / planned if planned else 0,
        "p50": trend.get("med"), "p95": trend.get("p(95)"), "p99": trend.get("p(99)"), "max": trend.get("max"),
        "cpu_ms_per_flow": {k: round(1000 * (cpu1[k] - cpu0[k]) / count, 2) if count else None for k in cpu0},
        "k6_ms_per_flow": round(1000 * run["cpu_seconds"] / count, 2) if count else None,
    }
    row["held"] = (row["p95"] is not None and row["p95"] <= FLOWS[flow]["p95_ms"] and row["ok"] >= MIN_OK
                   and row["started"] >= MIN_STARTED)
    say(f"{name} {flow} {rate:7.1f}/s: {row['per_sec']:.1f}/s done, P95 {row['p95']:.1f} ms, "
        f"ok {100 * row['ok']:.1f} %, {'held' if row['held'] else 'did not hold'}")
    return row


def ladder(name, provider, flow, args, raw, groups):
    rows, rate = [], FLOWS[flow]["start"]
    while True:
        row = step(name, provider, flow, rate, args.secs, args.accounts, raw, groups)
        rows.append(row)
        if not row["held"]:
            break
        rate *= args.factor
        time.sleep(3)
    # Bisect the knee: between the highest rate that held and the lowest
    # above it that did not, geometrically (the ladder's steps are ratios).
    for _ in range(args.refine):
        held = [r["rate"] for r in rows if r["held"]]
        if not held:
            break
        low = max(held)
        high = min(r["rate"] for r in rows if not r["held"] and r["rate"] > low)
        time.sleep(3)
        rows.append(step(name, provider, flow, (low * high) ** 0.5, args.secs, args.accounts, raw, groups))
    held = [r["rate"] for r in rows if r["held"]]
    # The open model's rate: a held step started at least 97 % of it, on time.
    return {"steps": rows, "capacity": max(held) if held else 0.0}


def report(outdir, started, args, binary_info, results, rss, meta):
    m = meta["machine"]
    lines = ["# latchkey and Keycloak as OpenID Providers, side by side", "",
             f"- command: `scripts/loadtest oidc-compare --secs {args.secs} --accounts {args.accounts} "
             f"--factor {args.factor} --refine {args.refine} --flows {','.join(results)}"
             f"{' --keycloak-argon2' if args.keycloak_argon2 else ''}"
             f"{' --binary ' + args.binary if args.binary else ''}`",
             f"- date: {started.strftime('%Y-%m-%d %H:%M')} UTC; machine: {m['nproc']} x {m['cpu']}, "
             f"{m['ram_gib']:.0f} GiB, Linux {m['kernel']}",
             f"- latchkey: {meta['revision']} ({binary_info}), PostgreSQL + Redis, credential cache off",
             *[f"- provider {name}: {', '.join(f'{k}={v}' for k, v in s.items()) or 'default settings'}; "
               f"{meta['hash_capacity'][name]}" for name, s in meta["settings"].items()],
             f"- Keycloak {args.keycloak_version} on Temurin 25, PostgreSQL, heap at most 1 GiB; "
             f"its stored password hash: {meta['keycloak_hash']}",
             f"- both providers, PostgreSQL and Redis pinned to CPU {SERVER_CPU}; k6 to CPU {GENERATOR_CPU}",
             f"- {args.accounts} accounts on each; each step {args.secs} s at a constant arrival rate", ""]
    lines += [f"Capacities are known to within a factor of {args.factor ** (1 / 2 ** args.refine):.3f} "
              "(the ladder's factor, bisected).", "",
              "| flow | provider (flows/s) | Keycloak (flows/s) | ratio | goal |", "|---|---|---|---|---|"]
    for flow in results:
        spec = FLOWS[flow]
        kc = results[flow]["keycloak"]["capacity"]
        for name in meta["settings"]:
            if name not in results[flow]:
                continue
            lk = results[flow][name]["capacity"]
            if not (lk and kc):
                # A ladder that held nothing at its first rate has no capacity
                # to compare: start it lower (FLOWS).
                ratio, verdict = "-", f"no verdict: {'Keycloak' if not kc else name} held no step"
            else:
                ratio = f"{lk / kc:.2f}x"
                verdict = f">= {spec['goal']:.0f}x: {'met' if lk / kc >= spec['goal'] else 'NOT met'}"
            lines.append(f"| {flow} (P95 <= {spec['p95_ms']} ms) | {name}: {lk:.1f} | {kc:.1f} | {ratio} | "
                         f"{verdict} |")
    lines += ["", "Peak RSS: " + "; ".join(f"{n} {v:.1f} MiB" for n, v in rss.items()) + ".", ""]
    for flow in results:
        for name in results[flow]:
            lines += [f"## {flow}: {name}", "",
                      "| rate asked | done/s | ok | P50 ms | P95 ms | P99 ms | CPU ms per flow (provider / PostgreSQL "
                      "/ Redis) | k6 ms per flow | held |",
                      "|---|---|---|---|---|---|---|---|---|"]
            for r in results[flow][name]["steps"]:
                c = r["cpu_ms_per_flow"]
                lines.append(f"| {r['rate']} | {r['per_sec']} | {100 * r['ok']:.1f} % | {r['p50']:.1f} | "
                             f"{r['p95']:.1f} | {r['p99']:.1f} | {c['provider']} / {c['postgres']} / {c['redis']} | "
                             f"{r['k6_ms_per_flow']} | {'yes' if r['held'] else 'no'} |")
            lines.append("")
    text = "\n".join(lines)
    (outdir / "report.md").write_text(text)
    (outdir / "summary.json").write_text(json.dumps({"results": results, "rss_mib": rss, **meta}, indent=1))
    print(text)


def main(argv):
    ap = argparse.ArgumentParser(prog="scripts/loadtest oidc-compare", description=__doc__.split("\n\n")[0])
    ap.add_argument("--secs", type=int, default=15, help="seconds of each step (default 15)")
    ap.add_argument("--accounts", type=int, default=500, help="accounts on each provider (default 500)")
    ap.add_argument("--factor", type=float, default=1.3, help="rate multiplier between steps (default 1.3)")
    ap.add_argument("--binary", help="a latchkey binary to run (nothing built)")
    ap.add_argument("--keycloak-version", default=KEYCLOAK_VERSION)
    ap.add_argument("--out", help="result folder")
    ap.add_argument("--flows", default=",".join(FLOWS), help=f"which flows, comma-separated (default {','.join(FLOWS)})")
    ap.add_argument("--refine", type=int, default=2,
                    help="steps bisecting each ladder's knee (default 2: capacity within FACTOR ** 0.25)")
    ap.add_argument("--keycloak-argon2", action="store_true",
                    help="also run a latchkey whose argon2id has Keycloak's parameters (7 MiB, 5 passes)")
    args = ap.parse_args(argv)
    flows = [f for f in args.flows.split(",") if f]
    if not flows or any(f not in FLOWS for f in flows):
        ap.error(f"--flows: some of {', '.join(FLOWS)}")
    if args.factor <= 1.0:
        ap.error("--factor must be above 1")
    if not 0 <= args.refine <= 5:
        ap.error("--refine: 0 to 5")
    if args.keycloak_argon2 and not any(FLOWS[f]["hashes"] for f in flows):
        ap.error("--keycloak-argon2 changes only the password hash: give a flow that hashes (signin)")
    ensure_rig_tools()
    binary, binary_info = ensure_binary(args.binary)
    home = ensure_keycloak(args.keycloak_version)
    with bench_workspace("oidc-compare", args.out) as (started, outdir, raw, tmp, procs):
        pg = Postgres(Path(tmp))
        kc = None
        try:
            pg.init()
            pg.sql("CREATE DATABASE keycloak")
            redis_url = start_redis(procs, raw / "redis.log")
            latchkeys = [Latchkey(binary, pg, redis_url, tmp, procs, raw)]
            if args.keycloak_argon2:
                latchkeys.append(Latchkey(binary, pg, redis_url, tmp, procs, raw, name="latchkey-kc-argon2",
                                          settings=KEYCLOAK_ARGON2))
            for lk in latchkeys:
                lk.start(args.accounts)
            kc = Keycloak(home, pg, tmp, procs, raw)
            kc.start(args.accounts)
            postmaster = int((pg.data / "postmaster.pid").read_text().split()[0])
            REAPERS["postgres"] = postmaster
            databases = {"postgres": lambda: proc_tree(postmaster),
                         "redis": lambda: proc_tree(procs.items["redis"].pid)}
            for pids in databases.values():
                for pid in pids():
                    pin(pid, SERVER_CPU)
            os.sched_setaffinity(0, {GENERATOR_CPU})  # k6, started from here, inherits it
            providers = {lk.name: {"issuer": lk.issuer, "secrets": lk.secrets, "pids": lk.pids} for lk in latchkeys}
            providers["keycloak"] = {"issuer": kc.issuer, "secrets": {a: f"{a}-secret" for a in APPS},
                                     "pids": kc.pids}
            say("warm-up: each flow on each provider, 20 s at a low rate (not counted)")
            for name, prov in providers.items():
                for flow in filter(lambda f: measured(name, f), flows):
                    step(f"{name}-warmup", prov, flow, FLOWS[flow]["start"] * 2, 20, args.accounts, raw,
                         {"provider": prov["pids"], **databases})
            results = {}
            for flow in flows:
                results[flow] = {}
                for name, prov in providers.items():
                    if not measured(name, flow):
                        continue
                    results[flow][name] = ladder(name, prov, flow, args, raw, {"provider": prov["pids"], **databases})
            rss = {lk.name: (proc_rss_kib(lk.proc.pid, "VmHWM") or 0) / 1024 for lk in latchkeys}
            rss["keycloak"] = max((proc_rss_kib(p, "VmHWM") or 0) for p in kc.pids()) / 1024
            meta = {"machine": machine_info(), "revision": git_revision(), "started": started.isoformat(),
                    "finished": utc_now().isoformat(), "keycloak_hash": keycloak_hash(pg),
                    "settings": {lk.name: lk.settings for lk in latchkeys}}
            say("hash-capacity of each latchkey's argon2id, one thread on the providers' CPU")
            meta["hash_capacity"] = {lk.name: lk.hash_capacity() for lk in latchkeys}
            report(outdir, started, args, binary_info, results, rss, meta)
        finally:
            if kc:
                kc.stop()
            procs.stop_all()
            pg.stop()
    return 0
