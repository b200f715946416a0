"""Scaling figures on the rig (loadtest/rig.py): token validation and the
credential-cache login path through HAProxy with 1, 2 and 3 instances
(wrk -t2 -c50, interleaved rounds, medians), one instance without HAProxy
as the reference, the CPU each part spent per request, and the database
and Redis round trips of every request type (from the latchkey_db_* and
latchkey_redis_* metrics), which is what docs/deploy.md's capacity model
is built on.

Everything shares this machine's cores: the instances, HAProxy, PostgreSQL,
Redis and wrk itself. More instances on the same cores cannot add capacity;
what the run shows is the cost of the balancer and of spreading the load,
and the CPU per request that sizes a larger deployment on paper.

scripts/loadtest scaling [--seconds 8] [--rounds 3]"""

import argparse
import json
import os
import resource
import statistics
import time

from .common import (ROOT, RunError, cpu_seconds, git_revision, http, login_token, machine_info, metric_total,
                     proc_tree, result_dir, say, set_prog, utc_now)
from .rig import Rig
from .runners import run_wrk
from .servers import SEED_PASSWORD, seed_users
from .tools import ensure_binary

ACCOUNTS = 100
WRK = ROOT / "loadtest" / "wrk"


def round_trips(inst, do, n):
    """(database operations, Redis commands) per call of `do`, on `inst`."""
    def snapshot():
        _, text = http("GET", f"{inst.admin}/metrics", timeout=5)
        text = text.decode()
        return (metric_total(text, "latchkey_db_query_seconds_count") or 0.0,
                metric_total(text, "latchkey_redis_command_seconds_count") or 0.0)
    db0, r0 = snapshot()
    for i in range(n):
        do(i)
    time.sleep(0.3)  # work a response does not wait for (events, mail) is counted too
    db1, r1 = snapshot()
    return (db1 - db0) / n, (r1 - r0) / n


def cpu_of(rig):
    parts = {"latchkey": sum(cpu_seconds(i.proc.pid) for i in rig.instances),
             "haproxy": cpu_seconds(rig.lb.proc.pid)}
    pg_pid = int((rig.pg.data / "postmaster.pid").read_text().split()[0])
    parts["postgres"] = sum(cpu_seconds(p) for p in proc_tree(pg_pid))
    parts["redis"] = sum(cpu_seconds(p.pid) for p in rig.redis.procs.values())
    return parts


def measure(rig, label, url, script, seconds, raw, env):
    before = cpu_of(rig)
    data = run_wrk(url, script, 50, seconds, raw / f"wrk-{label}.log", env=env)
    after = cpu_of(rig)
    n = max(1, data["requests"])
    return {"rps": data["rps"], "p50_ms": data["latency_us"]["p50"] / 1000, "p99_ms": data["latency_us"]["p99"] / 1000,
            "errors": sum(data["errors"].values()),
            "cpu_us_per_request": {k: (after[k] - before[k]) * 1e6 / n for k in after}}


