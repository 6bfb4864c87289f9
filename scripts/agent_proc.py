"""What the agent benchmarks share: a free localhost port, a Mosquitto broker of their own on
one, and stopping an agent as an operator would (SIGTERM, then the grace period, then SIGKILL).
Only the standard library."""

import signal
import socket
import subprocess
import time
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def stop(agent: subprocess.Popen, grace_s: float) -> None:
    agent.send_signal(signal.SIGTERM)
    try:
        agent.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        agent.kill()
        agent.wait()


def start_mosquitto(mosquitto: str, out: Path, env=None):
    """A broker on a free localhost port, its config and log under `out`; (process, port)."""
    port = free_port()
    (out / "mosquitto.conf").write_text(f"listener {port} 127.0.0.1\nallow_anonymous true\npersistence false\n")
    broker = subprocess.Popen(
        [mosquitto, "-c", str(out / "mosquitto.conf")], stdout=subprocess.DEVNULL, stderr=open(out / "mosquitto.log", "w"), env=env
    )
    time.sleep(0.5)
    return broker, port
