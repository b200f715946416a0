"""python3 -m loadtest [SCENARIO | gateway | limiter | overhead | rig | faults | scaling] [options]: what
scripts/loadtest runs (see `scripts/loadtest --help`)."""

import signal
import sys

from .common import RunError, say
from .runners import stop_children


def main(argv):
    # The gateway and limiter benchmarks start several servers and
    # generators of their own; each has its own flags.
    if argv[:1] == ["gateway"]:
        from . import gateway_bench

        return gateway_bench.main(argv[1:])
    if argv[:1] == ["limiter"]:
        from . import limiter_bench

        return limiter_bench.main(argv[1:])
    if argv[:1] == ["rig"]:
        from . import rig

        return rig.main(argv[1:])
    if argv[:1] == ["faults"]:
        from . import faults

        return faults.main(argv[1:])
    if argv[:1] == ["overhead"]:
        from . import overhead

        return overhead.main(argv[1:])
    if argv[:1] == ["scaling"]:
        from . import scaling

        return scaling.main(argv[1:])
    from . import service

    return service.main(argv)


def on_sigterm(_signum, _frame):
    # Unwind through the finally blocks: the servers and the throwaway
    # database must not outlive the run.
    raise KeyboardInterrupt


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, on_sigterm)
    try:
        sys.exit(main(sys.argv[1:]))
    except RunError as e:
        stop_children()
        say(f"error: {e}")
        sys.exit(3)
    except KeyboardInterrupt:
        stop_children()
        say("interrupted")
        sys.exit(130)
