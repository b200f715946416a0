#!/usr/bin/env python3
"""Gateway benchmark (issue 9, seed 002): the upstream direct, latchkey's
gateway (in-process and Redis rate limiter) and HAProxy doing the same job
(jwt_verify + a stick-table limit), on this machine, in one run.

Usage (from the repository root):
  cargo build --release && cargo build --release --example bench_upstream
  go install github.com/tsenart/vegeta/v12@latest      # the light open-model generator
  loadtest/gateway/run.py [--wrk-secs 15] [--k6-secs 60] [--k6-rounds 3] [--rate 5000]
                          [--generators vegeta,k6]
                          [--targets upstream,gateway-local,gateway-redis,haproxy,haproxy-plain]
                          [--conns 50,100] [--no-k6] [--no-wrk]

What it does, in a temporary directory removed at the end:
- starts redis-server and a latchkey service (embedded, ES256 keys, rate
  limits off, issuer http://latchkey.bench), seeds 100 accounts, logs each in:
  100 access tokens (tokens.txt);
- writes the service's ES256 key as a PEM for HAProxy's jwt_verify;
- starts the upstream (target/release/examples/bench_upstream) and every
  target, and checks that each gives 200 to a valid token and 401 to a
  forged one. Targets: the upstream alone; the gateway with the in-process
  and with the Redis limiter (-ws: the work-stealing runtime; -1w: one
  worker); HAProxy with jwt_verify (ES256) and a stick-table limit; HAProxy
  proxying only (no JWT: the scale of proxying);
- wrk (keep-alive, 2 threads, cycling through the tokens) at each
  connection count, target after target; each process's CPU time over each
  run gives CPU per request;
- the open model at RATE/s, with each generator in turn: vegeta (constant
  rate, ~0.4 core at 5,000/s) and k6 constant-arrival-rate (the seeds' tool,
  ~1 of the 2 cores at 5,000/s), both with GOGC=off (Go's collector pauses
  would otherwise be measured as the targets' tail); in rounds, the targets
  interleaved within each round, so that noise on the machine hits all of
  them alike; the report gives medians over the rounds and the P99 added
  over the direct upstream of the same round;
- a measurement during which another k6, vegeta, wrk, haproxy, cargo or
  rustc appeared is repeated (up to 3 times; a last disturbed one is marked);
- prints a Markdown report and writes it, with the raw outputs, to
  loadtest/results/<UTC date-time>-gateway/.

Every route checks the token (signature, iss, aud, exp) and applies a
per-subject limit high enough never to refuse (10,000,000 per 60 s), so the
cost of the limiter is measured without 429s. Before every load run the
script waits while another k6, wrk, haproxy, cargo or rustc runs on the
machine, or while the machine is more than 15 % busy.
"""

import argparse
import base64
import datetime as dt
import json
import os
import platform
import re
import resource
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HERE = os.path.join(ROOT, "loadtest", "gateway")
LATCHKEY = os.path.join(ROOT, "target", "release", "latchkey")
UPSTREAM = os.path.join(ROOT, "target", "release", "examples", "bench_upstream")
ISSUER = "http://latchkey.bench"
LIMIT = 10_000_000


def say(msg):
    print(f"[gateway-bench] {msg}", file=sys.stderr, flush=True)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port, timeout=20):
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.05)
    raise SystemExit(f"nothing listens on {port}")


def http(method, url, body=None, headers=None):
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method, headers=headers or {})
    if data is not None:
        req.add_header("content-type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def cpu_seconds(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            rest = f.read().rsplit(")", 1)[1].split()
        return (int(rest[11]) + int(rest[12])) / os.sysconf("SC_CLK_TCK")
    except OSError:
        return 0.0


