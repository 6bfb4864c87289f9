#!/usr/bin/env python3
"""How many video streams the agent keeps up with, end to end (BENCHMARKS.md, "Cameras").

    scripts/bench_streams.py BIN CLIP [--device cpu|cuda:0] [--streams 1,2,4] [--modes fast,realtime]
                             [--model M] [--imgsz 416] [--max-batch 16] [--seconds 20] [--out DIR]

Runs the agent binary BIN (built with the `gstreamer` feature) against a real Mosquitto
(`--mosquitto`, default `mosquitto` on the PATH) with K `type = "video"` sources, all reading
CLIP, decoder `auto`, for each K of --streams and each pacing of --modes, and reads the agent's
own counters from its Prometheus endpoint (`yolo_edge_stream_frames`):

- `fast`: every stream reads the clip as fast as inference takes its frames (nothing dropped):
  the published frames per second over the run is the agent's capacity for this clip, and
  capacity / 25 the number of 25 fps streams it could carry.
- `realtime`: every stream plays the clip at its frame rate, like a camera: over a window of
  --seconds after a warm-up, the published fps per stream and the share of frames dropped
  (replaced while waiting for inference). A stream is kept up with when it publishes its frame
  rate and drops almost nothing.

Prints one table row per run; writes each run's config, log and counters under --out.
Only the standard library; the clip should be longer than the warm-up plus --seconds.
"""

import argparse
import json
import os
import re
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from agent_proc import free_port, start_mosquitto, stop

REPO = Path(__file__).resolve().parent.parent


def scrape(port: int) -> dict:
    """Per-stream counters and the current batch size from the metrics endpoint."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    streams, decoders, batch = {}, {}, None
    for line in text.splitlines():
        m = re.match(r'yolo_edge_stream_frames_total\{stream="([^"]+)",result="(\w+)"\} (\d+)', line)
        if m:
            streams.setdefault(m[1], {})[m[2]] = int(m[3])
        m = re.match(r'yolo_edge_stream_decoder(?:_info)?\{([^}]*)\}', line)
        if m:
            labels = dict(re.findall(r'(\w+)="([^"]*)"', m[1]))
            decoders[labels.get("stream")] = labels.get("decoder", "")
        m = re.match(r"yolo_edge_batch_size_current (\d+)", line)
        if m:
            batch = int(m[1])
    return {"streams": streams, "decoders": decoders, "batch": batch, "t": time.monotonic()}


def total(s: dict, result: str) -> int:
    return sum(v.get(result, 0) for v in s["streams"].values())


def child_env(a, **extra) -> dict:
    env = dict(os.environ, **extra)
    if a.ld_library_path:
        env["LD_LIBRARY_PATH"] = a.ld_library_path
    return env


def run(a, mosquitto_port: int, mode: str, k: int, out: Path) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    mport = free_port()
    sources = "".join(
        f'[[sources]]\ntype = "video"\nid = "s{i}"\npath = "{Path(a.clip).resolve()}"\npacing = "{mode}"\ndecoder = "auto"\n\n'
        for i in range(k)
    )
    cfg = out / "agent.toml"
    cfg.write_text(
        f"""[device]
device = "{a.device}"
imgsz = {a.imgsz}
batch = "auto"
max_batch = {max(a.max_batch, k)}
max_wait_ms = 20
{f'memory_limit = "{a.memory_limit}"' if a.memory_limit else ""}

[model]
path = "{Path(a.model).resolve()}"

[mqtt]
host = "127.0.0.1"
port = {mosquitto_port}
device_id = "bench-{mode}-{k}"

[metrics]
listen = "127.0.0.1:{mport}"

[spool]
dir = "{out / 'spool'}"

