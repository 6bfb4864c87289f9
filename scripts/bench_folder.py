#!/usr/bin/env python3
"""The agent's hot-folder throughput with each JPEG decoder (`[device] jpeg_decoder`).

    scripts/bench_folder.py BIN JPEG [--device cuda:0] [--model M] [--decoders cpu,nvjpeg]
                            [--count 3000] [--imgsz 640] [--max-batch 64] [--out DIR]

Runs the agent binary BIN against a real Mosquitto (`--mosquitto`, default `mosquitto` on the
PATH) with one folder source, once per decoder of --decoders. Once the agent is ready (its
/readyz), --count hard links to JPEG appear in the folder at once; the run ends when the agent's
own counters (`yolo_edge_frames`, from its Prometheus endpoint) have every picture finished,
published or failed. Prints one table row per decoder: pictures per second from the first link
to the last picture finished, failures, the batch it ran, and the mean host time per picture
in decoding (or, with nvJPEG, checking the header) and per batch in inference (which, with
nvJPEG, includes the device's decoding). Writes each run's config, log and last scrape under
--out. Only the standard library.
"""

import argparse
import os
import re
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from agent_proc import free_port, start_mosquitto, stop


def scrape(port: int) -> str:
    return urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()


def ready(port: int) -> bool:
    try:
        return urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2).status == 200
    except OSError:
        return False


def frames(text: str) -> dict:
    """Pictures finished, by result."""
    out = {}
    for m in re.finditer(r'^yolo_edge_frames_total\{[^}]*result="(\w+)"[^}]*\} (\d+)', text, re.M):
        out[m[1]] = out.get(m[1], 0) + int(m[2])
    return out


def stage_mean_ms(text: str, stage: str):
    s = re.search(rf'^yolo_edge_stage_duration_seconds_sum\{{stage="{stage}"\}} (\S+)', text, re.M)
    c = re.search(rf'^yolo_edge_stage_duration_seconds_count\{{stage="{stage}"\}} (\S+)', text, re.M)
    if not s or not c or float(c[1]) == 0:
        return None
    return 1e3 * float(s[1]) / float(c[1])


def gauge(text: str, name: str):
    m = re.search(rf"^{name} (\S+)", text, re.M)
    return float(m[1]) if m else None


def run(a, broker_port: int, decoder: str, out: Path) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    inbox = out / "in"
    inbox.mkdir(exist_ok=True)
    mport = free_port()
    cfg = out / "agent.toml"
    cfg.write_text(
        f"""[device]
device = "{a.device}"
imgsz = {a.imgsz}
batch = "auto"
max_batch = {a.max_batch}
max_wait_ms = 20
jpeg_decoder = "{decoder}"

[model]
path = "{Path(a.model).resolve()}"

[mqtt]
host = "127.0.0.1"
port = {broker_port}
device_id = "bench-folder-{decoder}"

[metrics]
listen = "127.0.0.1:{mport}"

[spool]
dir = "{out / 'spool'}"

[[sources]]
type = "folder"
id = "in"
path = "{inbox}"
settle_ms = 20
scan_interval_ms = 100
"""
    )
    log = open(out / "agent.log", "w")
    env = dict(os.environ, RUST_LOG="info,rumqttc=warn")
    agent = subprocess.Popen([a.bin, "run", "--config", str(cfg)], stdout=subprocess.DEVNULL, stderr=log, env=env)
    try:
        deadline = time.monotonic() + a.startup
        while not ready(mport):
            if agent.poll() is not None:
                raise RuntimeError(f"agent exited with {agent.returncode}: see {out / 'agent.log'}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"not ready within {a.startup} s: see {out / 'agent.log'}")
            time.sleep(0.2)
        src = Path(a.jpeg).resolve()
        t0 = time.monotonic()
        for i in range(a.count):
            os.link(src, inbox / f"{i:06d}.jpg")
        text = scrape(mport)
        while sum(frames(text).values()) < a.count:
            if agent.poll() is not None:
                raise RuntimeError(f"agent exited with {agent.returncode}: see {out / 'agent.log'}")
            if time.monotonic() - t0 > a.timeout:
                raise RuntimeError(f"{sum(frames(text).values())} of {a.count} pictures finished within {a.timeout} s")
            time.sleep(0.05)
            text = scrape(mport)
        dt = time.monotonic() - t0
        (out / "metrics.txt").write_text(text)
    finally:
        stop(agent, 60)
        log.close()
    done = frames(text)
    return {
        "decoder": decoder,
        "pictures": a.count,
        "ok": done.get("ok", 0),
        "failed": sum(v for k, v in done.items() if k != "ok"),
        "seconds": dt,
        "img_s": a.count / dt,
        "batch": gauge(text, "yolo_edge_batch_size_current"),
        "decode_ms": stage_mean_ms(text, "decode"),
        "infer_ms": stage_mean_ms(text, "infer"),
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("bin")
    p.add_argument("jpeg", help="the picture every file of the run links to")
    p.add_argument("--device", default="cuda:0")
    p.add_argument("--model", default=str(Path(__file__).resolve().parent.parent / "../shared/fixtures/yolov9t-ball.pt"))
    p.add_argument("--decoders", default="cpu,nvjpeg")
    p.add_argument("--count", type=int, default=3000)
    p.add_argument("--imgsz", type=int, default=640)
    p.add_argument("--max-batch", type=int, default=64)
    p.add_argument("--startup", type=float, default=300, help="seconds for the agent to become ready")
    p.add_argument("--timeout", type=float, default=300, help="seconds for the pictures of a run")
    p.add_argument("--mosquitto", default="mosquitto")
    p.add_argument("--out", default="bench-folder")
    a = p.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    broker, bport = start_mosquitto(a.mosquitto, out)
    print("| decoder | pictures | ok | failed | seconds | img/s | batch | decode ms/picture | infer ms/batch |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    rc = 0
    fmt = lambda v: "" if v is None else f"{v:.2f}"
    try:
        for decoder in a.decoders.split(","):
            try:
                r = run(a, bport, decoder, out / decoder)
            except RuntimeError as e:
                print(f"| {decoder} | {a.count} | | | | | | | error: {e} |")
                rc = 1
                continue
            print(
                f"| {r['decoder']} | {r['pictures']} | {r['ok']} | {r['failed']} | {r['seconds']:.2f} | {r['img_s']:.0f} "
                f"| {fmt(r['batch'])} | {fmt(r['decode_ms'])} | {fmt(r['infer_ms'])} |",
                flush=True,
            )
    finally:
        broker.terminate()
        broker.wait(timeout=10)
    return rc


if __name__ == "__main__":
    sys.exit(main())
