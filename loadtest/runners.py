"""The load generators: one way to run k6, one to run wrk (and vegeta for
the gateway benchmark's open model). Every run's output goes to a log file;
a running generator is stopped by stop_children() on an interrupt."""

import json
import os
import re
import shlex
import subprocess
import sys
import time

from .common import ROOT, RunError, children_cpu, pinned_generator, say, wrk_threads
from .servers import stop_after
from .tools import find_k6, find_wrk, require

CHILDREN = []  # load-generator processes running now


def stop_children():
    for p in list(CHILDREN):
        stop_after(p, 15)


def _run(cmd, env, log, echo=False, sampler=None, label=""):
    """Runs a load generator to its end: its output to `log` (appended,
    after a `$ command` line) and, with `echo`, to stderr as it comes; with
    a Sampler, sampled as the generator under `label`. Returns (exit
    status, output, start and end time, CPU seconds it used)."""
    c0 = children_cpu()
    with open(log, "a") as f:
        f.write(f"$ {shlex.join(cmd)}\n")
        p = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                             bufsize=1, stdin=subprocess.DEVNULL)
        CHILDREN.append(p)
        if sampler:
            sampler.set_generator(p.pid, label)
        started = time.time()
        out = []
        try:
            for line in p.stdout:
                f.write(line)
                out.append(line)
                if echo:
                    sys.stderr.write(line)
            rc = p.wait()
        finally:
            CHILDREN.remove(p)
            if sampler:
                sampler.set_generator(None, "")
        ended = time.time()
        f.write("\n")
    return rc, "".join(out), started, ended, children_cpu() - c0


def run_k6(script, env_vars, summary, log, csv=None, quiet=False, echo=False, extra_env=None, sampler=None,
           announce=None):
    """k6 run SCRIPT with `-e KEY=VALUE` for each of `env_vars`, its
    --summary-export to `summary` (and every sample to `csv`, gzipped, when
    given); `announce`: a message to print with the command first. Returns
    the exit status, the command, the times, the summary (None when k6
    wrote none) and the CPU seconds k6 used."""
    cmd = [find_k6(), "run", "--summary-export", str(summary)]
    if csv:
        cmd += ["--out", f"csv={csv}"]
    if quiet:
        cmd.append("--quiet")
    for k, v in env_vars.items():
        cmd += ["-e", f"{k}={v}"]
    cmd = pinned_generator([*cmd, str(script)])
    env = dict(os.environ, K6_NO_USAGE_REPORT="true", **(extra_env or {}))
    if announce:
        say(f"{announce}: {shlex.join(cmd)}")
    rc, _, started, ended, cpu = _run(cmd, env, log, echo=echo, sampler=sampler, label="k6")
    try:
        with open(summary) as f:
            parsed = json.load(f)
    except (OSError, ValueError):
        parsed = None
    return {"rc": rc, "cmd": cmd, "env": env_vars, "started": started, "ended": ended, "summary": parsed,
            "cpu_seconds": cpu}


def run_wrk(url, script, connections, seconds, log, threads=None, env=None, sampler=None, label=""):
    """wrk --latency with a script of loadtest/ that prints `WRKJSON {...}` at
    its end: that object, plus `rps` and `generator_cores` (wrk's CPU).
    Threads: two, or one when pinned."""
    threads = threads or wrk_threads()
    cmd = pinned_generator([find_wrk(), f"-t{threads}", f"-c{connections}", f"-d{seconds}s", "--latency", "-s",
                            str(script), url])
    rc, out, _, _, cpu = _run(cmd, env or dict(os.environ), log, sampler=sampler, label=label)
    m = re.search(r"^WRKJSON (\{.*\})$", out, re.M)
    if rc != 0 or not m:
        raise RunError(f"wrk failed ({rc}):\n{out[-1500:]}")
    data = json.loads(m.group(1))
    secs = data["duration_us"] / 1e6
    data["rps"] = data["requests"] / secs if secs else 0
    data["generator_cores"] = cpu / secs if secs else 0
    return data


def run_vegeta(url, rate, secs, tokens, report, tmp):
    """vegeta attack at a constant rate (open model: a new worker per tick when
    all are busy, so a slow answer does not delay the next request), cycling
    through the tokens; its JSON report (also written to `report`) and the
    CPU it used, in the units of the gateway benchmark's open-model rows."""
    vegeta = require("vegeta")
    targets = os.path.join(tmp, "vegeta-targets.txt")
    with open(tokens) as f, open(targets, "w") as out:
        for t in (line.strip() for line in f):
            if t:
                out.write(f"GET {url}\nAuthorization: Bearer {t}\n\n")
    results = os.path.join(tmp, "vegeta-results.bin")
    c0 = children_cpu()
    with open(results, "wb") as f:
        subprocess.run(pinned_generator([vegeta, "attack", f"-rate={rate}/s", f"-duration={secs}s", f"-targets={targets}",
                        "-keepalive=true", "-max-body=0"]), stdout=f, stderr=subprocess.PIPE, check=True,
                       # As for k6: Go's collector puts its pauses into the measured tail
                       # (direct upstream P99 2.0 ms with it, 0.7 ms without); ~2 GB per minute.
                       env={**os.environ, "GOGC": "off"})
    generator = (children_cpu() - c0) / secs
    rep = subprocess.run([vegeta, "report", "-type=json", results], capture_output=True, text=True, check=True)
    with open(report, "w") as f:
        f.write(rep.stdout)
    j = json.loads(rep.stdout)
    lat = j["latencies"]
    os.remove(results)
    return {
        "requests": j["requests"],
        "rps": j["throughput"],
        "failed": 1 - j["success"],
        # Ticks vegeta could not send on time would show as fewer requests than planned.
        "dropped": max(0, rate * secs - j["requests"]),
        "p50": lat["50th"] / 1e6,
        "p90": lat["90th"] / 1e6,
        "p99": lat["99th"] / 1e6,
        "max": lat["max"] / 1e6,
        "generator_cores": generator,
        "codes": j.get("status_codes", {}),
    }
