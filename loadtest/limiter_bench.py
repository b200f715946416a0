"""What a rate limit costs: `GET /auth/validate` unlimited against the same
endpoint with a per-client-IP limit checked on every request, on the Redis
limiter and on the in-process one, with one client, 1,000 clients and
100,000 clients.

Usage (from the repository root, after `cargo build --release`):
  scripts/loadtest limiter [--secs 15] [--rounds 3] [--conns 50] [--clients 1,1000,100000]
                           [--binary PATH] [--compare OTHER_LATCHKEY_BINARY] [--perf]

What it does, in a temporary directory removed at the end:
- starts its own redis-server on a free loopback port;
- starts three release servers on one SQLite file (same keys, so one token
  validates on all): `unlimited` (Redis configured, `rate_limit_validate`
  off), `redis` (`rate_limit_validate=1000000000/60`: a check on every
  request, never a refusal) and `local` (the same limit, no Redis: the
  in-process buckets). All trust 127.0.0.1 as a proxy, so that the client
  address is the `X-Forwarded-For` that wrk sends. With --compare, a fourth
  server, `redis-other`: the other build, Redis-limited like `redis`, in the
  same rounds (a before/after within one run, on its own Redis key prefix);
- wrk -t2 (one thread with --pin; loadtest/wrk/clients.lua) cycles through N client addresses: N=1
  is one hot key (the Redis limiter takes leases), N=100,000 at ~50,000
  req/s is each key every ~2 s (cold: a key's first check, and each after
  its lease expired, asks Redis; such checks share script calls). "Redis
  calls per request" counts script calls, each for one or more buckets.
  Every variant, the unlimited one included, sends the same requests;
- rounds interleave the variants so that noise hits all alike; per variant
  the median over rounds, and "lost" against the unlimited run of the same
  round and client count;
- --pin: the latchkey servers on the first CPU this process may use, wrk
  (one thread) on the second (taskset); Redis is not pinned;
- --perf: after the rounds, one more run of each variant at the largest
  client count under `perf record` (loadtest/profile.py): flame-<variant>.svg
  and profile.md (CPU per request by function, side by side);
- prints a Markdown report and writes it, with the raw wrk outputs, to
  loadtest/results/<UTC date-time>-limiter/.
"""

import argparse
import os
import shlex

from . import common, profile
from .common import ROOT, RunError, cpu_seconds, free_port, http, login_token, metric_total, say, wait_until
from .report import finish, limiter_report
from .runners import run_wrk
from .servers import SEED_PASSWORD, bench_env, bench_workspace, seed_users, start_redis
from .tools import ensure_binary, find_wrk, require

LUA = ROOT / "loadtest" / "wrk" / "clients.lua"
LIMIT = "1000000000/60"  # a check on every request, never a refusal
RATELIMIT_CALLS = 'latchkey_redis_command_seconds_count{op="ratelimit"}'
ALLOWED = 'latchkey_ratelimit_allowed_total{policy="validate"}'
LEASED = 'latchkey_ratelimit_leased_total{policy="validate"}'


