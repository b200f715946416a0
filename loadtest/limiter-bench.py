#!/usr/bin/env python3
"""What a rate limit costs (issue 6): `GET /auth/validate` unlimited against
the same endpoint with a per-client-IP limit checked on every request, on the
Redis limiter and on the in-process one, with one client, 1,000 clients and
100,000 clients.

Usage (from the repository root, after `cargo build --release`):
  loadtest/limiter-bench.py [--secs 15] [--rounds 3] [--conns 50] [--clients 1,1000,100000]

What it does, in a temporary directory removed at the end:
- starts its own redis-server on a free loopback port;
- starts three release servers on one SQLite file (same keys, so one token
  validates on all): `unlimited` (Redis configured, `rate_limit_validate`
  off), `redis` (`rate_limit_validate=1000000000/60`: a check on every
  request, never a refusal) and `local` (the same limit, no Redis: the
  in-process buckets). All trust 127.0.0.1 as a proxy, so that the client
  address is the `X-Forwarded-For` that wrk sends;
- wrk -t2 (loadtest/wrk/clients.lua) cycles through N client addresses: N=1
  is one hot key (the Redis limiter takes leases), N=100,000 at ~50,000
  req/s is each key every ~2 s (cold: one EVALSHA round trip per request).
  Every variant, the unlimited one included, sends the same requests;
- rounds interleave the variants so that noise hits all alike; per variant
  the median over rounds, and "lost" against the unlimited run of the same
  round and client count;
- prints a Markdown report and writes it, with the raw wrk outputs, to
  loadtest/results/<UTC date-time>-limiter/.
"""

import argparse
import datetime as dt
import json
import os
import platform
import re
import secrets
import base64
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LATCHKEY = os.path.join(ROOT, "target", "release", "latchkey")
LUA = os.path.join(ROOT, "loadtest", "wrk", "clients.lua")


def say(msg):
    print(f"[limiter-bench] {msg}", file=sys.stderr, flush=True)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_http(url, timeout=20):
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=1) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.05)
    raise SystemExit(f"{url} did not answer")


