"""Gateway benchmark: the upstream direct, latchkey's gateway (in-process
and Redis rate limiter) and HAProxy doing the same job (jwt_verify + a
stick-table limit), on this machine, in one run. The reference it answers
is a Spring Cloud Gateway's published 5,000 req/s with JWT validation and a
Redis token bucket at a P99 of 12 ms.

Usage (from the repository root):
  cargo build --release && cargo build --release --example bench_upstream
  go install github.com/tsenart/vegeta/v12@latest      # the light open-model generator
  scripts/loadtest gateway [--wrk-secs 15] [--k6-secs 60] [--k6-rounds 3] [--rate 5000]
                           [--generators vegeta,k6]
                           [--targets upstream,gateway-local,gateway-redis,haproxy,haproxy-plain]
                           [--conns 50,100] [--no-k6] [--no-wrk] [--binary PATH] [--upstream PATH]
                           [--pin]

What it does, in a temporary directory removed at the end:
- starts redis-server and a latchkey service (embedded, ES256 keys, rate
  limits off, issuer http://latchkey.bench), seeds 100 accounts, logs each in:
  100 access tokens (tokens.txt);
- writes the service's ES256 key as a PEM for HAProxy's jwt_verify;
- starts the upstream (target/release/examples/bench_upstream) and every
  target, and checks that each gives 200 to a valid token and 401 to a
  forged one. Targets: the upstream alone; the gateway with the in-process
  and with the Redis limiter (-ws: the work-stealing runtime; -1w: one
  worker; -base: the --baseline binary); HAProxy with jwt_verify (ES256)
  and a stick-table limit; HAProxy proxying only (no JWT: the scale of
  proxying);
- wrk (keep-alive, 2 threads or 1 with --pin, cycling through the tokens) at each
  connection count, target after target; each process's CPU time over each
  run gives CPU per request;
- the open model at RATE/s, with each generator in turn: vegeta (constant
  rate, ~0.4 core at 5,000/s) and k6 constant-arrival-rate (the tool of the
  reference reports, ~1 of the 2 cores at 5,000/s), both with GOGC=off (Go's
  collector pauses would otherwise be measured as the targets' tail); in
  rounds, the targets interleaved within each round, so that noise on the
  machine hits all of them alike; the report gives medians over the rounds
  and the P99 added over the direct upstream of the same round;
- a measurement during which another k6, vegeta, wrk, haproxy, cargo or
  rustc appeared is repeated (up to 3 times; a last disturbed one is marked);
- each measured run is preceded by a short wrk run of the same target
  (1-3 s, not measured: prewarm());
- --perf: after the measured runs, one more wrk run of each target under
  `perf record` (loadtest/profile.py): flame-<target>.svg and profile.md;
- prints a Markdown report and writes it, with the raw outputs, to
  loadtest/results/<UTC date-time>-gateway/;
- --pin: the targets and the upstream on the first CPU this process may
  use, the generator (wrk with one thread, vegeta, k6) on the second
  (taskset); the latchkey service that issued the tokens and Redis are not
  pinned. Every target then has one core, which it shares with the
  upstream, and the direct upstream's latency is measured on that core too.

Every route checks the token (signature, iss, aud, exp) and applies a
per-subject limit high enough never to refuse (10,000,000 per 60 s), so the
cost of the limiter is measured without 429s. Before every load run the
script waits while another k6, wrk, haproxy, cargo or rustc runs on the
machine, or while the machine is more than 15 % busy.
"""

import argparse
import base64
import json
import os
import shlex
import shutil
import threading
import time

from . import common, profile
from .common import (ROOT, RunError, cpu_seconds, free_port, http, login_token, machine_jiffies, parent_of,
                     processes_named, say, stopped, wait_port)
from .report import finish, gateway_report
from .runners import run_k6, run_vegeta, run_wrk
from .servers import ISSUER, SEED_PASSWORD, bench_env, bench_workspace, seed_users, start_redis
from .tools import BENCH_UPSTREAM, ensure_binary, find_k6, find_wrk, given_binary, require

HERE = ROOT / "loadtest" / "gateway"  # rate.js (k6) and tokens.lua (wrk)
LIMIT = 10_000_000
TARGETS = ("upstream", "gateway-local", "gateway-redis", "gateway-local-ws", "gateway-redis-ws", "gateway-local-1w",
           "gateway-redis-1w", "haproxy", "haproxy-plain")


