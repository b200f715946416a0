"""What every scenario family uses: paths, messages, ports, HTTP, statistics,
/proc readings (CPU, RSS, process trees, other processes), the machine and
git revision a report names, and the result folder of a run."""

import csv
import datetime as dt
import json
import math
import os
import re
import shutil
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "loadtest" / "results"

PROG = "loadtest"  # the prefix of messages; each family names itself (set_prog)


class RunError(Exception):
    """The run could not be carried out (not a failed threshold): exit 3."""


# Pinning (`--pin` of overhead, refresh-capacity, limiter, gateway and the
# k6 scenarios): the servers under test on one CPU, the load generator on
# the other, so that the generator's work never counts against a server,
# and every server (the bare handler too) has one core. Off unless
# set_pinning() is called.
PINNING = None


def set_pinning():
    """The servers on the first CPU this process may use, the generator on
    the second."""
    global PINNING
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        raise RunError("--pin needs two CPUs: one for the servers, one for the generator")
    if not shutil.which("taskset"):
        raise RunError("--pin needs taskset (Debian: util-linux)")
    PINNING = (str(cpus[0]), str(cpus[1]))


def add_pin_option(parser, help):
    """A scenario's `--pin` flag (`help` says what runs where);
    apply_pinning() acts on it."""
    parser.add_argument("--pin", action="store_true", help=help)


def apply_pinning(args):
    """set_pinning() when `--pin` was given. A gate (`--gate`) refuses it:
    its floors were set from unpinned runs (two wrk threads, k6 unpinned on
    the shared cores), and pinned figures read otherwise."""
    if not args.pin:
        return
    if getattr(args, "gate", False):
        raise RunError("--gate measures unpinned: leave out --pin")
    set_pinning()


def pinned_server(cmd):
    """`cmd` run on the servers' CPU when pinning, else as it is."""
    return ["taskset", "-c", PINNING[0], *map(str, cmd)] if PINNING else list(cmd)


def pinned_generator(cmd):
    """`cmd` run on the generator's CPU when pinning, else as it is."""
    return ["taskset", "-c", PINNING[1], *map(str, cmd)] if PINNING else list(cmd)


def wrk_threads():
    """wrk's threads: one when pinned (the generator has one CPU), else two."""
    return 1 if PINNING else 2


def pinning_note():
    if PINNING:
        return (f"Pinned: the servers under test on CPU {PINNING[0]}, the generator on CPU {PINNING[1]} "
                "(taskset); the databases and Redis are not pinned.")
    return "Not pinned: the servers and the generator share the machine's cores."


def set_prog(name):
    global PROG
    PROG = name


def say(msg):
    print(f"{PROG}: {msg}", file=sys.stderr, flush=True)


def rel(path):
    """A path as shown to people: relative to the repository when inside it."""
    path = Path(path).resolve()
    try:
        return str(path.relative_to(ROOT))
    except ValueError:
        return str(path)


# --------------------------------------------------------------------------
# Ports and HTTP


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until(ready, what, timeout=20, interval=0.05, proc=None):
    """Polls `ready()` until it is true; a RunError after `timeout` seconds or
    as soon as `proc` (the process that should answer) has exited."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RunError(f"{what}: the process exited with {proc.returncode}")
        try:
            if ready():
                return
        except (OSError, urllib.error.URLError):
            pass
        time.sleep(interval)
    raise RunError(f"{what}: not ready after {timeout} s")


def wait_port(port, timeout=20):
    def listens():
        with socket.create_connection(("127.0.0.1", port), timeout=0.2):
            return True

    wait_until(listens, f"nothing listens on {port}", timeout)


# Never through a proxy named by http_proxy: every run talks to loopback
# servers, with passwords and tokens in its requests.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def http(method, url, body=None, headers=None, timeout=10.0):
    """(status, body bytes); an HTTP error status is an answer, not an exception."""
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method, headers=headers or {})
    if data is not None:
        req.add_header("Content-Type", "application/json")
    try:
        with _OPENER.open(req, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def login_token(base_url, email="user1@loadtest.latchkey", password="loadtest-password"):
    """An access token of a seeded account (`latchkey users seed`)."""
    status, body = http("POST", f"{base_url}/auth/login", {"email": email, "password": password})
    if status != 200:
        raise RunError(f"cannot log in as {email} for a token: {status} {body[:200]!r}")
    return json.loads(body)["access_token"]


def metric_total(metrics_text, name):
    """Sum of a Prometheus metric's samples (`name` may carry its labels), or None."""
    total, found = 0.0, False
    for line in metrics_text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            try:
                total += float(line.rsplit(" ", 1)[1])
                found = True
            except ValueError:
                pass
    return total if found else None


