"""The fault suite: the mixed workload (register, verify, login, refresh,
validate, logout) through HAProxy on the scale-out rig (loadtest/rig.py)
while one fault happens, every request's outcome recorded, then the
invariants checked against the database, the mail server and every
instance:

  instance-kill   SIGKILL of one instance mid-load, restarted 5 s later
  pg-restart      PostgreSQL restarted (pg_ctl restart -m fast)
  pg-stop         PostgreSQL stopped for 10 s (--short: 5 s)
  redis-master    one Redis Cluster master killed (its replica takes over)
  redis-freeze    every Redis node frozen (SIGSTOP) for 10 s (--short: 5 s)
  smtp-down       the SMTP server down for 60 s (--short: 15 s), then back
  upgrade         a rolling upgrade: the rig starts on the previous release
                  (the newest v* tag before HEAD, built from git), and each
                  instance in turn is stopped (SIGTERM) and started on this
                  build; both versions serve one database meanwhile. The
                  migrations added since the release are checked to be
                  additive (expand, never contract: docs/operations.md)

The error budget of every request: its expected answer, a 429 or a 503
that carries Retry-After, or (for a verify whose code was not mailed yet)
nothing at all; never a 500, a 502/504, a connection error, or an answer
later than the request deadline (5 s) plus 1 s. The invariants, after the
load:
  - every 201 register has its account, and exactly one verification mail
    (a second delivery of it, with the same Message-ID, is counted apart:
    its first copy stored around the fault, at most one per delivery the
    fault can catch);
  - every token pair a 200 gave validates on every instance, unless its
    session was logged out (then it is refused);
  - every logout's access token is refused by every instance within 1 s;
  - no refresh family has two live tokens;
  - the resend_ip limit (60/60) admitted no more than its policy allows
    (with Redis unreachable, `local`: each instance its own bucket).
Recovery time: from the end of the fault to the last request outside its
budget or refused with 503, and for mail from the relay's return to the
delivery of the last message queued before it.

scripts/loadtest faults [--short] [--only NAME,...]; the report goes to
loadtest/results/<date>-faults/."""

import argparse
import http.client
import json
import random
import re
import string
import threading
import time
from pathlib import Path

from .common import RunError, git_revision, machine_info, result_dir, say, set_prog, utc_now, wait_until
from .rig import Rig
from .tools import ensure_binary, previous_release, previous_release_binary

DEADLINE = 5.0  # the service's request deadline (LATCHKEY_REQUEST_TIMEOUT_MS default)
HANG = DEADLINE + 1.0
PASSWORD = "fault-suite-password"
RESEND_LIMIT, RESEND_WINDOW = 60, 60.0

EXPECTED = {"register": 201, "verify": 200, "login": 200, "refresh": 200, "validate": 200, "logout": 204,
            "resend": 202}
# Second deliveries of one message (same Message-ID) a fault may cause: the
# outbox delivers at least once, and each instance delivers one message at a
# time, so a fault catches at most one message per instance it touches
# between the relay storing it and its row being deleted. Killing one
# instance touches one. Stopping the relay touches all three (stored, the
# reply lost). Stopping PostgreSQL touches all three (stored, the delete
# failed, and the claim ran out during the outage before the instance could
# delete it). The other faults none. A copy counts against this only if
# its first copy was stored around the fault (COPY_WINDOW); any other copy
# is a breach.
COPIES_ALLOWED = {"instance-kill": 1, "smtp-down": 3, "pg-stop": 3}
COPY_WINDOW = 2.0  # seconds before the fault began that a caught delivery may have been stored


