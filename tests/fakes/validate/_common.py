"""What every recording fake shares: append its argv (JSON, one line) to $FAKE_VALIDATE_LOG, and the mode
chosen by an environment variable. Stdlib only: the fakes run under any python3."""

import json
import os
import sys
import time


def record(tool: str) -> str:
    log = os.environ.get("FAKE_VALIDATE_LOG")
    if log:
        with open(log, "a") as fh:
            fh.write(json.dumps({"tool": tool, "argv": sys.argv[1:]}) + "\n")
    return os.environ.get(f"FAKE_{tool.upper()}_MODE", "pass")


def hang_if(mode: str) -> None:
    """The "hang" mode: what was printed so far goes out, then nothing until the runner kills the group."""
    if mode == "hang":
        sys.stdout.flush()
        time.sleep(60)