{sources}"""
    )
    log = open(out / "agent.log", "w")
    env = child_env(a, RUST_LOG="info,rumqttc=warn")
    agent = subprocess.Popen([a.bin, "run", "--config", str(cfg)], stdout=subprocess.DEVNULL, stderr=log, env=env)
    samples = []
    try:
        deadline = time.monotonic() + a.startup
        while True:
            if agent.poll() is not None:
                raise RuntimeError(f"agent exited with {agent.returncode}: see {out / 'agent.log'}")
            try:
                s = scrape(mport)
                if len(s["streams"]) == k and total(s, "published") > 0:
                    break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"no frame published within {a.startup} s: see {out / 'agent.log'}")
            time.sleep(0.2)
        if mode == "realtime":
            time.sleep(a.warmup)
            first = scrape(mport)
            time.sleep(a.seconds)
            last = scrape(mport)
            samples = [first, last]
        else:
            # until every stream has read the whole clip: nothing more published for 2 s
            first = prev = scrape(mport)
            samples, last_change = [first], first["t"]
            while time.monotonic() - first["t"] < a.max_fast:
                time.sleep(0.5)
                s = scrape(mport)
                samples.append(s)
                if total(s, "published") != total(prev, "published"):
                    last_change = s["t"]
                elif s["t"] - last_change >= 2.0:
                    break
                prev = s
            final = total(samples[-1], "published")
            last = next(x for x in samples if total(x, "published") == final)
    finally:
        stop(agent, 30)
        log.close()
    (out / "samples.json").write_text(json.dumps(samples, indent=1))
    dt = last["t"] - first["t"]
    pub = {sid: last["streams"][sid].get("published", 0) - first["streams"][sid].get("published", 0) for sid in last["streams"]}
    inn = {sid: last["streams"][sid].get("in", 0) - first["streams"][sid].get("in", 0) for sid in last["streams"]}
    drop = {sid: last["streams"][sid].get("dropped", 0) - first["streams"][sid].get("dropped", 0) for sid in last["streams"]}
    rates = sorted(p / dt for p in pub.values())
    return {
        "mode": mode,
        "streams": k,
        "seconds": dt,
        "published_fps": sum(pub.values()) / dt,
        "per_stream_fps_min": rates[0],
        "per_stream_fps_max": rates[-1],
        "dropped_share": sum(drop.values()) / max(1, sum(inn.values())),
        "batch": last["batch"],
        "decoders": sorted(set(last["decoders"].values())),
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("bin")
    p.add_argument("clip")
    p.add_argument("--device", default="cpu")
    p.add_argument("--streams", default="1,2,4")
    p.add_argument("--modes", default="fast,realtime")
    p.add_argument("--model", default=str(REPO / "models/yolov9t-shapes.safetensors"))
    p.add_argument("--imgsz", type=int, default=416)
    p.add_argument("--max-batch", type=int, default=16)
    p.add_argument("--seconds", type=float, default=20.0, help="realtime: the measured window")
    p.add_argument("--warmup", type=float, default=5.0, help="realtime: seconds after the first frame before the window")
    p.add_argument("--startup", type=float, default=180.0, help="seconds allowed until the first frame is published")
    p.add_argument("--max-fast", type=float, default=600.0, help="fast: the longest a run may take")
    p.add_argument("--fps", type=float, default=25.0, help="the clip's frame rate")
    p.add_argument("--memory-limit", help="[device] memory_limit of the agent, e.g. 4GiB")
    p.add_argument("--mosquitto", default="mosquitto")
    p.add_argument("--ld-library-path", help="LD_LIBRARY_PATH of the agent and the broker only (a bundle of scripts/gst-bundle.sh)")
    p.add_argument("--out", default="target/bench-streams")
    a = p.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    broker, bport = start_mosquitto(a.mosquitto, out, child_env(a))
    rows = []
    try:
        for mode in a.modes.split(","):
            for k in (int(x) for x in a.streams.split(",")):
                try:
                    r = run(a, bport, mode, k, out / f"{mode}-{k}")
                except RuntimeError as e:
                    print(f"{mode} x{k}: {e}", file=sys.stderr)
                    continue
                rows.append(r)
                print(json.dumps(r), file=sys.stderr, flush=True)
    finally:
        broker.terminate()
    (out / "results.json").write_text(json.dumps(rows, indent=1))
    print(f"| pacing | streams | published fps (all) | per stream fps min-max | dropped | = {a.fps:.0f} fps streams | batch | decoder |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['mode']} | {r['streams']} | {r['published_fps']:.1f} | {r['per_stream_fps_min']:.1f}-{r['per_stream_fps_max']:.1f} | "
            f"{100 * r['dropped_share']:.1f} % | {r['published_fps'] / a.fps:.2f} | {r['batch']} | {', '.join(r['decoders'])} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