# --------------------------------------------------------------------------
# Statistics


def median(xs):
    xs = sorted(xs)
    n = len(xs)
    return (xs[n // 2] + xs[(n - 1) // 2]) / 2 if xs else float("nan")


def percentile(sorted_vals, p):
    """k6's definition: linear interpolation between closest ranks."""
    if not sorted_vals:
        return None
    if len(sorted_vals) == 1:
        return sorted_vals[0]
    pos = p / 100 * (len(sorted_vals) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(sorted_vals) - 1)
    return sorted_vals[lo] + (sorted_vals[hi] - sorted_vals[lo]) * (pos - lo)


# --------------------------------------------------------------------------
# /proc: CPU, memory, processes


CLK_TCK = os.sysconf("SC_CLK_TCK")
NPROC = os.cpu_count() or 1


def proc_stat(pid):
    """The fields of /proc/PID/stat after the command name (state first), or None."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            s = f.read()
    except OSError:
        return None
    return s[s.rindex(")") + 2:].split()


def proc_cpu_ticks(pid):
    fields = proc_stat(pid)
    # fields[0] is field 3 (state): utime is field 14, stime 15.
    return int(fields[11]) + int(fields[12]) if fields else None


def cpu_seconds(pid):
    """CPU time (user + system) of a process so far; 0 once it is gone."""
    ticks = proc_cpu_ticks(pid)
    return ticks / CLK_TCK if ticks is not None else 0.0


def reaped_cpu_seconds(pid):
    """CPU time of the children `pid` waited for (cutime + cstime): what a
    process tree's exited members used (PostgreSQL's backends and
    autovacuum workers, reaped by the postmaster); 0 once it is gone."""
    fields = proc_stat(pid)
    # fields[13] is field 16 (cutime), fields[14] field 17 (cstime).
    return (int(fields[13]) + int(fields[14])) / CLK_TCK if fields else 0.0


def parent_of(pid):
    fields = proc_stat(pid)
    return int(fields[1]) if fields else None


def stopped(pid):
    fields = proc_stat(pid)
    return bool(fields) and fields[0] in ("T", "t")


def proc_rss_kib(pid, field="VmRSS"):
    """A memory figure of /proc/PID/status in KiB: VmRSS (resident now) or
    VmHWM (the peak); None once the process is gone."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        return None
    return 0


def pids():
    return [int(d) for d in os.listdir("/proc") if d.isdigit()]


def proc_tree(pid):
    """The process and all its descendants."""
    children = {}
    for p in pids():
        parent = parent_of(p)
        if parent is not None:
            children.setdefault(parent, []).append(p)
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(children.get(p, []))
    return out


def processes_named(names):
    """[(pid, name)] of the processes whose command name is in `names`, this one aside."""
    me, found = os.getpid(), []
    for pid in pids():
        if pid == me:
            continue
        try:
            with open(f"/proc/{pid}/comm") as f:
                name = f.read().strip()
        except OSError:
            continue
        if name in names:
            found.append((pid, name))
    return found


def cmdline(pid):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def machine_jiffies():
    """The first line of /proc/stat: user, nice, system, idle, iowait, irq, softirq, steal."""
    with open("/proc/stat") as f:
        return [int(x) for x in f.readline().split()[1:9]]


def machine_ticks():
    """(all, idle + iowait) jiffies of all cores."""
    v = machine_jiffies()
    return sum(v), v[3] + v[4]


def children_cpu():
    """CPU seconds of the finished children of this process so far."""
    import resource

    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


class Sampler(threading.Thread):
    """Once a second: server CPU % and RSS, the load generator's CPU % (its
    whole process tree) and the machine's CPU %, to a CSV file and to
    `rows`. 100 % = one core."""

    def __init__(self, path, server_pid):
        super().__init__(daemon=True)
        self.path = path
        self.server_pid = server_pid
        self.gen_pid = None
        self.label = ""
        self.rows = []
        self._stop_event = threading.Event()
        self._lock = threading.Lock()

    def set_generator(self, pid, label=""):
        # A generator just started has used (almost) no CPU: count from here,
        # so that even a one-second step gets a figure.
        with self._lock:
            self.gen_pid = pid
            self.label = label
            self._gen_prev = (0, time.monotonic()) if pid is not None else None

    def stop(self):
        self._stop_event.set()
        self.join(timeout=5)

    def _gen_ticks(self):
        if self.gen_pid is None:
            return None
        ticks = [proc_cpu_ticks(p) for p in proc_tree(self.gen_pid)]
        ticks = [t for t in ticks if t is not None]
        return sum(ticks) if ticks else None

    def run(self):
        with open(self.path, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["time_ms", "label", "server_cpu_pct", "server_rss_mib", "gen_cpu_pct", "machine_cpu_pct"])
            prev_t = time.monotonic()
            prev_srv = proc_cpu_ticks(self.server_pid)
            prev_m = machine_ticks()
            with self._lock:
                g = self._gen_ticks()
                self._gen_prev = (g, prev_t) if g is not None else None
            while not self._stop_event.wait(1.0):
                now = time.monotonic()
                elapsed = now - prev_t
                srv = proc_cpu_ticks(self.server_pid)
                rss = proc_rss_kib(self.server_pid)
                m = machine_ticks()
                with self._lock:
                    gen = self._gen_ticks()
                    gen_pct = None
                    if gen is not None and self._gen_prev is not None and now > self._gen_prev[1]:
                        gen_pct = (gen - self._gen_prev[0]) / CLK_TCK / (now - self._gen_prev[1]) * 100
                    self._gen_prev = (gen, now) if gen is not None else None
                    label = self.label
                    gen_active = self.gen_pid is not None
                srv_pct = (srv - prev_srv) / CLK_TCK / elapsed * 100 if srv is not None and prev_srv is not None else None
                dt_total = m[0] - prev_m[0]
                m_pct = (1 - (m[1] - prev_m[1]) / dt_total) * NPROC * 100 if dt_total > 0 else None
                row = {
                    "time_ms": int(time.time() * 1000),
                    "label": label,
                    "server_cpu_pct": srv_pct,
                    "server_rss_mib": rss / 1024 if rss is not None else None,
                    "gen_cpu_pct": gen_pct,
                    "machine_cpu_pct": m_pct,
                    "gen_active": gen_active,
                }
                self.rows.append(row)
                w.writerow([row["time_ms"], label] + [
                    "" if row[k] is None else f"{row[k]:.1f}"
                    for k in ("server_cpu_pct", "server_rss_mib", "gen_cpu_pct", "machine_cpu_pct")
                ])
                f.flush()
                prev_t, prev_srv, prev_m = now, srv, m


def resource_stats(rows):
    """avg / max of each sampled series over the rows given."""

    def agg(key):
        vals = [r[key] for r in rows if r.get(key) is not None]
        if not vals:
            return None, None
        return sum(vals) / len(vals), max(vals)

    return {
        "server_cpu": agg("server_cpu_pct"),
        "server_rss": agg("server_rss_mib"),
        "gen_cpu": agg("gen_cpu_pct"),
        "machine_cpu": agg("machine_cpu_pct"),
        "samples": len(rows),
    }


# --------------------------------------------------------------------------
# The machine, the revision, the result folder


def machine_info():
    """CPU count and model, RAM (GiB) and kernel, for the reports."""
    model = "?"
    try:
        with open("/proc/cpuinfo") as f:
            m = re.search(r"^model name\s*:\s*(.*)$", f.read(), re.M)
            model = m.group(1).strip() if m else "?"
    except OSError:
        pass
    ram = None
    try:
        with open("/proc/meminfo") as f:
            m = re.search(r"^MemTotal:\s*(\d+)", f.read(), re.M)
            ram = int(m.group(1)) / 1024 / 1024 if m else None
    except OSError:
        pass
    return {"nproc": NPROC, "cpu": model, "ram_gib": ram, "kernel": os.uname().release}


def git_revision(describe=True):
    """`git describe --always --dirty` (12 digits), or the short commit alone."""
    cmd = ["git", "describe", "--always", "--dirty", "--abbrev=12"] if describe else ["git", "rev-parse", "--short",
                                                                                     "HEAD"]
    try:
        r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=10)
        return r.stdout.strip() or "?"
    except Exception:  # noqa: BLE001 - a revision is informative only
        return "?"


def utc_now():
    return dt.datetime.now(dt.timezone.utc)


def result_dir(started, name, out=None):
    """loadtest/results/<YYYY-MM-DD-HHMM>-<name>/ (UTC) with its raw/ folder,
    or `out`; "-2", "-3" ... appended rather than mixing two runs in one
    folder."""
    outdir = Path(out).resolve() if out else RESULTS / f"{started.strftime('%Y-%m-%d-%H%M')}-{name}"
    base, n = outdir, 2
    while outdir.exists() and any(outdir.iterdir()):
        outdir = base.with_name(f"{base.name}-{n}")
        n += 1
    (outdir / "raw").mkdir(parents=True, exist_ok=True)
    return outdir