class Mailbox:
    """The SMTP sink's messages: verification codes and counts by recipient.
    A message is known by its Message-ID: the outbox delivers at least once,
    and a second delivery of one message (its sender died after the relay
    stored it, before the row was settled) carries the first's Message-ID.
    Such a copy is counted apart, not as another message."""

    def __init__(self, directory):
        self.dir = Path(directory)
        self.seen = set()
        self.by_rcpt = {}       # recipient: [(message id, code, stored at)], one per message
        self.copies = []        # (recipient, first copy stored at, this one stored at) of each copy
        self.lock = threading.Lock()
        self.delivered_at = []  # (time, recipient)
        self.first_at = {}      # recipient: when its first message was seen

    def scan(self):
        with self.lock:
            for p in self.dir.glob("*.eml"):
                if p.name in self.seen:
                    continue
                self.seen.add(p.name)
                text = p.read_text(errors="replace")
                head, _, body = text.partition("\r\n\r\n" if "\r\n\r\n" in text else "\n\n")
                m = re.search(r"^To:\s*<?([^>\s]+)>?", head, re.M | re.I)
                mid = re.search(r"^Message-ID:\s*(\S+)", head, re.M | re.I)
                code = re.search(r"\b(\d{6})\b", body)
                # The sink names each file by the time it stored it (ns).
                ns = p.name.split("-", 1)[0]
                stored = int(ns) / 1e9 if ns.isdigit() else time.time()
                if m:
                    rcpt = m.group(1).lower()
                    mid = mid.group(1) if mid else p.name
                    messages = self.by_rcpt.setdefault(rcpt, [])
                    first = [at for known, _, at in messages if known == mid]
                    if first:
                        self.copies.append((rcpt, min(first[0], stored), max(first[0], stored)))
                        continue
                    messages.append((mid, code.group(1) if code else None, stored))
                    self.delivered_at.append((time.time(), rcpt))
                    self.first_at.setdefault(rcpt, time.time())

    def code(self, rcpt):
        with self.lock:
            messages = self.by_rcpt.get(rcpt.lower())
            return messages[-1][1] if messages else None

    def count(self, rcpt):
        """Distinct messages to `rcpt`."""
        with self.lock:
            return len(self.by_rcpt.get(rcpt.lower(), []))


class Recorder:
    def __init__(self):
        self.rows = []
        self.lock = threading.Lock()

    def add(self, **row):
        with self.lock:
            self.rows.append(row)


class Client:
    """Keep-alive connections from one loopback address (its own rate-limit
    buckets, as a real client has): to HAProxy, whose answers are recorded,
    and to single instances (`base`: the logout propagation check and the
    invariants), whose answers are not."""

    def __init__(self, host, port, source, rec):
        self.host, self.port, self.source, self.rec = host, port, source, rec
        self.conns = {}  # (host, port): its connection

    def call(self, op, method, path, body=None, token=None, base=None):
        t0 = time.time()
        headers = {"content-type": "application/json"} if body is not None else {}
        if token:
            headers["authorization"] = f"Bearer {token}"
        data = json.dumps(body).encode() if body is not None else None
        status, retry_after, answer = None, None, None
        target = base or (self.host, self.port)
        try:
            conn = self.conns.get(target)
            if conn is None:
                conn = http.client.HTTPConnection(*target, timeout=HANG + 4, source_address=(self.source, 0))
                self.conns[target] = conn
            conn.request(method, path, body=data, headers=headers)
            r = conn.getresponse()
            raw = r.read()
            status, retry_after = r.status, r.getheader("retry-after")
            try:
                answer = json.loads(raw) if raw else None
            except ValueError:
                answer = None
            if r.getheader("connection", "").lower() == "close":
                self.conns.pop(target).close()
        except (OSError, http.client.HTTPException) as e:
            status = f"error:{type(e).__name__}"
            if target in self.conns:
                self.conns.pop(target).close()
        dt = time.time() - t0
        if base is None:
            self.rec.add(t=t0, dt=dt, op=op, status=status, retry_after=retry_after,
                         error=(answer or {}).get("error") if isinstance(answer, dict) else None)
        return status, answer