def main(argv):
    set_prog("scaling")
    ap = argparse.ArgumentParser(prog="scripts/loadtest scaling", description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--binary")
    ap.add_argument("--out")
    a = ap.parse_args(argv)
    binary, _ = ensure_binary(a.binary)
    started = utc_now()
    outdir = result_dir(started, "scaling", a.out)
    raw = outdir / "raw"
    rig = Rig(binary, instances=3, settings={"rate_limit": "off"})
    try:
        say("starting the rig (rate limits off: one address drives all the load)")
        rig.start()
        env0 = rig.instances[0].env()
        # The seed hashes every password with argon2id at the service's
        # parameters: its CPU per account is the cost of one hash.
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        seed_users(binary, env0, ACCOUNTS, cwd=rig.instances[0].dir)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        hash_ms = ((after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)) * 1000 / ACCOUNTS
        # Every instance verifies every account once: its credential cache is warm.
        for inst in rig.instances:
            for i in range(1, ACCOUNTS + 1):
                status, _ = http("POST", f"{inst.base}/auth/login",
                                 {"email": f"user{i}@loadtest.latchkey", "password": SEED_PASSWORD})
                if status != 200:
                    raise RunError(f"warming login of user{i} on instance {inst.i}: {status}")
        token = login_token(rig.base, password=SEED_PASSWORD)
        wenv = dict(os.environ, LATCHKEY_TOKEN=token, LATCHKEY_ACCOUNTS=str(ACCOUNTS),
                    LATCHKEY_PASSWORD=SEED_PASSWORD)
        results = {}
        for r in range(a.rounds):
            for k in (1, 2, 3, 0):  # 0: one instance, no HAProxy
                if k:
                    rig.lb.restart(servers=k)
                base = rig.base if k else rig.instances[0].base
                for what, script, path in (("validate", WRK / "validate.lua", "/auth/validate"),
                                           ("login", WRK / "login.lua", "/auth/login")):
                    label = f"{what}-{k or 'direct'}"
                    say(f"round {r + 1}: {label}")
                    results.setdefault(label, []).append(measure(rig, label, base + path, script, a.seconds, raw,
                                                                 wenv))
        rig.lb.restart(servers=3)

        # Round trips per request type, on instance 0 directly.
        inst = rig.instances[0]
        b = inst.base
        trips = {}
        emails = [f"trips{i}-{int(time.time())}@loadtest.latchkey" for i in range(20)]
        trips["register"] = round_trips(inst, lambda i: http("POST", f"{b}/auth/register",
                                                             {"email": emails[i], "password": SEED_PASSWORD}), 20)
        trips["login (credential cache warm)"] = round_trips(inst, lambda i: http(
            "POST", f"{b}/auth/login", {"email": f"user{i + 1}@loadtest.latchkey", "password": SEED_PASSWORD}), 20)
        pairs = [json.loads(http("POST", f"{b}/auth/login", {"email": f"user{i + 1}@loadtest.latchkey",
                                                             "password": SEED_PASSWORD})[1]) for i in range(20)]
        trips["validate"] = round_trips(inst, lambda i: http("GET", f"{b}/auth/validate",
                                                             headers={"authorization": f"Bearer {token}"}), 20)
        fresh = []
        trips["refresh"] = round_trips(inst, lambda i: fresh.append(json.loads(http(
            "POST", f"{b}/auth/refresh", {"refresh_token": pairs[i]["refresh_token"]})[1])), 20)
        trips["logout"] = round_trips(inst, lambda i: http("POST", f"{b}/auth/logout",
                                                           {"refresh_token": fresh[i]["refresh_token"]}), 20)
        summary = {k: {m: statistics.median(x[m] for x in v) for m in ("rps", "p50_ms", "p99_ms")}
                   | {"cpu_us_per_request": {p: statistics.median(x["cpu_us_per_request"][p] for x in v)
                                             for p in v[0]["cpu_us_per_request"]},
                      "errors": sum(x["errors"] for x in v), "rounds": [round(x["rps"]) for x in v]}
                   for k, v in results.items()}
        doc = {"started": started.isoformat(), "machine": machine_info(), "revision": git_revision(),
               "seconds": a.seconds, "rounds": a.rounds, "throughput": summary,
               "argon2id_cpu_ms_per_hash": round(hash_ms, 1),
               "round_trips": {k: {"db": round(v[0], 2), "redis": round(v[1], 2)} for k, v in trips.items()}}
        (outdir / "summary.json").write_text(json.dumps(doc, indent=2))
        text = render(doc, a)
        (outdir / "report.md").write_text(text)
        print(text)
        say(f"report: {outdir / 'report.md'}")
        return 0
    finally:
        rig.stop(keep_logs=raw / "rig")


def render(doc, a):
    m = doc["machine"]
    lines = [f"# Scaling on the rig, {doc['started'][:16].replace('T', ' ')} UTC", "",
             f"Command: `scripts/loadtest scaling --seconds {a.seconds} --rounds {a.rounds}`  ",
             f"Machine: {m['nproc']} CPU ({m['cpu']}), {m['ram_gib']:.0f} GiB, Linux {m['kernel']}  ",
             f"Revision: {doc['revision']}  ",
             "wrk -t2 -c50 for each cell, the cells interleaved round by round, medians of "
             f"{a.rounds} rounds; rate limits off; {ACCOUNTS} accounts whose passwords every instance "
             "has verified once (the login path is the credential cache's: no argon2).", "",
             "| path | instances | req/s (median) | rounds | P50 ms | P99 ms | errors | CPU us/request: latchkey / "
             "HAProxy / PostgreSQL / Redis |", "|---|---|---:|---|---:|---:|---:|---|"]
    for key, v in doc["throughput"].items():
        what, k = key.split("-")
        c = v["cpu_us_per_request"]
        lines.append(f"| {what} | {k if k != 'direct' else '1, no HAProxy'} | {v['rps']:,.0f} | "
                     f"{', '.join(f'{x:,}' for x in v['rounds'])} | {v['p50_ms']:.2f} | {v['p99_ms']:.2f} | "
                     f"{v['errors']} | {c['latchkey']:.0f} / {c['haproxy']:.0f} / {c['postgres']:.0f} / "
                     f"{c['redis']:.0f} |")
    lines += ["", "Round trips per request (one instance, rate limits off; PostgreSQL operations, each "
              "one statement or one short transaction, from latchkey_db_query_seconds_count, Redis commands from latchkey_redis_command_seconds_count, "
              "background work of the request included):", "", "| request | PostgreSQL | Redis |", "|---|---:|---:|"]
    for k, v in doc["round_trips"].items():
        lines.append(f"| {k} | {v['db']} | {v['redis']} |")
    lines += ["", f"One argon2id hash (m=19456 KiB, t=2, p=1) cost {doc['argon2id_cpu_ms_per_hash']} ms of CPU "
              f"(`latchkey users seed --count {ACCOUNTS}`: its CPU time over the accounts)."]
    return "\n".join(lines) + "\n"