def parent_of(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return None


def stopped(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("T", "t")
    except OSError:
        return False


WATCHED = ("k6", "vegeta", "wrk", "haproxy", "cargo", "rustc")


def others_running(own):
    """Other k6, vegeta, wrk, haproxy, cargo or rustc processes than ours (`own`,
    or our children). Reads /proc itself: a pgrep per name every half second
    would itself put fork/exec noise into the measured tails."""
    found = []
    me = os.getpid()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        pid = int(entry)
        try:
            with open(f"/proc/{pid}/comm") as f:
                name = f.read().strip()
        except OSError:
            continue
        if name not in WATCHED or pid in own or stopped(pid) or parent_of(pid) == me:
            continue
        found.append(f"{pid} {name}")
    return found


def cpu_busy(seconds=2.0):
    """Share of all cores busy over `seconds` (our own processes are idle then)."""
    def sample():
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:]]
        return sum(v), v[3] + v[4]
    t0, i0 = sample()
    time.sleep(seconds)
    t1, i1 = sample()
    return 1 - (i1 - i0) / max(t1 - t0, 1)


def wait_for_quiet(own):
    """Waits while another load generator or a build runs, or the machine is busy."""
    while True:
        busy = others_running(own)
        if busy:
            say(f"another load generator or build runs ({busy[0][:100]}); waiting")
            time.sleep(10)
            continue
        load = cpu_busy()
        if load > 0.15:
            say(f"the machine is {load:.0%} busy before the run; waiting")
            time.sleep(10)
            continue
        return


class Watch:
    """Notes any other load generator or build that runs during a measurement."""

    def __init__(self, own):
        self.own, self.seen, self.stop = own, [], threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self):
        while not self.stop.wait(2.0):
            self.seen += others_running(self.own)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join()


NO_WAIT = False


def measure(procs, label, fn, attempts=3):
    """Runs `fn` on a quiet machine; again (up to `attempts`) if something else
    started meanwhile. The result says how many tries it took and whether the
    last one was still disturbed. (--no-wait: once, at once; for profiles.)"""
    if NO_WAIT:
        attempts = 1
    for attempt in range(1, attempts + 1):
        if not NO_WAIT:
            wait_for_quiet(procs.pids())
        t0, s0 = cpu_ticks()
        with Watch(procs.pids()) as w:
            result = fn()
        t1, s1 = cpu_ticks()
        result["steal"] = (s1 - s0) / max(t1 - t0, 1)
        result["attempts"] = attempt
        result["disturbed"] = bool(w.seen)
        if not w.seen:
            return result
        say(f"{label}: disturbed by {w.seen[0][:80]}; measuring again")
    return result


class Procs:
    def __init__(self):
        self.items = {}

    def start(self, name, args, log, env=None, cwd=None):
        f = open(log, "w")
        p = subprocess.Popen(args, stdout=f, stderr=subprocess.STDOUT, env=env, cwd=cwd)
        self.items[name] = p
        return p

    def stop(self, name):
        p = self.items.pop(name, None)
        if p and p.poll() is None:
            p.send_signal(signal.SIGTERM)
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()

    def stop_all(self):
        for name in list(self.items):
            self.stop(name)

    def pids(self):
        return {p.pid for p in self.items.values()}


def jwk_to_pem(jwk):
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    def num(s):
        return int.from_bytes(base64.urlsafe_b64decode(s + "=" * (-len(s) % 4)), "big")

    key = ec.EllipticCurvePublicNumbers(num(jwk["x"]), num(jwk["y"]), ec.SECP256R1()).public_key()
    return key.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)


def gateway_toml(port, upstream, jwks, redis_url, store, runtime, workers=None):
    return f"""
listen = "127.0.0.1:{port}"
runtime = "{runtime}"
{f"workers = {workers}" if workers else ""}
jwks_url = "{jwks}"
issuer = "{ISSUER}"
audiences = ["latchkey"]
log = "warn"
redis_url = "{redis_url}"
rate_limit_store = "{store}"

[[routes]]
name = "bench"
path_prefix = "/"
upstream = "http://127.0.0.1:{upstream}"
[routes.rate_limit]
limit = {LIMIT}
window_secs = 60
key = "sub"
"""