def parse_args(argv):
    ap = argparse.ArgumentParser(prog="scripts/loadtest limiter", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--secs", type=int, default=15, help="seconds per wrk run (default 15)")
    ap.add_argument("--rounds", type=int, default=3, help="rounds over the variants, interleaved (default 3)")
    ap.add_argument("--conns", type=int, default=50, help="wrk connections (default 50)")
    ap.add_argument("--clients", default="1,1000,100000",
                    help="numbers of client addresses, comma-separated (default 1,1000,100000)")
    ap.add_argument("--out", help="result folder (default loadtest/results/<YYYY-MM-DD-HHMM>-limiter)")
    ap.add_argument("--binary",
                    help="the latchkey binary to measure (default: $LATCHKEY_BIN, else target/release/latchkey)")
    ap.add_argument("--compare", help="another latchkey binary, Redis-limited, measured in the same rounds "
                                      "(variant redis-other)")
    ap.add_argument("--perf", action="store_true",
                    help="after the rounds, profile each variant once more at the largest client count: "
                         "flame graphs and profile.md")
    common.add_pin_option(ap, help="the servers on CPU 0, wrk on CPU 1 (one thread)")
    return ap.parse_args(argv)


def wrk(url, token, clients, conns, secs, raw, label):
    return run_wrk(url, LUA, conns, secs, raw / f"wrk-{label}.txt",
                   env={**os.environ, "LATCHKEY_TOKEN": token, "CLIENTS": str(clients)})


def ratelimit_counts(admin):
    """(script calls, checks that waited for Redis) so far: a check that
    waited is one allowed without a lease (the limit never refuses here)."""
    _, body = http("GET", f"{admin}/metrics", timeout=5)
    text = body.decode()
    allowed = metric_total(text, ALLOWED) or 0.0
    leased = metric_total(text, LEASED) or 0.0
    return metric_total(text, RATELIMIT_CALLS) or 0.0, allowed - leased


def start_servers(procs, latchkey, redis_url, raw, tmp, other=None):
    """The variants on one SQLite file: {name: (URL, pid, admin URL)}."""
    env = bench_env(tmp, mail=f"file:{os.path.join(tmp, 'mail')}", trusted_proxies="127.0.0.1")
    seed_users(latchkey, env, 1, password=SEED_PASSWORD)
    servers = {}
    variants = [
        ("unlimited", latchkey, {"LATCHKEY_REDIS_URL": redis_url, "LATCHKEY_RATE_LIMIT_VALIDATE": "off"}),
        ("redis", latchkey, {"LATCHKEY_REDIS_URL": redis_url, "LATCHKEY_RATE_LIMIT_VALIDATE": LIMIT}),
        ("local", latchkey, {"LATCHKEY_RATE_LIMIT_VALIDATE": LIMIT}),
    ]
    if other:
        variants.append(("redis-other", other, {"LATCHKEY_REDIS_URL": redis_url, "LATCHKEY_RATE_LIMIT_VALIDATE": LIMIT,
                                                "LATCHKEY_REDIS_KEY_PREFIX": "other:"}))
    for name, binary, extra in variants:
        port, admin = free_port(), free_port()
        # "server-" keeps the names apart from the Redis server's ("redis").
        p = procs.start(f"server-{name}", common.pinned_server([binary, "serve"]), raw / f"server-{name}.log",
                        env={**env, **extra, "LATCHKEY_LISTEN": f"127.0.0.1:{port}",
                             "LATCHKEY_ADMIN_LISTEN": f"127.0.0.1:{admin}"})
        base = f"http://127.0.0.1:{port}"
        wait_until(lambda: http("GET", f"{base}/health/live", timeout=1)[0] == 200, f"{name}: {base}", proc=p)
        servers[name] = (base, p.pid, f"http://127.0.0.1:{admin}")
    return servers


def main(argv):
    common.set_prog("limiter-bench")
    args = parse_args(argv)
    common.apply_pinning(args)
    latchkey, _ = ensure_binary(args.binary, build=False)
    find_wrk()
    require("redis-server")
    if args.perf:
        profile.require_tools()
    clients = [int(c) for c in args.clients.split(",")]
    command = "scripts/loadtest limiter " + shlex.join(argv)
    results = {}
    with bench_workspace("limiter", args.out) as (started, outdir, raw, tmp, procs):
        redis_url = start_redis(procs, raw / "redis.log")
        redis_pid = procs.items["redis"].pid
        other = ensure_binary(args.compare, build=False)[0] if args.compare else None
        servers = start_servers(procs, latchkey, redis_url, raw, tmp, other)
        token = login_token(servers["unlimited"][0], password=SEED_PASSWORD)
        for name, (base, _, _) in servers.items():
            status, _ = http("GET", f"{base}/auth/validate", headers={"Authorization": f"Bearer {token}"}, timeout=5)
            if status != 200:
                raise RunError(f"{name}: /auth/validate answered {status} to a fresh token")
            wrk(f"{base}/auth/validate", token, 1000, args.conns, 3, raw, f"{name}-warmup")
        for rnd in range(1, args.rounds + 1):
            for n in clients:
                for name, (base, pid, admin) in servers.items():
                    c0, r0 = cpu_seconds(pid), cpu_seconds(redis_pid)
                    calls0, waited0 = ratelimit_counts(admin)
                    w = wrk(f"{base}/auth/validate", token, n, args.conns, args.secs, raw, f"{name}-n{n}-r{rnd}")
                    req = max(w["requests"], 1)
                    w["cpu_us"] = (cpu_seconds(pid) - c0) * 1e6 / req
                    w["redis_us"] = (cpu_seconds(redis_pid) - r0) * 1e6 / req
                    calls1, waited1 = ratelimit_counts(admin)
                    w["redis_calls_per_req"] = (calls1 - calls0) / req
                    w["waited_per_req"] = (waited1 - waited0) / req if name.startswith("redis") else 0.0
                    results.setdefault((name, n), []).append(w)
                    say(f"round {rnd}, {n} clients, {name}: {w['rps']:,.0f} req/s, "
                        f"P99 {w['latency_us']['p99'] / 1000:.2f} ms, non-2xx {w['errors']['status']}, "
                        f"{w['cpu_us']:.1f} us CPU/req, Redis calls/req {w['redis_calls_per_req']:.3f}, "
                        f"waited for Redis/req {w['waited_per_req']:.3f}")
        if args.perf:
            n = max(clients)
            profiles = {}
            for name, (base, pid, _) in servers.items():
                def load():
                    return wrk(f"{base}/auth/validate", token, n, args.conns, args.secs, raw,
                               f"{name}-n{n}-perf")["requests"]
                profiles[name] = profile.record(pid, args.secs, load, raw, outdir, name,
                                                f"latchkey limiter benchmark: {name}, {n:,} clients")
            (outdir / "profile.md").write_text(profile.table(
                profiles, command, [("redis", "unlimited"), ("redis-other", "redis"), ("local", "unlimited")]))

    finish(outdir, limiter_report(results, args, clients, started, command),
           {f"{k[0]}-{k[1]}": v for k, v in results.items()})
    return 0