def parse_args(argv):
    ap = argparse.ArgumentParser(prog="scripts/loadtest gateway", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--wrk-secs", type=int, default=15, help="seconds per wrk run (default 15)")
    ap.add_argument("--k6-secs", type=int, default=60, help="seconds per open-model run (default 60)")
    ap.add_argument("--k6-rounds", type=int, default=3,
                    help="open-model rounds over the targets, interleaved (default 3)")
    ap.add_argument("--rate", type=int, default=5000, help="open-model requests per second (default 5000)")
    ap.add_argument("--conns", default="50,100", help="wrk connection counts (default 50,100)")
    ap.add_argument("--targets", default="upstream,gateway-local,gateway-redis,haproxy,haproxy-plain",
                    help=f"what to measure, in this order; any of {', '.join(TARGETS)}, and gateway-* "
                         "targets ending in -base (--baseline)")
    ap.add_argument("--k6-targets", default="upstream,gateway-local,gateway-redis,haproxy",
                    help="the targets of the open-model runs (those also in --targets)")
    ap.add_argument("--no-wrk", action="store_true", help="no wrk runs")
    ap.add_argument("--no-k6", action="store_true", help="no open-model runs (vegeta or k6)")
    ap.add_argument("--generators", default="vegeta,k6",
                    help="open-model load generators, in this order: vegeta (light: ~0.4 core at 5,000/s) "
                         "and/or k6 (the tool of the reference reports: ~1 core at 5,000/s)")
    ap.add_argument("--wrk-rounds", type=int, default=1,
                    help="wrk rounds over every target, interleaved; the round with the median req/s is reported")
    ap.add_argument("--baseline",
                    help="another latchkey binary (say, the previous commit's release build): targets ending "
                         "in -base run their gateway with it, for before/after figures from one run")
    ap.add_argument("--out", help="result folder (default loadtest/results/<YYYY-MM-DD-HHMM>-gateway)")
    ap.add_argument("--binary",
                    help="the latchkey binary to measure (default: $LATCHKEY_BIN, else target/release/latchkey)")
    ap.add_argument("--upstream", help=f"the upstream binary (default {BENCH_UPSTREAM.relative_to(ROOT)})")
    ap.add_argument("--perf", action="store_true",
                    help="after the measured runs, profile each target during one more wrk run: flame graphs "
                         "and profile.md")
    common.add_pin_option(ap, help="the targets and the upstream on CPU 0, the generator on CPU 1 (wrk with one thread)")
    ap.add_argument("--no-wait", action="store_true",
                    help="measure at once even if the machine is busy (marked disturbed); for profiling runs")
    args = ap.parse_args(argv)
    targets = args.targets.split(",")
    for t in targets:
        if t.removesuffix("-base") not in TARGETS:
            ap.error(f"unknown target {t}")
    if any(t.endswith("-base") for t in targets) and not (args.baseline and os.path.exists(args.baseline)):
        ap.error("targets ending in -base need --baseline PATH (a latchkey binary)")
    return args


# --------------------------------------------------------------------------
# A quiet machine


WATCHED = ("k6", "vegeta", "wrk", "haproxy", "cargo", "rustc")


def others_running(own):
    """Other k6, vegeta, wrk, haproxy, cargo or rustc processes than ours (`own`,
    or our children). Reads /proc itself: a pgrep per name every half second
    would itself put fork/exec noise into the measured tails."""
    me = os.getpid()
    return [f"{pid} {name}" for pid, name in processes_named(WATCHED)
            if pid not in own and not stopped(pid) and parent_of(pid) != me]


def cpu_busy(seconds=2.0):
    """Share of all cores busy over `seconds` (our own processes are idle then)."""
    v0 = machine_jiffies()
    time.sleep(seconds)
    v1 = machine_jiffies()
    total = sum(v1) - sum(v0)
    idle = (v1[3] + v1[4]) - (v0[3] + v0[4])
    return 1 - idle / max(total, 1)


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


def measure(procs, label, fn, no_wait, attempts=3):
    """Runs `fn` on a quiet machine; again (up to `attempts`) if something else
    started meanwhile. The result says how many tries it took and whether the
    last one was still disturbed. (no_wait: once, at once; for profiles.)"""
    if no_wait:
        attempts = 1
    for attempt in range(1, attempts + 1):
        if not no_wait:
            wait_for_quiet(procs.pids())
        v0 = machine_jiffies()
        with Watch(procs.pids()) as w:
            result = fn()
        v1 = machine_jiffies()
        # steal: the time the hypervisor gave to other guests.
        result["steal"] = (v1[7] - v0[7]) / max(sum(v1) - sum(v0), 1)
        result["attempts"] = attempt
        result["disturbed"] = bool(w.seen)
        if not w.seen:
            return result
        say(f"{label}: disturbed by {w.seen[0][:80]}; measuring again")
    return result


# --------------------------------------------------------------------------
# The targets' configurations


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


HAPROXY_COMMON = """
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
"""

HAPROXY_UPSTREAM = """
backend upstream
    http-reuse always
    server up1 127.0.0.1:{upstream}
"""


def haproxy_cfg(port, upstream, pem):
    """HAProxy doing the gateway's job: jwt_verify (ES256), the same claim
    checks, a stick-table limit per subject and the same identity headers."""
    return HAPROXY_COMMON + f"""
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
""" + HAPROXY_UPSTREAM.format(upstream=upstream)


def haproxy_plain_cfg(port, upstream):
    """HAProxy proxying only (no JWT, no limit): the scale of the proxying itself."""
    return HAPROXY_COMMON + f"""
frontend plain
    bind 127.0.0.1:{port}
    default_backend upstream
""" + HAPROXY_UPSTREAM.format(upstream=upstream)


def forge(token):
    """The token with another subject and its original signature: a valid
    target refuses it."""
    header, payload, sig = token.split(".")
    claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    claims["sub"] = "someone-else"
    forged_payload = base64.urlsafe_b64encode(json.dumps(claims).encode()).decode().rstrip("=")
    return f"{header}.{forged_payload}.{sig}"


# --------------------------------------------------------------------------
# One measurement


def wrk_run(url, conns, secs, tokens, raw, label):
    return run_wrk(url, HERE / "tokens.lua", conns, secs, raw / f"wrk-{label}-c{conns}.txt",
                   env={**os.environ, "TOKENS_FILE": str(tokens)})


def k6_run(url, rate, secs, tokens, raw, label, tmp=None):
    """k6 constant-arrival-rate (loadtest/gateway/rate.js), in the units of the
    open-model rows."""
    r = run_k6(HERE / "rate.js", {"URL": url, "TOKENS_FILE": tokens, "RATE": rate, "DURATION": secs},
               summary=raw / f"k6-{label}.json", log=raw / f"k6-{label}.log", quiet=True,
               # Go's collector, left on, adds ~50 ms pauses to k6's own P99 here (see rate.js).
               extra_env={"GOGC": "off"})
    if not r["summary"]:
        raise RunError(f"k6 wrote no summary (exit {r['rc']}); see raw/k6-{label}.log")
    m = r["summary"]["metrics"]
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
        "generator_cores": r["cpu_seconds"] / secs,
    }