def post(url, body):
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                 headers={"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as r:
        return json.loads(r.read())


def cpu_seconds(pid):
    with open(f"/proc/{pid}/stat") as f:
        rest = f.read().rsplit(")", 1)[1].split()
    return (int(rest[11]) + int(rest[12])) / os.sysconf("SC_CLK_TCK")


def wrk(url, token, clients, conns, secs, raw, label):
    out = subprocess.run(
        ["wrk", "-t2", f"-c{conns}", f"-d{secs}s", "--latency", "-s", LUA, url],
        capture_output=True, text=True,
        env={**os.environ, "LATCHKEY_TOKEN": token, "CLIENTS": str(clients)},
    )
    with open(os.path.join(raw, f"wrk-{label}.txt"), "w") as f:
        f.write(out.stdout + out.stderr)
    m = re.search(r"^WRKJSON (.*)$", out.stdout, re.M)
    if not m:
        raise SystemExit(f"wrk printed no summary: {out.stdout} {out.stderr}")
    j = json.loads(m.group(1))
    j["rps"] = j["requests"] / (j["duration_us"] / 1e6)
    return j


def metric(base, name):
    with urllib.request.urlopen(f"{base}/metrics", timeout=5) as r:
        text = r.read().decode()
    return sum(float(l.rsplit(" ", 1)[1]) for l in text.splitlines() if l.startswith(name))


def median(xs):
    xs = sorted(xs)
    n = len(xs)
    return (xs[n // 2] + xs[(n - 1) // 2]) / 2 if xs else float("nan")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--secs", type=int, default=15)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--conns", type=int, default=50)
    ap.add_argument("--clients", default="1,1000,100000")
    args = ap.parse_args()
    for tool in ("wrk", "redis-server"):
        if not shutil.which(tool):
            raise SystemExit(f"{tool} is not installed (apt-get install -y {tool.replace('-server', '-server')})")
    if not os.path.exists(LATCHKEY):
        raise SystemExit(f"{LATCHKEY} missing: cargo build --release")
    clients = [int(c) for c in args.clients.split(",")]
    started = dt.datetime.now(dt.timezone.utc)
    out_dir = os.path.join(ROOT, "loadtest", "results", started.strftime("%Y-%m-%d-%H%M") + "-limiter")
    raw = os.path.join(out_dir, "raw")
    os.makedirs(raw, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix="latchkey-limbench-")
    procs = []
    try:
        redis_port = free_port()
        procs.append(subprocess.Popen(
            ["redis-server", "--bind", "127.0.0.1", "--port", str(redis_port), "--save", "", "--appendonly", "no"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        redis_pid = procs[-1].pid
        common = {
            **{k: v for k, v in os.environ.items() if not k.startswith("LATCHKEY_")},
            "LATCHKEY_DATA_DIR": os.path.join(tmp, "data"),
            "LATCHKEY_SECRET_KEY": base64.b64encode(secrets.token_bytes(32)).decode(),
            "LATCHKEY_LOG": "warn",
            "LATCHKEY_MAIL": f"file:{os.path.join(tmp, 'mail')}",
            "LATCHKEY_TRUSTED_PROXIES": "127.0.0.1",
            "LATCHKEY_ISSUER": "http://latchkey.bench",
        }
        subprocess.run([LATCHKEY, "users", "seed", "--count", "1", "--password", "loadtest-password"],
                       env=common, check=True, capture_output=True)
        servers = {}
        limit = "1000000000/60"
        for name, extra in (
            ("unlimited", {"LATCHKEY_REDIS_URL": f"redis://127.0.0.1:{redis_port}", "LATCHKEY_RATE_LIMIT_VALIDATE": "off"}),
            ("redis", {"LATCHKEY_REDIS_URL": f"redis://127.0.0.1:{redis_port}", "LATCHKEY_RATE_LIMIT_VALIDATE": limit}),
            ("local", {"LATCHKEY_RATE_LIMIT_VALIDATE": limit}),
        ):
            port, admin = free_port(), free_port()
            env = {**common, **extra, "LATCHKEY_LISTEN": f"127.0.0.1:{port}",
                   "LATCHKEY_ADMIN_LISTEN": f"127.0.0.1:{admin}"}
            log = open(os.path.join(raw, f"server-{name}.log"), "w")
            procs.append(subprocess.Popen([LATCHKEY, "serve"], env=env, stdout=log, stderr=subprocess.STDOUT))
            base = f"http://127.0.0.1:{port}"
            wait_http(f"{base}/health/live")
            servers[name] = (base, procs[-1].pid, f"http://127.0.0.1:{admin}")
        token = post(f"{servers['unlimited'][0]}/auth/login",
                     {"email": "user1@loadtest.latchkey", "password": "loadtest-password"})["access_token"]
        for name, (base, _, _) in servers.items():
            with urllib.request.urlopen(urllib.request.Request(
                    f"{base}/auth/validate", headers={"Authorization": f"Bearer {token}"}), timeout=5) as r:
                assert r.status == 200, (name, r.status)
            wrk(f"{base}/auth/validate", token, 1000, args.conns, 3, raw, f"{name}-warmup")
        results = {}
        for rnd in range(1, args.rounds + 1):
            for n in clients:
                for name, (base, pid, admin) in servers.items():
                    c0, r0 = cpu_seconds(pid), cpu_seconds(redis_pid)
                    calls0 = metric(admin, 'latchkey_redis_command_seconds_count{op="ratelimit"}')
                    w = wrk(f"{base}/auth/validate", token, n, args.conns, args.secs, raw, f"{name}-n{n}-r{rnd}")
                    req = max(w["requests"], 1)
                    w["cpu_us"] = (cpu_seconds(pid) - c0) * 1e6 / req
                    w["redis_us"] = (cpu_seconds(redis_pid) - r0) * 1e6 / req
                    w["redis_calls_per_req"] = (metric(admin, 'latchkey_redis_command_seconds_count{op="ratelimit"}')
                                                - calls0) / req
                    results.setdefault((name, n), []).append(w)
                    say(f"round {rnd}, {n} clients, {name}: {w['rps']:,.0f} req/s, "
                        f"P99 {w['latency_us']['p99'] / 1000:.2f} ms, non-2xx {w['errors']['status']}, "
                        f"{w['cpu_us']:.1f} us CPU/req, Redis calls/req {w['redis_calls_per_req']:.3f}")
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
        shutil.rmtree(tmp, ignore_errors=True)

    cpu = re.search(r"model name\s*:\s*(.*)", open("/proc/cpuinfo").read()).group(1)
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    rev = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    lines = [
        f"# Rate-limit cost: {started.strftime('%Y-%m-%d %H:%M')} UTC",
        "",
        f"git {rev} (+ working tree), {os.cpu_count()} cores ({cpu}), {mem:.0f} GiB, Linux {platform.release()}; "
        "wrk, the servers and Redis on the same machine.",
        f"Command: `loadtest/limiter-bench.py {' '.join(sys.argv[1:])}`; wrk -t2 -c{args.conns}, {args.secs} s per cell, "
        f"{args.rounds} rounds interleaved; medians (each round's req/s in brackets).",
        "",
        "| clients | unlimited req/s | Redis-limited req/s | lost | Redis calls per request | in-process-limited req/s | lost | P99 ms (unlimited / Redis / in-process) |",
        "|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for n in clients:
        u, r, l = (results[(name, n)] for name in ("unlimited", "redis", "local"))
        lost = lambda xs: median([1 - x["rps"] / b["rps"] for x, b in zip(xs, u)])
        fmt = lambda xs: f"{median([x['rps'] for x in xs]):,.0f} [" + ", ".join(f"{x['rps'] / 1000:.1f}k" for x in xs) + "]"
        bad = sum(x["errors"]["status"] for x in u + r + l)
        p99 = " / ".join(f"{median([x['latency_us']['p99'] for x in xs]) / 1000:.2f}" for xs in (u, r, l))
        lines.append(f"| {n:,} | {fmt(u)} | {fmt(r)} | {lost(r):.1%} | "
                     f"{median([x['redis_calls_per_req'] for x in r]):.3f} | {fmt(l)} | {lost(l):.1%} | {p99} |"
                     + (f" ({bad} non-2xx!)" if bad else ""))
    lines.append("")
    report = "\n".join(lines) + "\n"
    with open(os.path.join(out_dir, "report.md"), "w") as f:
        f.write(report)
    with open(os.path.join(out_dir, "summary.json"), "w") as f:
        json.dump({f"{k[0]}-{k[1]}": v for k, v in results.items()}, f, indent=2)
    print(report)


if __name__ == "__main__":
    main()