def haproxy_cfg(port, upstream, pem):
    return f"""
global
    nbthread 2
    maxconn 4000

defaults
    mode http
    timeout connect 1s
    timeout client 30s
    timeout server 30s
    option http-keep-alive
    option forwardfor

backend per_sub
    stick-table type string len 64 size 100k expire 60s store http_req_rate(60s)

frontend gateway
    bind 127.0.0.1:{port}
    http-request deny deny_status 401 unless {{ http_auth_bearer -m found }}
    http-request set-var(txn.bearer) http_auth_bearer
    http-request set-var(txn.alg) var(txn.bearer),jwt_header_query('$.alg')
    http-request set-var(txn.iss) var(txn.bearer),jwt_payload_query('$.iss')
    http-request set-var(txn.aud) var(txn.bearer),jwt_payload_query('$.aud')
    http-request set-var(txn.exp) var(txn.bearer),jwt_payload_query('$.exp','int')
    http-request set-var(txn.sub) var(txn.bearer),jwt_payload_query('$.sub')
    http-request deny deny_status 401 unless {{ var(txn.alg) -m str ES256 }}
    http-request deny deny_status 401 unless {{ var(txn.iss) -m str {ISSUER} }}
    http-request deny deny_status 401 unless {{ var(txn.aud) -m str latchkey }}
    http-request deny deny_status 401 unless {{ var(txn.bearer),jwt_verify(txn.alg,"{pem}") -m int 1 }}
    http-request set-var(txn.now) date()
    http-request deny deny_status 401 if {{ var(txn.exp),sub(txn.now) -m int lt 0 }}
    http-request track-sc0 var(txn.sub) table per_sub
    http-request deny deny_status 429 if {{ sc_http_req_rate(0) gt {LIMIT} }}
    http-request del-header X-Auth-Subject
    http-request del-header X-Auth-Email
    http-request del-header X-Auth-Session
    http-request set-header X-Auth-Subject %[var(txn.sub)]
    http-request set-header X-Auth-Email %[var(txn.bearer),jwt_payload_query('$.email')]
    http-request set-header X-Auth-Session %[var(txn.bearer),jwt_payload_query('$.sid')]
    http-request set-header X-Request-Id %[uuid] unless {{ req.hdr(x-request-id) -m found }}
    default_backend upstream

backend upstream
    http-reuse always
    server up1 127.0.0.1:{upstream}
"""


def haproxy_plain_cfg(port, upstream):
    """HAProxy proxying only (no JWT, no limit): the scale of the proxying itself."""
    return f"""
global
    nbthread 2
    maxconn 4000

defaults
    mode http
    timeout connect 1s
    timeout client 30s
    timeout server 30s
    option http-keep-alive
    option forwardfor

frontend plain
    bind 127.0.0.1:{port}
    default_backend upstream

backend upstream
    http-reuse always
    server up1 127.0.0.1:{upstream}
"""