class Workload:
    """Closed-loop users going through the life of an account again and
    again, each life from a new address; plus one client over its resend
    limit."""

    def __init__(self, rig, users, rec, mailbox):
        self.rig, self.users, self.rec, self.mail = rig, users, rec, mailbox
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.registered = []      # emails answered 201
        self.registered_at = {}   # email: when its 201 came
        self.pairs = []           # dicts: email, access, refresh, sid, logged_out_at
        self.unverified = []      # emails whose code did not come in time
        self.propagation = []     # seconds until every instance refused a logged-out token
        self.resend_ok = []       # times of 202s of the limited client
        self.notes = []

    def new_email(self):
        tag = "".join(random.choices(string.ascii_lowercase + string.digits, k=10))
        return f"u-{tag}@faults.test"

    def retrying(self, c, op, method, path, body=None, token=None, tries=6):
        """A call retried after a 503/429 (Retry-After, at most 1 s here) or a
        connection error; what a well-behaved client does."""
        for _ in range(tries):
            status, answer = c.call(op, method, path, body, token)
            if status in (503, 429) or not isinstance(status, int):
                if self.stop.is_set():
                    return status, answer
                time.sleep(0.3 + random.random() * 0.7)
                continue
            return status, answer
        return status, answer

    def user_loop(self, k):
        while not self.stop.is_set():
            # Each life comes from an address of its own in 127.1.0.0/16:
            # many clients, each within its per-address limits.
            c = Client("127.0.0.1", self.rig.lb.port, f"127.1.{random.randrange(256)}.{random.randrange(1, 255)}",
                       self.rec)
            try:
                self.one_life(c)
            except Exception as e:  # a bug in the generator must not pass silently
                self.notes.append(f"user {k}: {type(e).__name__}: {e}")
                time.sleep(0.5)

    def one_life(self, c):
        email = self.new_email()
        status, _ = self.retrying(c, "register", "POST", "/auth/register",
                                  {"email": email, "password": PASSWORD})
        if status != 201:
            return
        with self.lock:
            self.registered.append(email)
            self.registered_at[email] = time.time()
        pair = self.verify(c, email)
        if pair is None:
            with self.lock:
                self.unverified.append(email)
            # Someone registered earlier whose code came late gets verified now.
            with self.lock:
                late = [e for e in self.unverified if self.mail.code(e)]
            for e in late[:1]:
                with self.lock:
                    self.unverified.remove(e)
                self.verify(c, e, wait=0)
            return
        self.use(c, pair)
        status, body = self.retrying(c, "refresh", "POST", "/auth/refresh", {"refresh_token": pair["refresh"]})
        if status == 200:
            self.replace(pair, body)
            self.use(c, pair)
        status, body = self.retrying(c, "login", "POST", "/auth/login", {"email": email, "password": PASSWORD})
        if status == 200:
            second = self.keep(email, body)
            self.use(c, second)
        self.logout(c, pair)

    def verify(self, c, email, wait=3.0):
        deadline = time.time() + wait
        while True:
            self.mail.scan()
            code = self.mail.code(email)
            if code or time.time() >= deadline or self.stop.is_set():
                break
            time.sleep(0.1)
        if not code:
            return None
        status, body = self.retrying(c, "verify", "POST", "/auth/verify-otp", {"email": email, "code": code})
        return self.keep(email, body) if status == 200 else None

    def keep(self, email, body):
        pair = {"email": email, "access": body["access_token"], "refresh": body["refresh_token"],
                "issued": [body["access_token"]], "logged_out_at": None}
        with self.lock:
            self.pairs.append(pair)
        return pair

    def replace(self, pair, body):
        pair["access"], pair["refresh"] = body["access_token"], body["refresh_token"]
        pair["issued"].append(body["access_token"])

    def use(self, c, pair, n=3):
        for _ in range(n):
            self.retrying(c, "validate", "GET", "/auth/validate", token=pair["access"])

    def logout(self, c, pair):
        status, _ = self.retrying(c, "logout", "POST", "/auth/logout", {"refresh_token": pair["refresh"]})
        if status != 204:
            return
        pair["logged_out_at"] = time.time()
        # Every instance (the live ones) must refuse the session's tokens within 1 s.
        start = time.time()
        for inst in self.rig.instances:
            if inst.proc is None or inst.proc.poll() is not None:
                continue
            while not self.stop.is_set():
                status, _ = c.call("propagation", "GET", "/auth/validate", token=pair["access"],
                                   base=("127.0.0.1", inst.port))
                if status == 401 or not isinstance(status, int) or time.time() - start > 5:
                    break
                time.sleep(0.02)
        with self.lock:
            self.propagation.append(time.time() - start)

    def resend_loop(self):
        """3 resends a second from one address: three times its limit."""
        c = Client("127.0.0.1", self.rig.lb.port, "127.0.0.9", self.rec)
        while not self.stop.is_set():
            sent = time.time()
            status, _ = c.call("resend", "POST", "/auth/resend-otp", {"email": self.new_email()})
            if status == 202:
                # (sent, answered): the bound below counts conservatively.
                self.resend_ok.append((sent, time.time()))
            time.sleep(1 / 3)

    def run(self, seconds, during=None):
        threads = [threading.Thread(target=self.user_loop, args=(k,), daemon=True) for k in range(self.users)]
        threads.append(threading.Thread(target=self.resend_loop, daemon=True))
        self.started = time.time()
        for t in threads:
            t.start()
        try:
            if during:
                during()
            remaining = self.started + seconds - time.time()
            if remaining > 0:
                time.sleep(remaining)
        finally:
            self.stop.set()
            for t in threads:
                t.join(HANG + 10)


