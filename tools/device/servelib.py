"""Shared by serve_check.py and serve_4b.py: start `turbospark serve` and read its address."""
import subprocess


def start(cmd):
    """Runs `cmd` (a `turbospark serve ... --port 0` command line); returns (process, "host:port" or None)."""
    server = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True)
    for line in server.stderr:
        print("serve:", line.rstrip(), flush=True)
        if line.startswith("listening on http://"):
            return server, line.strip()[len("listening on http://"):]
    return server, None
