"""What the agent benchmarks share: a free localhost port and stopping an agent as an operator
would (SIGTERM, then the grace period, then SIGKILL). Only the standard library."""

import signal
import socket
import subprocess


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