# --------------------------------------------------------------------------
# Faults: each returns (start, end) of the fault, in time.time().


def fault_instance_kill(rig, pause):
    time.sleep(pause)
    victim = rig.instances[1]
    t0 = time.time()
    victim.kill()
    time.sleep(5)
    victim.start(wait=False)
    victim.wait_ready()
    return t0, time.time()


def fault_pg_restart(rig, pause):
    time.sleep(pause)
    t0 = time.time()
    rig.pg.restart_fast()
    return t0, time.time()


def outage(pause, down, stop, start):
    """`stop()` after `pause` seconds, `start()` `down` seconds later."""
    time.sleep(pause)
    t0 = time.time()
    stop()
    time.sleep(down)
    start()
    return t0, time.time()


def fault_pg_stop(rig, pause, down=10):
    return outage(pause, down, rig.pg.stop_fast, rig.pg.start)


def fault_redis_master(rig, pause):
    time.sleep(pause)
    masters = rig.redis.masters()
    if not masters:
        raise RunError("no Redis master found")
    victim = masters[0]
    t0 = time.time()
    rig.redis.kill(victim)
    # Until the cluster has marked it failed and promoted its replica.
    wait_until(lambda: victim not in rig.redis.masters() and len(rig.redis.masters()) == 3,
               "a replica taking over", timeout=30, interval=0.1)
    rig.redis.wait_ok()
    t1 = time.time()
    rig.redis.start_node(victim)  # back, as a replica of its successor
    return t0, t1


def fault_redis_freeze(rig, pause, down=10):
    return outage(pause, down, rig.redis.freeze, rig.redis.thaw)


def fault_smtp_down(rig, pause, down=60):
    return outage(pause, down, rig.smtp.stop, rig.smtp.start)


def fault_upgrade(rig, pause, current):
    time.sleep(pause)
    t0 = time.time()
    for inst in rig.instances:
        inst.stop()
        inst.binary = current
        inst.start(wait=False)
        inst.wait_ready()
        time.sleep(2)  # back in HAProxy (its checks: every 0.5 s, rise 2) before the next goes
    return t0, time.time()