def cpu_ticks():
    """(total, steal) jiffies of all cores: steal is time the hypervisor gave to others."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    return sum(v[:8]), v[7]


def children_cpu():
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def run_wrk(url, conns, secs, tokens, raw, label):
    c0 = children_cpu()
    out = subprocess.run(
        ["wrk", "-t2", f"-c{conns}", f"-d{secs}s", "--latency", "-s", os.path.join(HERE, "tokens.lua"), url],
        capture_output=True,
        text=True,
        env={**os.environ, "TOKENS_FILE": tokens},
    )
    with open(os.path.join(raw, f"wrk-{label}-c{conns}.txt"), "w") as f:
        f.write(out.stdout + out.stderr)
    m = re.search(r"^WRKJSON (.*)$", out.stdout, re.M)
    if not m:
        raise SystemExit(f"wrk printed no summary: {out.stdout} {out.stderr}")
    j = json.loads(m.group(1))
    j["rps"] = j["requests"] / (j["duration_us"] / 1e6)
    j["generator_cores"] = (children_cpu() - c0) / (j["duration_us"] / 1e6)
    return j


def vegeta_bin():
    """vegeta on PATH, or where `go install` puts it."""
    return shutil.which("vegeta") or os.path.expanduser("~/go/bin/vegeta")


def installed(tool):
    return os.path.exists(vegeta_bin()) if tool == "vegeta" else shutil.which(tool) is not None


def run_vegeta(url, rate, secs, tokens, raw, label, tmp):
    """vegeta attack at a constant rate (open model: a new worker per tick when
    all are busy, so a slow answer does not delay the next request), cycling
    through the tokens; its JSON report plus the CPU it used."""
    targets = os.path.join(tmp, "vegeta-targets.txt")
    with open(tokens) as f, open(targets, "w") as out:
        for t in (l.strip() for l in f):
            if t:
                out.write(f"GET {url}\nAuthorization: Bearer {t}\n\n")
    results = os.path.join(tmp, "vegeta-results.bin")
    c0 = children_cpu()
    with open(results, "wb") as f:
        subprocess.run([vegeta_bin(), "attack", f"-rate={rate}/s", f"-duration={secs}s", f"-targets={targets}",
                        "-keepalive=true", "-max-body=0"], stdout=f, stderr=subprocess.PIPE, check=True,
                       # As for k6: Go's collector puts its pauses into the measured tail
                       # (direct upstream P99 2.0 ms with it, 0.7 ms without); ~2 GB per minute.
                       env={**os.environ, "GOGC": "off"})
    generator = (children_cpu() - c0) / secs
    rep = subprocess.run([vegeta_bin(), "report", "-type=json", results], capture_output=True, text=True, check=True)
    with open(os.path.join(raw, f"vegeta-{label}.json"), "w") as f:
        f.write(rep.stdout)
    j = json.loads(rep.stdout)
    lat = j["latencies"]
    ms = lambda ns: ns / 1e6
    os.remove(results)
    return {
        "requests": j["requests"],
        "rps": j["throughput"],
        "failed": 1 - j["success"],
        # Ticks vegeta could not send on time would show as fewer requests than planned.
        "dropped": max(0, rate * secs - j["requests"]),
        "p50": ms(lat["50th"]),
        "p90": ms(lat["90th"]),
        "p99": ms(lat["99th"]),
        "max": ms(lat["max"]),
        "generator_cores": generator,
        "codes": j.get("status_codes", {}),
    }


def run_k6(url, rate, secs, tokens, raw, label, tmp=None):
    summary = os.path.join(raw, f"k6-{label}.json")
    c0 = children_cpu()
    out = subprocess.run(
        [
            "k6", "run", "--quiet", "--no-usage-report", "--summary-export", summary,
            "-e", f"URL={url}", "-e", f"TOKENS_FILE={tokens}", "-e", f"RATE={rate}", "-e", f"DURATION={secs}",
            os.path.join(HERE, "rate.js"),
        ],
        capture_output=True,
        text=True,
        # Go's collector, left on, adds ~50 ms pauses to k6's own P99 here (see rate.js).
        env={**os.environ, "GOGC": "off"},
    )
    generator = (children_cpu() - c0) / secs
    with open(os.path.join(raw, f"k6-{label}.log"), "w") as f:
        f.write(out.stdout + out.stderr)
    with open(summary) as f:
        m = json.load(f)["metrics"]
    d = m["http_req_duration"]
    return {
        "requests": m["http_reqs"]["count"],
        "rps": m["http_reqs"]["rate"],
        "failed": m.get("http_req_failed", {}).get("value", 0.0),
        "dropped": m.get("dropped_iterations", {}).get("count", 0),
        "p50": d["med"],
        "p90": d["p(90)"],
        "p99": d["p(99)"],
        "p999": d["p(99.9)"],
        "max": d["max"],
        "generator_cores": generator,
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--wrk-secs", type=int, default=15)
    ap.add_argument("--k6-secs", type=int, default=60)
    ap.add_argument("--k6-rounds", type=int, default=3)
    ap.add_argument("--rate", type=int, default=5000)
    ap.add_argument("--conns", default="50,100")
    ap.add_argument("--targets", default="upstream,gateway-local,gateway-redis,haproxy,haproxy-plain")
    ap.add_argument("--k6-targets", default="upstream,gateway-local,gateway-redis,haproxy")
    ap.add_argument("--no-k6", action="store_true")
    ap.add_argument("--generators", default="vegeta,k6",
                    help="open-model load generators, in this order: vegeta (light: ~0.4 core at 5,000/s) "
                         "and/or k6 (the seeds' tool: ~1 core at 5,000/s)")
    ap.add_argument("--no-wrk", action="store_true")
    ap.add_argument("--wrk-rounds", type=int, default=1,
                    help="wrk rounds over every target, interleaved; the round with the median req/s is reported")
    ap.add_argument("--baseline",
                    help="another latchkey binary (say, the previous commit's release build): targets ending "
                         "in -base run their gateway with it, for before/after figures from one run")
    ap.add_argument("--perf", action="store_true",
                    help="record a CPU profile (perf, call graphs) of each target during its first wrk run")
    ap.add_argument("--no-wait", action="store_true",
                    help="measure at once even if the machine is busy (marked disturbed); for profiling runs")
    args = ap.parse_args()
    global NO_WAIT
    NO_WAIT = args.no_wait
    for b in (LATCHKEY, UPSTREAM):
        if not os.path.exists(b):
            raise SystemExit(f"{b} missing: cargo build --release && cargo build --release --example bench_upstream")
    for tool in ("wrk", "haproxy", "redis-server") + tuple(args.generators.split(",")):
        if not installed(tool):
            hint = " (go install github.com/tsenart/vegeta/v12@latest)" if tool == "vegeta" else ""
            raise SystemExit(f"{tool} is not installed{hint}")
    targets = args.targets.split(",")
    if any(t.endswith("-base") for t in targets) and not (args.baseline and os.path.exists(args.baseline)):
        raise SystemExit("targets ending in -base need --baseline PATH (a latchkey binary)")
    for t in targets:
        if t.removesuffix("-base") not in ("upstream", "gateway-local", "gateway-redis", "gateway-local-ws", "gateway-redis-ws",
                     "gateway-local-1w", "gateway-redis-1w",
                     "haproxy", "haproxy-plain"):
            raise SystemExit(f"unknown target {t}")

    started = dt.datetime.now(dt.timezone.utc)
    out_dir = os.path.join(ROOT, "loadtest", "results", started.strftime("%Y-%m-%d-%H%M") + "-gateway")
    raw = os.path.join(out_dir, "raw")
    os.makedirs(raw, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix="latchkey-gwbench-")
    procs = Procs()
    results = {t: {"wrk": {}, "open": {}} for t in targets}
    try:
        redis_port, svc_port, up_port = free_port(), free_port(), free_port()
        procs.start("redis", ["redis-server", "--bind", "127.0.0.1", "--port", str(redis_port), "--save", "",
                              "--appendonly", "no"], os.path.join(raw, "redis.log"))
        env = {
            **{k: v for k, v in os.environ.items() if not k.startswith("LATCHKEY_")},
            "LATCHKEY_LISTEN": f"127.0.0.1:{svc_port}",
            "LATCHKEY_ADMIN_LISTEN": "off",
            "LATCHKEY_DATA_DIR": os.path.join(tmp, "data"),
            "LATCHKEY_SECRET_KEY": base64.b64encode(secrets.token_bytes(32)).decode(),
            "LATCHKEY_SIGNING_ALGORITHM": "ES256",
            "LATCHKEY_RATE_LIMIT": "off",
            "LATCHKEY_LOG": "warn",
            "LATCHKEY_ISSUER": ISSUER,
            "LATCHKEY_ACCESS_TOKEN_TTL_SECS": "7200",
        }
        say("seeding 100 accounts")
        subprocess.run([LATCHKEY, "users", "seed", "--count", "100", "--password", "loadtest-password"],
                       env=env, check=True, capture_output=True)
        procs.start("service", [LATCHKEY, "serve"], os.path.join(raw, "service.log"), env=env)
        wait_port(svc_port)
        wait_port(redis_port)
        base = f"http://127.0.0.1:{svc_port}"
        tokens = []
        for i in range(1, 101):
            status, body = http("POST", f"{base}/auth/login",
                                {"email": f"user{i}@loadtest.latchkey", "password": "loadtest-password"})
            if status != 200:
                raise SystemExit(f"login failed: {status} {body[:200]}")
            tokens.append(json.loads(body)["access_token"])
        tokens_file = os.path.join(tmp, "tokens.txt")
        with open(tokens_file, "w") as f:
            f.write("\n".join(tokens) + "\n")
        _, jwks = http("GET", f"{base}/.well-known/jwks.json")
        jwk = json.loads(jwks)["keys"][0]
        assert jwk["alg"] == "ES256", jwk
        pem = os.path.join(tmp, "latchkey-es256.pem")
        with open(pem, "wb") as f:
            f.write(jwk_to_pem(jwk))
        header, payload, sig = tokens[0].split(".")
        claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
        claims["sub"] = "someone-else"
        forged_payload = base64.urlsafe_b64encode(json.dumps(claims).encode()).decode().rstrip("=")
        forged = f"{header}.{forged_payload}.{sig}"

        # Every target runs from here on (idle ones cost nothing), so that the
        # k6 rounds can interleave them: noise on the machine then hits all alike.
        procs.start("upstream", [UPSTREAM, f"127.0.0.1:{up_port}"], os.path.join(raw, "upstream.log"))
        wait_port(up_port)
        urls = {}
        for target in targets:
            port = up_port
            if target.startswith("gateway-"):
                port = free_port()
                cfg = os.path.join(tmp, f"{target}.toml")
                with open(cfg, "w") as f:
                    f.write(gateway_toml(port, up_port, f"{base}/.well-known/jwks.json",
                                         f"redis://127.0.0.1:{redis_port}", target.split("-")[1],
                                         "work-stealing" if target.removesuffix("-base").endswith("-ws") else "per-core",
                                         1 if target.removesuffix("-base").endswith("-1w") else None))
                shutil.copy(cfg, os.path.join(raw, f"{target}.toml"))
                binary = args.baseline if target.endswith("-base") else LATCHKEY
                procs.start(target, [binary, "gateway", "--config", cfg], os.path.join(raw, f"{target}.log"))
            elif target.startswith("haproxy"):
                port = free_port()
                cfg = os.path.join(tmp, f"{target}.cfg")
                with open(cfg, "w") as f:
                    f.write(haproxy_cfg(port, up_port, pem) if target == "haproxy" else haproxy_plain_cfg(port, up_port))
                shutil.copy(cfg, os.path.join(raw, f"{target}.cfg"))
                procs.start(target, ["haproxy", "-db", "-f", cfg], os.path.join(raw, f"{target}.log"))
            wait_port(port)
            url = f"http://127.0.0.1:{port}/bench"
            ok, _ = http("GET", url, headers={"Authorization": f"Bearer {tokens[0]}"})
            bad, _ = http("GET", url, headers={"Authorization": f"Bearer {forged}"})
            say(f"{target}: valid token {ok}, forged token {bad}")
            if ok != 200 or (target not in ("upstream", "haproxy-plain") and bad != 401):
                raise SystemExit(f"{target} does not do the job (valid {ok}, forged {bad})")
            urls[target] = url
        pid_of = {t: procs.items[t].pid for t in targets}
        redis_pid = procs.items["redis"].pid

        wrk_plan = [(rnd, t) for rnd in range(1, args.wrk_rounds + 1) for t in targets] if not args.no_wrk else []
        for rnd, target in wrk_plan:
            url, pid = urls[target], pid_of[target]
            if rnd == 1:
                run_wrk(url, 50, 3, tokens_file, raw, f"{target}-warmup")
            for conns in [int(c) for c in args.conns.split(",")]:
                def one_wrk():
                    c0, r0 = cpu_seconds(pid), cpu_seconds(redis_pid)
                    perf = None
                    if args.perf and not os.path.exists(os.path.join(raw, f"perf-{target}.data")):
                        perf = subprocess.Popen(
                            ["perf", "record", "-F", "499", "-g", "-p", str(pid), "-o",
                             os.path.join(raw, f"perf-{target}.data"), "--", "sleep", str(max(args.wrk_secs - 2, 1))],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                    w = run_wrk(url, conns, args.wrk_secs, tokens_file, raw, target)
                    if perf:
                        perf.wait()
                    w["cpu_us_per_req"] = (cpu_seconds(pid) - c0) * 1e6 / max(w["requests"], 1)
                    w["redis_cpu_us_per_req"] = (cpu_seconds(redis_pid) - r0) * 1e6 / max(w["requests"], 1)
                    return w
                w = measure(procs, f"{target} wrk c{conns} round {rnd}", one_wrk)
                rounds = results[target].setdefault("wrk_rounds", {}).setdefault(conns, [])
                rounds.append(w)
                # The round with the median req/s stands for the target.
                results[target]["wrk"][conns] = sorted(rounds, key=lambda x: x["rps"])[(len(rounds) - 1) // 2]
                say(f"{target} wrk c{conns}: {w['rps']:.0f} req/s, p99 {w['latency_us']['p99'] / 1000:.2f} ms, "
                    f"non-2xx {w['errors']['status']}, {w['cpu_us_per_req']:.1f} us CPU/req")

        k6_targets = [t for t in args.k6_targets.split(",") if t in targets] if not args.no_k6 else []
        runners = {"vegeta": run_vegeta, "k6": run_k6}
        for gen in args.generators.split(",") if k6_targets else []:
            for rnd in range(1, args.k6_rounds + 1):
                for target in k6_targets:
                    url, pid = urls[target], pid_of[target]
                    def one_open():
                        c0 = cpu_seconds(pid)
                        k = runners[gen](url, args.rate, args.k6_secs, tokens_file, raw, f"{target}-r{rnd}", tmp)
                        k["cpu_share"] = (cpu_seconds(pid) - c0) / args.k6_secs
                        return k
                    k = measure(procs, f"{target} {gen} round {rnd}", one_open)
                    results[target]["open"].setdefault(gen, []).append(k)
                    say(f"{target} {gen} {args.rate}/s round {rnd}: p50 {k['p50']:.2f} ms, p99 {k['p99']:.2f} ms, "
                        f"max {k['max']:.1f} ms, dropped {k['dropped']}, {gen} {k['generator_cores']:.2f} cores, "
                        f"steal {k['steal']:.0%}")
    finally:
        procs.stop_all()
        shutil.rmtree(tmp, ignore_errors=True)

    report = render(results, args, started)
    with open(os.path.join(out_dir, "report.md"), "w") as f:
        f.write(report)
    with open(os.path.join(out_dir, "summary.json"), "w") as f:
        json.dump(results, f, indent=2, default=str)
    print(report)


def median(xs):
    xs = sorted(xs)
    n = len(xs)
    return (xs[n // 2] + xs[(n - 1) // 2]) / 2 if xs else float("nan")


def render(results, args, started):
    cpu = "unknown"
    try:
        with open("/proc/cpuinfo") as f:
            cpu = re.search(r"model name\s*:\s*(.*)", f.read()).group(1)
    except OSError:
        pass
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    rev = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    lines = [
        f"Run {started.strftime('%Y-%m-%d %H:%M')} UTC, git {rev} (+ working tree), {os.cpu_count()} cores "
        f"({cpu}), {mem:.0f} GiB, Linux {platform.release()}; everything (load generator, upstream, "
        "gateway or HAProxy, Redis, latchkey) on the same machine.",
        "Command: `loadtest/gateway/run.py " + " ".join(sys.argv[1:]) + "`",
        "",
    ]
    conns = [int(c) for c in args.conns.split(",")]
    if not args.no_wrk:
        lines += [
            "Maximum throughput (wrk -t2, keep-alive, 100 ES256 tokens in rotation, "
            f"{args.wrk_secs} s per cell):",
            "",
            "| target | " + " | ".join(f"c{c} req/s | c{c} P50 / P99 ms" for c in conns)
            + " | CPU us/req (c%d) | wrk CPU (cores) | steal |" % conns[-1],
            "|---|" + "---|---|" * len(conns) + "---|---|---|",
        ]
        for t, r in results.items():
            cells = []
            for c in conns:
                w = r["wrk"].get(c)
                if w is None:
                    cells += ["", ""]
                    continue
                err = w["errors"]["status"] + w["errors"]["timeout"]
                cells += [f"{w['rps']:,.0f}" + (f" ({err} errors)" if err else "")
                          + (" (disturbed)" if w.get("disturbed") else ""),
                          f"{w['latency_us']['p50'] / 1000:.2f} / {w['latency_us']['p99'] / 1000:.2f}"]
            last = r["wrk"].get(conns[-1], {})
            cpu_req = f"{last.get('cpu_us_per_req', 0):.1f}"
            if t == "gateway-redis" and last:
                cpu_req += f" (+ Redis {last['redis_cpu_us_per_req']:.1f})"
            steal = max((w.get("steal", 0) for w in r["wrk"].values()), default=0)
            lines.append(f"| {t} | " + " | ".join(cells)
                         + f" | {cpu_req} | {last.get('generator_cores', 0):.2f} | {steal:.0%} |")
        lines.append("")
    about = {
        "vegeta": "vegeta attack (constant rate; ~0.4 core at 5,000/s, so the targets keep most of the machine)",
        "k6": "k6 constant-arrival-rate (the seeds' tool; ~1 of the 2 cores at 5,000/s, GOGC=off)",
    }
    for gen in args.generators.split(","):
        if not any(r["open"].get(gen) for r in results.values()):
            continue
        base = results.get("upstream", {}).get("open", {}).get(gen) or []
        lines += [
            f"Open model, {about[gen]}, {args.rate}/s, {args.k6_secs} s per run, "
            f"{args.k6_rounds} rounds with the targets interleaved; medians over the rounds "
            "(P99 of each round in brackets):",
            "",
            "| target | achieved req/s | P50 ms | P90 ms | P99 ms | max ms | failed | dropped | "
            f"P99 added vs direct | target CPU (cores) | {gen} CPU (cores) | steal |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for t, r in results.items():
            ks = r["open"].get(gen) or []
            if not ks:
                continue
            m = {key: median([k[key] for k in ks]) for key in
                 ("rps", "p50", "p90", "p99", "max", "failed", "cpu_share", "generator_cores", "steal")}
            dropped = sum(k["dropped"] for k in ks)
            added = ""
            if base and t != "upstream":
                diffs = [k["p99"] - b["p99"] for k, b in zip(ks, base)]
                added = f"{median(diffs):+.2f} ms [" + ", ".join(f"{d:+.2f}" for d in diffs) + "]"
            per_round = ", ".join(f"{k['p99']:.2f}" + ("*" if k.get("disturbed") else "") for k in ks)
            lines.append(
                f"| {t} | {m['rps']:,.0f} | {m['p50']:.2f} | {m['p90']:.2f} | {m['p99']:.2f} [{per_round}] | "
                f"{m['max']:.1f} | {m['failed'] * 100:.2f} % | {dropped} | {added} | "
                f"{m['cpu_share']:.2f} | {m['generator_cores']:.2f} | {m['steal']:.0%} |"
            )
        lines.append("")
    lines.append("(* a round during which another load generator or build appeared, after 3 tries. "
                 "steal: share of the machine's CPU time the hypervisor gave to other guests during the runs. "
                 "P99 added: per round, the target's P99 minus the direct upstream's P99 of the same round and "
                 "generator; the median, then each round in brackets.)")
    lines.append("")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