def vegeta_run(url, rate, secs, tokens, raw, label, tmp):
    return run_vegeta(url, rate, secs, tokens, raw / f"vegeta-{label}.json", tmp)


OPEN_MODEL = {"vegeta": vegeta_run, "k6": k6_run}


# --------------------------------------------------------------------------
# Main


def start_service(procs, latchkey, raw, tmp):
    """Redis and a latchkey service with 100 seeded accounts: (Redis URL,
    service URL, 100 tokens, the service's ES256 public key as a PEM file)."""
    redis_url = start_redis(procs, raw / "redis.log")
    svc_port = free_port()
    env = bench_env(tmp, listen=f"127.0.0.1:{svc_port}", admin_listen="off", signing_algorithm="ES256",
                    rate_limit="off", access_token_ttl_secs=7200)
    say("seeding 100 accounts")
    seed_users(latchkey, env, 100, password=SEED_PASSWORD)
    procs.start("service", [latchkey, "serve"], raw / "service.log", env=env)
    wait_port(svc_port)
    base = f"http://127.0.0.1:{svc_port}"
    tokens = [login_token(base, f"user{i}@loadtest.latchkey", SEED_PASSWORD) for i in range(1, 101)]
    _, jwks = http("GET", f"{base}/.well-known/jwks.json")
    # The set also holds the keys id_tokens may be signed with (RS256 among them).
    jwk = next((k for k in json.loads(jwks)["keys"] if k.get("alg") == "ES256"), None)
    if jwk is None:
        raise RunError(f"the service publishes no ES256 key: {jwks[:300]!r}")
    pem = os.path.join(tmp, "latchkey-es256.pem")
    with open(pem, "wb") as f:
        f.write(jwk_to_pem(jwk))
    return redis_url, base, tokens, pem