# A migration that contracts the schema, or narrows what it accepts: an
# instance of the release before it, still serving during a rolling
# upgrade, would lose a table or column it uses, or have its writes
# refused (docs/operations.md, "Upgrades"). Data changes (DELETE, TRUNCATE)
# count too. Deliberately broad: a false alarm is read and waived in
# review; a missed contraction breaks an upgrade.
CONTRACTING = re.compile(
    r"\b(DROP\b|RENAME\b|TRUNCATE\b|DELETE\s+FROM\b|SET\s+NOT\s+NULL\b|(SET\s+DATA\s+)?TYPE\b|"
    r"ADD\s+CONSTRAINT\b|CREATE\s+UNIQUE\s+INDEX\b|UNIQUE\b|CHECK\b|REFERENCES\b)",
    re.IGNORECASE)


def contracting_migrations(tag):
    """The migrations of this working tree, against `tag`, that an
    instance of `tag` could not serve beside: a released migration changed
    or removed, or a new one that contracts. New tables may carry their
    own constraints: only statements that touch what exists are read."""
    import subprocess
    from .common import ROOT

    def git(*args):
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=True).stdout

    found = []
    added = git("ls-files", "--others", "--exclude-standard", "migrations/").split()
    for line in git("diff", "--name-status", tag, "--", "migrations/").splitlines():
        status, path = line.split("\t", 1)
        if status == "A":
            added.append(path)
        else:
            found.append(f"{path}: a migration of {tag} changed ({status}); add a new one instead")
    for path in added:
        text = (ROOT / path).read_text()
        text = re.sub(r"/\*.*?\*/", "", re.sub(r"--[^\n]*", "", text), flags=re.DOTALL)
        for statement in text.split(";"):
            if re.match(r"\s*CREATE\s+TABLE\b", statement, re.IGNORECASE):
                continue
            for m in CONTRACTING.finditer(statement):
                found.append(f"{path}: {m.group(0)!r} in {' '.join(statement.split())[:120]!r}: "
                             f"it contracts what {tag} still uses")
    return found


FAULTS = {
    "instance-kill": (fault_instance_kill, "SIGKILL of one of 3 instances mid-load, restarted 5 s later"),
    "pg-restart": (fault_pg_restart, "PostgreSQL restarted: pg_ctl restart -m fast"),
    "pg-stop": (fault_pg_stop, "PostgreSQL stopped (pg_ctl stop -m fast), then started"),
    "redis-master": (fault_redis_master, "one Redis Cluster master SIGKILLed until its replica took over"),
    "redis-freeze": (fault_redis_freeze, "every Redis Cluster node SIGSTOPped (unreachable), then SIGCONT"),
    "smtp-down": (fault_smtp_down, "the SMTP server down, then back"),
    "upgrade": (fault_upgrade, "the previous release's 3 instances replaced one by one with this build"),
}


# --------------------------------------------------------------------------
# The checks


def outside_budget(row):
    s = row["status"]
    if row["op"] == "propagation":
        return False
    if not isinstance(s, int):
        return True  # a connection error or no answer
    if row["dt"] > HANG:
        return True
    if s == EXPECTED[row["op"]]:
        return False
    if s in (503, 429):
        return not row["retry_after"]
    if s == 401 and row["op"] == "verify":
        return False  # a code superseded by a resend, counted apart
    return True


