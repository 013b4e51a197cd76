"""A command for a test agent (``pgsnap.agent.serve(path, command=probe)``): it reports
what the process it runs in looks like, waits, fails or dies, as the test asks.

Run as ``python -m tests.integration._agent_probe SOCKET`` from the repository's root:
serves until SIGTERM, printing ``ready`` once the socket takes commands.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import tempfile
import time
from pathlib import Path


def probe(argv: list[str]) -> int:
    """``report CODE``, ``sleep FILE``, ``nap SECONDS``, ``die`` or ``raise``."""
    action, *rest = argv
    if action == "report":
        stdin_tty = os.isatty(0)
        report = {
            "cwd": os.getcwd(),
            "probe": os.environ.get("PROBE"),
            "umask": os.umask(0o022),
            "argv0": sys.argv[0],
            "stdin_tty": stdin_tty,
            "stdout_tty": os.isatty(1),
            "stdin": input() if stdin_tty else sys.stdin.read(),
            "pid": os.getpid(),
            "sid": os.getsid(0),
            "tz": time.strftime("%Z"),
            "tmp": tempfile.gettempdir(),
        }
        print(json.dumps(report), flush=True)
        print("said on stderr", file=sys.stderr)
        return int(rest[0])
    if action == "sleep":  # until Ctrl-C (exit 130) or SIGTERM (written to FILE, exit 143)

        def terminated(_signum: int, _frame: object) -> None:
            Path(rest[0]).write_text("terminated")
            os._exit(143)

        signal.signal(signal.SIGTERM, terminated)
        try:
            print("ready", flush=True)
            time.sleep(60)
        except KeyboardInterrupt:
            print("interrupted", flush=True)
            return 130
        return 0
    if action == "nap":
        print("ready", flush=True)
        time.sleep(float(rest[0]))
        print("rested", flush=True)
        return 0
    if action == "die":
        os.kill(os.getpid(), signal.SIGKILL)
    if action == "raise":
        raise RuntimeError("boom")
    return 64


if __name__ == "__main__":
    from pgsnap.agent import serve

    tempfile.gettempdir()  # cached here, as a module of the agent's might have
    serve(sys.argv[1], command=probe, on_ready=lambda: print("ready", flush=True))
