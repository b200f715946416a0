"""latchkey and Keycloak 26 as OpenID Providers, side by side in one run:
how many applications' sign-ins each serves at a latency a person accepts.

Usage (from the repository root):
  scripts/loadtest oidc-compare [--secs 15] [--accounts 500] [--factor 1.3]
                                [--binary PATH] [--keycloak-version 26.7.3]

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
- Pinning: both providers, PostgreSQL and Redis on CPU 1; k6 on CPU 0, so
  the generator's cost never counts against a provider.

The measurement: after a warm-up of each flow on each provider (Keycloak's
JIT compiles there), a ladder of open-model steps per flow and provider,
interleaved (latchkey's ladder then Keycloak's, per flow): constant arrival
rate RATE for SECS seconds, RATE multiplied by FACTOR after each step that
held, until a step's P95 of the whole flow exceeds the flow's limit (500 ms
sign-in, 100 ms single sign-on), fewer than 99 % of flows succeed, or k6
could not start 97 % of the planned flows. A provider's capacity is the
rate asked of its last step that held. The report (report.md, summary.json in
loadtest/results/<date>-oidc-compare/) has every step with P50 / P95 / P99,
the CPU each process used per flow, and both providers' peak RSS.
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
    proc_tree, say, utc_now, wait_until
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
    "signin": {"p95_ms": 500, "start": 4.0, "goal": 3.0},
    "sso": {"p95_ms": 100, "start": 20.0, "goal": 10.0},
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


class Latchkey:
    def __init__(self, binary, pg, redis_url, tmp, procs, raw):
        self.binary, self.procs, self.raw = binary, procs, raw
        self.port = free_port()
        env = {k: v for k, v in os.environ.items() if not k.startswith("LATCHKEY_")}
        env.update({
            "LATCHKEY_DATA_DIR": os.path.join(tmp, "latchkey"),
            "LATCHKEY_DATABASE_URL": pg.url("latchkey"),
            "LATCHKEY_REDIS_URL": redis_url,
            "LATCHKEY_SECRET_KEY": base64.b64encode(secrets.token_bytes(32)).decode(),
            "LATCHKEY_ISSUER": self.issuer,
            "LATCHKEY_LISTEN": f"127.0.0.1:{self.port}",
            "LATCHKEY_ADMIN_LISTEN": "off",
            "LATCHKEY_RATE_LIMIT": "off",
            "LATCHKEY_CREDENTIAL_CACHE": "off",
            "LATCHKEY_LOG": "warn",
        })
        self.env = env
        self.secrets = {}
        self.proc = None

    @property
    def issuer(self):
        return f"http://127.0.0.1:{self.port}"

    def start(self, accounts):
        with open(self.raw / "latchkey-setup.log", "w") as log:
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
        self.proc = self.procs.start("latchkey", ["taskset", "-c", str(SERVER_CPU), self.binary, "serve"],
                                     self.raw / "latchkey.log", env=self.env)
        wait_until(lambda: http("GET", f"{self.issuer}/health/ready", timeout=1)[0] == 200, "latchkey",
                   timeout=60, interval=0.2, proc=self.proc)

    def pids(self):
        return proc_tree(self.proc.pid)


def process_cpu(groups):
    """CPU seconds so far of each named group of pids."""
    return {name: sum(cpu_seconds(p) or 0 for p in pids()) for name, pids in groups.items()}


def step(name, provider, flow, rate, secs, accounts, raw, groups):
    """One k6 step: its figures, or None when k6 could not run it."""
    env = {"ISSUER": provider["issuer"], "FLOW": flow, "RATE": f"{rate:.2f}", "SECS": secs,
           "ACCOUNTS": accounts, "SEED_PASSWORD": SEED_PASSWORD, "SESSIONS": 100,
           "MAX_VUS": 600}
    for app in APPS:
        env[f"REDIRECT_{app}"] = redirect_uri(app)
        env[f"SECRET_{app}"] = provider["secrets"][app]
    summary = raw / f"{name}-{flow}-{rate:.1f}.json"
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
    held = [r for r in rows if r["held"]]
    # The open model's rate: a held step started at least 97 % of it, on time.
    return {"steps": rows, "capacity": held[-1]["rate"] if held else 0.0}


def report(outdir, started, args, binary_info, results, rss, meta):
    m = meta["machine"]
    lines = ["# latchkey and Keycloak as OpenID Providers, side by side", "",
             f"- command: `scripts/loadtest oidc-compare --secs {args.secs} --accounts {args.accounts} "
             f"--factor {args.factor}`",
             f"- date: {started.strftime('%Y-%m-%d %H:%M')} UTC; machine: {m['nproc']} x {m['cpu']}, "
             f"{m['ram_gib']:.0f} GiB, Linux {m['kernel']}",
             f"- latchkey: {meta['revision']} ({binary_info}), PostgreSQL + Redis, credential cache off",
             f"- Keycloak {args.keycloak_version} on Temurin 25, PostgreSQL, heap at most 1 GiB",
             f"- both providers, PostgreSQL and Redis pinned to CPU {SERVER_CPU}; k6 to CPU {GENERATOR_CPU}",
             f"- {args.accounts} accounts on each; each step {args.secs} s at a constant arrival rate", ""]
    lines += ["| flow | latchkey (flows/s) | Keycloak (flows/s) | ratio | goal |", "|---|---|---|---|---|"]
    for flow in results:
        spec = FLOWS[flow]
        lk, kc = results[flow]["latchkey"]["capacity"], results[flow]["keycloak"]["capacity"]
        ratio = lk / kc if kc else float("inf")
        lines.append(f"| {flow} (P95 <= {spec['p95_ms']} ms) | {lk:.1f} | {kc:.1f} | {ratio:.1f}x | "
                     f">= {spec['goal']:.0f}x: {'met' if ratio >= spec['goal'] else 'NOT met'} |")
    lines += ["", f"Peak RSS: latchkey {rss['latchkey']:.1f} MiB; Keycloak (JVM) {rss['keycloak']:.1f} MiB.", ""]
    for flow in results:
        for name in ("latchkey", "keycloak"):
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
    args = ap.parse_args(argv)
    flows = [f for f in args.flows.split(",") if f]
    if not flows or any(f not in FLOWS for f in flows):
        ap.error(f"--flows: some of {', '.join(FLOWS)}")
    if args.factor <= 1.0:
        ap.error("--factor must be above 1")
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
            lk = Latchkey(binary, pg, redis_url, tmp, procs, raw)
            lk.start(args.accounts)
            kc = Keycloak(home, pg, tmp, procs, raw)
            kc.start(args.accounts)
            postmaster = int((pg.data / "postmaster.pid").read_text().split()[0])
            databases = {"postgres": lambda: proc_tree(postmaster),
                         "redis": lambda: proc_tree(procs.items["redis"].pid)}
            for pids in databases.values():
                for pid in pids():
                    pin(pid, SERVER_CPU)
            os.sched_setaffinity(0, {GENERATOR_CPU})  # k6, started from here, inherits it
            providers = {
                "latchkey": {"issuer": lk.issuer, "secrets": lk.secrets, "pids": lk.pids},
                "keycloak": {"issuer": kc.issuer, "secrets": {a: f"{a}-secret" for a in APPS}, "pids": kc.pids},
            }
            say("warm-up: each flow on each provider, 20 s at a low rate (not counted)")
            for name, prov in providers.items():
                for flow in flows:
                    step(f"{name}-warmup", prov, flow, FLOWS[flow]["start"] * 2, 20, args.accounts, raw,
                         {"provider": prov["pids"], **databases})
            results = {}
            for flow in flows:
                results[flow] = {}
                for name, prov in providers.items():
                    results[flow][name] = ladder(name, prov, flow, args, raw, {"provider": prov["pids"], **databases})
            rss = {"latchkey": (proc_rss_kib(lk.proc.pid, "VmHWM") or 0) / 1024,
                   "keycloak": max((proc_rss_kib(p, "VmHWM") or 0) for p in kc.pids()) / 1024}
            meta = {"machine": machine_info(), "revision": git_revision(), "started": started.isoformat(),
                    "finished": utc_now().isoformat()}
            report(outdir, started, args, binary_info, results, rss, meta)
        finally:
            if kc:
                kc.stop()
            procs.stop_all()
            pg.stop()
    return 0