def check(rig, load, rec, fault_window, name, mail_wait):
    breaches = []
    rows = rec.rows
    by_status = {}
    for r in rows:
        if r["op"] == "propagation":
            continue
        key = f"{r['op']} {r['status']}"
        by_status[key] = by_status.get(key, 0) + 1
    bad = [r for r in rows if outside_budget(r)]
    for r in bad[:10]:
        breaches.append(f"outside the budget: {r['op']} answered {r['status']} after {r['dt']:.2f} s")
    if len(bad) > 10:
        breaches.append(f"... {len(bad) - 10} more outside the budget")
    five_hundreds = sum(1 for r in rows if isinstance(r["status"], int) and r["status"] >= 500
                        and r["status"] != 503)
    f_end = fault_window[1]
    failed_after = [r["t"] + r["dt"] for r in rows
                    if r["op"] != "propagation" and (outside_budget(r) or r["status"] == 503)
                    and r["t"] + r["dt"] >= fault_window[0]]
    recovery = max(0.0, max(failed_after) - f_end) if failed_after else 0.0

    # Mail: every 201 register has exactly one verification mail, once the outbox drained.
    deadline = time.time() + mail_wait
    while True:
        load.mail.scan()
        missing = [e for e in load.registered if load.mail.count(e) == 0]
        if not missing or time.time() > deadline:
            break
        time.sleep(0.5)
    # Mail recovery: until the last message queued before the relay came back went out.
    queued = [load.mail.first_at.get(e) for e, t in load.registered_at.items() if t <= f_end]
    last_mail = max((t for t in queued if t is not None), default=f_end)
    mail_recovery = max(0.0, last_mail - f_end) if name == "smtp-down" else None
    if missing:
        breaches.append(f"{len(missing)} registered accounts got no mail within {mail_wait} s (e.g. {missing[0]})")
    doubles = [e for e in load.registered if load.mail.count(e) > 1]
    if doubles:
        breaches.append(f"{len(doubles)} accounts got their verification mail more than once (e.g. {doubles[0]})")
    copies = len(load.mail.copies)
    f_start = fault_window[0]
    caught = [c for c in load.mail.copies if f_start - COPY_WINDOW <= c[1] <= f_end and c[2] >= f_start]
    for rcpt, first, again in load.mail.copies:
        if (rcpt, first, again) not in caught:
            breaches.append(f"a message to {rcpt} was delivered twice ({first - f_start:+.1f} s and "
                            f"{again - f_start:+.1f} s from the fault's start), not around the fault")
    if len(caught) > COPIES_ALLOWED.get(name, 0):
        breaches.append(f"{len(caught)} messages were delivered twice (e.g. {caught[0][0]}), "
                        f"more than the {COPIES_ALLOWED.get(name, 0)} deliveries the fault can catch")

    # Accounts: every 201 has its row.
    emails = {row[0] for row in rig.pg.sql("SELECT email FROM users")}
    lost = [e for e in load.registered if e not in emails]
    if lost:
        breaches.append(f"{len(lost)} registered accounts are not in the database (e.g. {lost[0]})")

    # Tokens: every pair validates on every instance unless logged out.
    refused_live = accepted_dead = 0
    c = Client("127.0.0.1", rig.lb.port, "127.0.0.1", Recorder())
    for pair in load.pairs:
        for inst in rig.instances:
            for token in pair["issued"]:
                status, _ = c.call("validate", "GET", "/auth/validate", token=token, base=("127.0.0.1", inst.port))
                if pair["logged_out_at"] is None and status != 200:
                    refused_live += 1
                if pair["logged_out_at"] is not None and status != 401:
                    accepted_dead += 1
    if refused_live:
        breaches.append(f"{refused_live} validations of live tokens were refused")
    if accepted_dead:
        breaches.append(f"{accepted_dead} validations of logged-out tokens were accepted")
    slow = [p for p in load.propagation if p > 1.0]
    if slow:
        breaches.append(f"{len(slow)} of {len(load.propagation)} logouts took over 1 s to reach every instance "
                        f"(slowest {max(slow):.2f} s)")

    # Refresh families: never two live branches.
    forks = rig.pg.sql("SELECT r.session_id FROM refresh_tokens r JOIN sessions s ON s.id = r.session_id "
                       "WHERE r.rotated_at IS NULL AND s.revoked_at IS NULL GROUP BY r.session_id "
                       "HAVING count(*) > 1")
    if forks:
        breaches.append(f"{len(forks)} refresh families have two live tokens")

    # The limited client: GCRA admits at most LIMIT + elapsed/interval; with
    # Redis unreachable (`local` fallback) each instance has its own bucket.
    # Admission happened between a request's sending and its answer, so the
    # n-th admission after the first is bounded with the widest interval.
    ok = sorted(load.resend_ok)
    # A Redis fault sends some checks to each instance's own buckets.
    buckets = len(rig.instances) if name.startswith("redis-") else 1
    worst = 0.0
    for i, (_, answered) in enumerate(ok):
        allowed = buckets * (RESEND_LIMIT + (answered - ok[0][0]) * RESEND_LIMIT / RESEND_WINDOW)
        worst = max(worst, (i + 1) / allowed)
        if i + 1 > allowed:
            breaches.append(f"resend_ip admitted {i + 1} within {answered - ok[0][0]:.1f} s: its policy allows "
                            f"{allowed:.1f}")
            break

    n = sum(1 for r in rows if r["op"] != "propagation")
    lat = sorted(r["dt"] for r in rows if r["op"] != "propagation" and isinstance(r["status"], int))
    p = (lambda q: lat[min(len(lat) - 1, int(q * len(lat)))] * 1000 if lat else 0)
    return {
        "scenario": name,
        "requests": n,
        "by_status": by_status,
        "outside_budget": len(bad),
        "five_hundreds": five_hundreds,
        "p50_ms": round(p(0.5), 1), "p99_ms": round(p(0.99), 1), "max_ms": round(lat[-1] * 1000, 1) if lat else 0,
        "registered": len(load.registered),
        "token_pairs": len(load.pairs),
        "logouts": len(load.propagation),
        "propagation_max_s": round(max(load.propagation, default=0), 3),
        "resend_admitted": len(ok),
        "resend_worst_share_of_policy": round(worst, 3),
        "fault_seconds": round(fault_window[1] - fault_window[0], 1),
        "recovery_s": round(recovery, 2),
        "mail_recovery_s": round(mail_recovery, 2) if mail_recovery is not None else None,
        "mail_copies": copies,
        "generator_notes": load.notes[:5],
        "breaches": breaches,
    }