def start_target(procs, target, args, latchkey, up_port, base, redis_url, pem, raw, tmp):
    """Starts one target (the upstream itself needs nothing): its port."""
    port = up_port
    plain = target.removesuffix("-base")
    if target.startswith("gateway-"):
        port = free_port()
        cfg = os.path.join(tmp, f"{target}.toml")
        with open(cfg, "w") as f:
            f.write(gateway_toml(port, up_port, f"{base}/.well-known/jwks.json", redis_url, target.split("-")[1],
                                 "work-stealing" if plain.endswith("-ws") else "per-core",
                                 1 if plain.endswith("-1w") else None))
        shutil.copy(cfg, raw / f"{target}.toml")
        binary = args.baseline if target.endswith("-base") else latchkey
        procs.start(target, common.pinned_server([binary, "gateway", "--config", cfg]), raw / f"{target}.log")
    elif target.startswith("haproxy"):
        port = free_port()
        cfg = os.path.join(tmp, f"{target}.cfg")
        with open(cfg, "w") as f:
            f.write(haproxy_cfg(port, up_port, pem) if target == "haproxy" else haproxy_plain_cfg(port, up_port))
        shutil.copy(cfg, raw / f"{target}.cfg")
        procs.start(target, common.pinned_server(["haproxy", "-db", "-f", cfg]), raw / f"{target}.log")
    wait_port(port)
    return port


def prewarm(url, tokens_file, raw, label, secs):
    """A short wrk run just before a measurement, so that a target that sat
    idle while the others were measured starts its measured run warm
    (connections to the upstream open, caches filled, memory touched).
    It does not remove the host's own stalls: see docs/performance.md,
    "Stalls of the host under the open model"."""
    wrk_run(url, 10, secs, tokens_file, raw, f"{label}-prewarm")


