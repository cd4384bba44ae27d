# SPDX-FileCopyrightText: 2026 The gradcomp authors
# SPDX-License-Identifier: Apache-2.0
"""A minimal local launcher: ``python -m gradcomp.launch -n 2 train.py [ARG...]``.

Starts N copies of a script on this machine with the variables ``init_process_group("gloo")``
reads from the environment (RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR,
MASTER_PORT), as torchrun does, and returns the first non-zero exit status (ending the other
ranks when one fails). It was written for Debian 12's torch 1.13, whose torchrun stopped in its
elastic agent before starting any worker; with torch 2.x torchrun works the same way.
"""

import argparse
import os
import socket
import subprocess
import sys
import time


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python3 -m gradcomp.launch", description=__doc__.split("\n")[0])
    parser.add_argument("-n", "--nproc", type=int, default=2, help="processes (ranks) to start")
    parser.add_argument("--port", type=int, default=0, help="MASTER_PORT (default: a free port)")
    parser.add_argument("script")
    parser.add_argument("args", nargs=argparse.REMAINDER)
    a = parser.parse_args(argv)
    if a.nproc < 1:
        parser.error("--nproc must be at least 1")
    port = a.port
    if port == 0:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
    procs = []
    for rank in range(a.nproc):
        env = dict(os.environ, RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(a.nproc),
                   LOCAL_WORLD_SIZE=str(a.nproc), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        env.setdefault("OMP_NUM_THREADS", "1")
        procs.append(subprocess.Popen([sys.executable, a.script] + a.args, env=env))
    status = 0
    try:
        while procs:
            for p in list(procs):
                code = p.poll()
                if code is None:
                    continue
                procs.remove(p)
                if code != 0 and status == 0:
                    status = code
                    for q in procs:
                        q.terminate()
            time.sleep(0.05)
    except KeyboardInterrupt:
        for p in procs:
            p.terminate()
        status = 130
    return status


if __name__ == "__main__":
    sys.exit(main())