def run_scenario(binary, name, short, outdir, previous=None):
    fault, _what = FAULTS[name]
    load_secs = 25 if short else 60
    pause = 6 if short else 15
    kwargs = {}
    if short and name in ("pg-stop", "redis-freeze"):
        kwargs["down"] = 5
    if name == "smtp-down":
        kwargs["down"] = 15 if short else 60
        load_secs = pause + kwargs["down"] + (10 if short else 20)
    if name == "upgrade":
        kwargs["current"] = binary
        binary = previous[1]
    rig = Rig(binary, instances=3)
    rec = Recorder()
    try:
        say(f"{name}: starting the rig")
        rig.start()
        load = Workload(rig, users=6, rec=rec, mailbox=Mailbox(rig.smtp.dir))
        window = {}

        def during():
            window["w"] = fault(rig, pause, **kwargs)

        say(f"{name}: {load_secs} s of load, the fault after {pause} s")
        load.run(load_secs, during)
        say(f"{name}: checking the invariants")
        result = check(rig, load, rec, window["w"], name, mail_wait=120 if name == "smtp-down" else 30)
        if name == "upgrade":
            result["previous_release"] = previous[0]
            result["breaches"] += contracting_migrations(previous[0])
        raw = outdir / "raw"
        raw.mkdir(parents=True, exist_ok=True)
        with open(raw / f"{name}-requests.jsonl", "w") as f:
            for r in rec.rows:
                f.write(json.dumps(r) + "\n")
        return result
    finally:
        rig.stop(keep_logs=outdir / "raw" / name)


