"""A stand-in job module for tests/test_trainer_forkserver.py: the fork server runs it as
`python -m forkserver_job ARGS`. It writes what a job process would see of itself to the file
named by its first argument, then does what its second asks."""

import json
import os
import signal
import sys
import time
from pathlib import Path

out, action = Path(sys.argv[1]), sys.argv[2]
print(f"forkserver_job {os.getpid()} to stdout", flush=True)
print(f"forkserver_job {os.getpid()} to stderr", file=sys.stderr, flush=True)
out.write_text(json.dumps({
    "pid": os.getpid(), "sid": os.getsid(0), "ppid": os.getppid(), "argv": sys.argv, "cwd": os.getcwd(),
    "env": os.environ.get("FORKSERVER_TEST_VALUE"), "name": __name__,
    "cmdline": [a.decode() for a in Path(f"/proc/{os.getpid()}/cmdline").read_bytes().split(b"\0") if a],
    "sigterm_default": signal.getsignal(signal.SIGTERM) == signal.SIG_DFL,
    "stdin": sys.stdin.read(),
}))
if action == "raise":
    raise RuntimeError("the job's own error")
if action == "sleep":
    time.sleep(120)
sys.exit(int(action))