def wrk_phase(args, procs, targets, urls, results, tokens_file, raw, redis_pid):
    conns_list = [int(c) for c in args.conns.split(",")]
    wrk_plan = [(rnd, t) for rnd in range(1, args.wrk_rounds + 1) for t in targets] if not args.no_wrk else []
    for rnd, target in wrk_plan:
        url, pid = urls[target], procs.items[target].pid
        for conns in conns_list:
            def one_wrk():
                # Every run, right before it: see prewarm().
                prewarm(url, tokens_file, raw, f"{target}-c{conns}-r{rnd}", 3 if rnd == 1 else 1)
                c0, r0 = cpu_seconds(pid), cpu_seconds(redis_pid)
                w = wrk_run(url, conns, args.wrk_secs, tokens_file, raw, target)
                w["cpu_us_per_req"] = (cpu_seconds(pid) - c0) * 1e6 / max(w["requests"], 1)
                w["redis_cpu_us_per_req"] = (cpu_seconds(redis_pid) - r0) * 1e6 / max(w["requests"], 1)
                return w

            w = measure(procs, f"{target} wrk c{conns} round {rnd}", one_wrk, args.no_wait)
            rounds = results[target].setdefault("wrk_rounds", {}).setdefault(conns, [])
            rounds.append(w)
            # The round with the median req/s stands for the target.
            results[target]["wrk"][conns] = sorted(rounds, key=lambda x: x["rps"])[(len(rounds) - 1) // 2]
            say(f"{target} wrk c{conns}: {w['rps']:.0f} req/s, p99 {w['latency_us']['p99'] / 1000:.2f} ms, "
                f"non-2xx {w['errors']['status']}, {w['cpu_us_per_req']:.1f} us CPU/req")


def perf_phase(args, procs, targets, urls, tokens_file, raw, outdir, command):
    """--perf: after the measured runs, one more wrk run of each target under
    `perf record` (loadtest/profile.py): flame-<target>.svg and profile.md,
    each target's own CPU per request by function beside the direct
    upstream's (the upstream's work in a proxied run is in another process,
    not in the target's profile)."""
    conns = int(args.conns.split(",")[0])
    profiles = {}
    for target in targets:
        def load():
            return wrk_run(urls[target], conns, args.wrk_secs, tokens_file, raw, f"{target}-perf")["requests"]
        profiles[target] = profile.record(procs.items[target].pid, args.wrk_secs, load, raw, outdir, target,
                                          f"latchkey gateway benchmark: {target}, wrk -c{conns}")
    (outdir / "profile.md").write_text(profile.table(profiles, command, [(t, "upstream") for t in targets
                                                                         if t != "upstream"]))


def open_phase(args, procs, targets, urls, results, tokens_file, raw, tmp):
    k6_targets = [t for t in args.k6_targets.split(",") if t in targets] if not args.no_k6 else []
    for gen in args.generators.split(",") if k6_targets else []:
        for rnd in range(1, args.k6_rounds + 1):
            for target in k6_targets:
                url, pid = urls[target], procs.items[target].pid

                def one_open():
                    prewarm(url, tokens_file, raw, f"{target}-{gen}-r{rnd}", 2)
                    c0 = cpu_seconds(pid)
                    k = OPEN_MODEL[gen](url, args.rate, args.k6_secs, tokens_file, raw, f"{target}-r{rnd}", tmp)
                    k["cpu_share"] = (cpu_seconds(pid) - c0) / args.k6_secs
                    return k

                k = measure(procs, f"{target} {gen} round {rnd}", one_open, args.no_wait)
                results[target]["open"].setdefault(gen, []).append(k)
                say(f"{target} {gen} {args.rate}/s round {rnd}: p50 {k['p50']:.2f} ms, p99 {k['p99']:.2f} ms, "
                    f"max {k['max']:.1f} ms, dropped {k['dropped']}, {gen} {k['generator_cores']:.2f} cores, "
                    f"steal {k['steal']:.0%}")


def main(argv):
    common.set_prog("gateway-bench")
    args = parse_args(argv)
    latchkey, _ = ensure_binary(args.binary, build=False)
    upstream = given_binary(args.upstream, "--upstream") if args.upstream else BENCH_UPSTREAM
    if not upstream.exists():
        raise RunError(f"{upstream} missing: cargo build --release --example bench_upstream (or --upstream PATH)")
    find_wrk()
    if args.perf:
        profile.require_tools()
    for tool in ("haproxy", "redis-server"):
        require(tool)
    for gen in ([] if args.no_k6 else args.generators.split(",")):
        if gen not in OPEN_MODEL:
            raise RunError(f"unknown generator {gen} (vegeta, k6)")
        if gen == "k6":
            find_k6()
        else:
            require(gen)
    common.apply_pinning(args)
    targets = args.targets.split(",")
    command = "scripts/loadtest gateway " + shlex.join(argv)

    results = {t: {"wrk": {}, "open": {}} for t in targets}
    with bench_workspace("gateway", args.out) as (started, outdir, raw, tmp, procs):
        redis_url, base, tokens, pem = start_service(procs, latchkey, raw, tmp)
        tokens_file = os.path.join(tmp, "tokens.txt")
        with open(tokens_file, "w") as f:
            f.write("\n".join(tokens) + "\n")
        forged = forge(tokens[0])

        # Every target runs from here on (idle ones cost nothing), so that the
        # open-model rounds can interleave them: noise on the machine then hits all alike.
        up_port = free_port()
        procs.start("upstream", common.pinned_server([upstream, f"127.0.0.1:{up_port}"]), raw / "upstream.log")
        wait_port(up_port)
        urls = {}
        for target in targets:
            port = start_target(procs, target, args, latchkey, up_port, base, redis_url, pem, raw, tmp)
            url = f"http://127.0.0.1:{port}/bench"
            ok, _ = http("GET", url, headers={"Authorization": f"Bearer {tokens[0]}"})
            bad, _ = http("GET", url, headers={"Authorization": f"Bearer {forged}"})
            say(f"{target}: valid token {ok}, forged token {bad}")
            if ok != 200 or (target not in ("upstream", "haproxy-plain") and bad != 401):
                raise RunError(f"{target} does not do the job (valid {ok}, forged {bad})")
            urls[target] = url
        wrk_phase(args, procs, targets, urls, results, tokens_file, raw, procs.items["redis"].pid)
        open_phase(args, procs, targets, urls, results, tokens_file, raw, tmp)
        if args.perf:
            perf_phase(args, procs, targets, urls, tokens_file, raw, outdir, command)

    finish(outdir, gateway_report(results, args, started, command), results)
    return 0