def report(results, args, started, outdir):
    lines = [f"# Fault suite, {started.strftime('%Y-%m-%d %H:%M')} UTC", "",
             f"Command: `scripts/loadtest faults{' --short' if args.short else ''}"
             f"{' --only ' + args.only if args.only else ''}`  ",
             "Machine: {nproc} CPU ({cpu}), {ram_gib:.0f} GiB, Linux {kernel}  ".format(**machine_info()),
             f"Revision: {git_revision()}  ",
             "Rig: 3 latchkey instances behind HAProxy (health-checked on /health/ready every "
             "0.5 s, fall 2, rise 2, retry-on conn-failure/empty-response), PostgreSQL 15, Redis Cluster "
             "(3 masters + 3 replicas, node timeout 1 s), the SMTP sink of the tests; 6 closed-loop users, each account's life "
             "from a new loopback address, plus one client sending 3 resends/s against resend_ip 60/60.", "",
             "| scenario | fault | requests | outside budget | 500s | P50 / P99 / max ms | recovery | "
             "registered / pairs / logouts | slowest logout reach | breaches |",
             "|---|---|---:|---:|---:|---|---:|---|---:|---|"]
    for r in results:
        rec = f"{r['recovery_s']} s"
        if r["mail_recovery_s"] is not None:
            rec += f" (mail: {r['mail_recovery_s']} s)"
        lines.append(f"| {r['scenario']} | {FAULTS[r['scenario']][1]} ({r['fault_seconds']} s) | {r['requests']} | "
                     f"{r['outside_budget']} | {r['five_hundreds']} | {r['p50_ms']} / {r['p99_ms']} / {r['max_ms']} | "
                     f"{rec} | {r['registered']} / {r['token_pairs']} / {r['logouts']} | "
                     f"{r['propagation_max_s']} s | {len(r['breaches'])} |")
    lines.append("")
    for r in results:
        lines.append(f"## {r['scenario']}")
        lines.append("")
        if r.get("previous_release"):
            lines.append(f"Rolling upgrade from {r['previous_release']} (its release build from git) to this "
                         "build, one instance at a time, under load; the migrations since checked to be additive.")
        lines.append("Answers: " + ", ".join(f"{k}: {v}" for k, v in sorted(r["by_status"].items())))
        lines.append(f"resend_ip admitted {r['resend_admitted']} (at its worst moment "
                     f"{r['resend_worst_share_of_policy']} of what the policy allows"
                     f"{', each instance its own bucket during the fault' if r['scenario'].startswith('redis-') else ''})")
        if r["mail_copies"]:
            lines.append(f"Mail: {r['mail_copies']} second deliveries of a message already delivered "
                         "(same Message-ID: the outbox delivers at least once)")
        for b in r["breaches"]:
            lines.append(f"- BREACH: {b}")
        for n in r["generator_notes"]:
            lines.append(f"- generator: {n}")
        lines.append("")
    text = "\n".join(lines)
    (outdir / "report.md").write_text(text)
    (outdir / "summary.json").write_text(json.dumps(results, indent=2))
    return text


def main(argv):
    set_prog("faults")
    ap = argparse.ArgumentParser(prog="scripts/loadtest faults", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--short", action="store_true", help="CI's form: 25 s of load, 5 s outages, 15 s of SMTP down")
    ap.add_argument("--only", help="comma-separated scenarios (default: all)")
    ap.add_argument("--binary", help="a latchkey binary (default: target/release/latchkey, built if stale)")
    ap.add_argument("--out", help="the result folder (default: loadtest/results/<date>-faults)")
    args = ap.parse_args(argv)
    names = args.only.split(",") if args.only else list(FAULTS)
    for n in names:
        if n not in FAULTS:
            raise RunError(f"unknown scenario {n!r}: {', '.join(FAULTS)}")
    previous = None
    if "upgrade" in names:
        tag = previous_release()
        if tag is None:
            if args.only:
                raise RunError("upgrade: no release tag (v*) before HEAD: git fetch --tags")
            say("upgrade: SKIPPED: no release tag (v*) before HEAD in this clone (git fetch --tags)")
            names.remove("upgrade")
        else:
            # Before this build's binary: building it moves target/release/latchkey.
            previous = (tag, previous_release_binary(tag))
    binary, _how = ensure_binary(args.binary)
    started = utc_now()
    outdir = result_dir(started, "faults" + ("-short" if args.short else ""), args.out)
    results = []
    for n in names:
        results.append(run_scenario(binary, n, args.short, outdir, previous))
        say(f"{n}: {len(results[-1]['breaches'])} breaches, recovery {results[-1]['recovery_s']} s")
    print(report(results, args, started, outdir))
    say(f"report: {outdir / 'report.md'}")
    return 1 if any(r["breaches"] for r in results) else 0
