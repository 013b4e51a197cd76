"""The other process of ``test_a_killed_recovery_resumes_from_its_journal``.

Run as ``python -m tests.e2e._lvm_child '<json>'``: attaches to the lvm2 test
VM's console socket, builds the same Cluster as the test, executes the plan and
SIGKILLs itself when the named step has finished (as a crash or ``kill -9``
would stop pgsnap: no handler runs, the journal is what is left).
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

from pgsnap.backends.lvm import LvmBackend
from pgsnap.executor import Event, EventKind
from pgsnap.host import Host
from pgsnap.plan import Plan
from pgsnap.testing.lvmpg import VG, VmPgSetup, make_cluster
from pgsnap.testing.lvmvm import ConsoleRunner


def main(argv: list[str]) -> int:
    args = json.loads(argv[1])
    runner = ConsoleRunner.attach(args["console"])
    backend = LvmBackend(VG, host=Host(runner))
    setup = VmPgSetup(**args["setup"])
    cluster = make_cluster(args["port"], setup, Path(args["base"]), args["bindir"], backend)
    plan = Plan.from_json(Path(args["plan"]).read_text())

    def on_event(event: Event) -> None:
        if event.kind is EventKind.FINISHED and event.step_id == args["kill_after"]:
            os.kill(os.getpid(), signal.SIGKILL)

    cluster.execute(plan, on_event=on_event)
    return 2  # it should have been killed


if __name__ == "__main__":
    sys.exit(main(sys.argv))
