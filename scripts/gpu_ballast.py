"""Memory pressure on a real GPU (issue 4): another tenant takes the agent's memory and gives it
back, and the agent must fall back (halve the batch on out-of-memory, retry the same frames),
lose no frame, process none twice, keep the order, and climb back to its startup batch.

The "other tenant" is this script: PyTorch allocations on the same GPU, in another process.
  1. the tenant takes all but --free-gib; the agent starts (`batch = "auto"`) and plans within
     what is left; it processes --first pictures;
  2. the agent idles, and after `oom.release_idle_s` gives its cached pool memory back (event
     `memory_released`); the tenant then grabs all but --squeeze-gib;
  3. --second pictures arrive: the agent's batch no longer fits -> out-of-memory fallback;
  4. after --free-at of them are done the tenant frees everything -> the agent probes back up.
(Squeezing mid-batch does not bite: the tenant can only take what is free while the agent holds
its working set, which the agent gets back at its next batch. The squeeze lands when the tenant
grabs while the agent is idle, as here.) The second pictures arrive in a second hot folder that
appears at once (a directory renamed into place), so each source's arrival order is known exactly:
the order check is per source (files written one by one while the agent moves others out of the
same folder can be listed out of order by the file system, which says nothing about the agent).
The agent publishes to a broker that is not running, so every detection lands in its on-disk
spool, which this script reads afterwards (u32 LE topic length, topic, JSON payload; one file per
message, in publish order).

Usage (on the GPU machine, from the repo root):
  python3 scripts/gpu_ballast.py --bin /tmp/yolo-edge --model yolov9t-ball.pt \
      --images horses.jpg volleyball-court.jpg --work DIR
Writes DIR/ballast.json, prints a summary; exit 1 if a frame was lost or duplicated, the order
broken, or no fallback or no recovery happened.
"""
import argparse
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

GIB = 1 << 30


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def count(d: Path) -> int:
    try:
        return sum(1 for _ in os.scandir(d))
    except FileNotFoundError:
        return 0


def read_spool(d: Path):
    msgs = []
    for f in sorted(p for p in d.iterdir() if not p.name.startswith(".")):
        b = f.read_bytes()
        n = int.from_bytes(b[:4], "little")
        topic = b[4:4 + n].decode()
        msgs.append((f.name, topic, b[4 + n:]))
    return msgs


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--images", nargs="+", required=True)
    ap.add_argument("--first", type=int, default=1500)
    ap.add_argument("--second", type=int, default=8000)
    ap.add_argument("--work", required=True)
    ap.add_argument("--free-gib", type=float, default=2.0)
    ap.add_argument("--squeeze-gib", type=float, default=0.6)
    ap.add_argument("--free-at", type=float, default=0.25, help="share of --second done when the tenant frees")
    ap.add_argument("--timeout", type=float, default=400)
    a = ap.parse_args()
    import torch

    work = Path(a.work)
    shutil.rmtree(work, ignore_errors=True)
    inbox, inbox2, staging, spool = work / "in", work / "in2", work / "staging", work / "spool"
    inbox.mkdir(parents=True)
    staging.mkdir()
    srcs = [Path(p).read_bytes() for p in a.images]
    n = a.first + a.second
    names = [f"img-{i:05d}.jpg" for i in range(n)]

    for i in range(n):
        ((inbox if i < a.first else staging) / names[i]).write_bytes(srcs[i % len(srcs)])
    cfg = work / "agent.toml"
    cfg.write_text(f"""[device]
device = "cuda:0"
dtype = "f16"
imgsz = 640
batch = "auto"
max_batch = 256
memory_fraction = 0.8
max_wait_ms = 50
decode_threads = 8

[model]
path = "{Path(a.model).resolve()}"
conf = 0.25

[mqtt]
host = "127.0.0.1"
port = {free_port()}
device_id = "ballast-box"
reconnect_min_ms = 1000
reconnect_max_ms = 5000

[[sources]]
type = "folder"
id = "cam"
path = "{inbox}"
settle_ms = 0
scan_interval_ms = 200

[[sources]]
type = "folder"
id = "cam2"
path = "{inbox2}"
done_dir = "{work / 'done2'}"
failed_dir = "{work / 'failed2'}"
settle_ms = 0
scan_interval_ms = 200

[telemetry]
interval_s = 1

[spool]
dir = "{spool}"
max_bytes = "2GiB"

[oom]
quiet_period_s = 3
release_idle_s = 2

[shutdown]
grace_s = 20
""")
    # 1. the other tenant takes all but --free-gib before the agent starts
    free0, total = torch.cuda.mem_get_info()
    ballast = [torch.empty(int(free0 - a.free_gib * GIB), dtype=torch.uint8, device="cuda")]
    torch.cuda.synchronize()
    free1, _ = torch.cuda.mem_get_info()
    timeline = [{"t": 0.0, "what": "tenant leaves --free-gib before the agent starts", "free_gib": round(free1 / GIB, 3)}]
    print(f"GPU {total / GIB:.1f} GiB; ballast leaves {free1 / GIB:.2f} GiB free", flush=True)
    log = open(work / "agent.log", "w")
    t0 = time.time()
    agent = subprocess.Popen([a.bin, "run", "--config", str(cfg)], stdout=log, stderr=subprocess.STDOUT,
                             env={**os.environ, "RUST_LOG": "info", "NO_COLOR": "1"})
    phase = "first"

    def count_done():
        return count(inbox / "done") + count(work / "done2")

    def mark(what, d):
        free, _ = torch.cuda.mem_get_info()
        timeline.append({"t": round(time.time() - t0, 2), "what": what, "done": d, "free_gib": round(free / GIB, 3)})
        print(f"{time.time() - t0:6.1f}s {d} done: {what}, {free / GIB:.2f} GiB free", flush=True)

    try:
        while count_done() < n:
            if agent.poll() is not None:
                raise SystemExit(f"agent exited early with {agent.returncode}")
            if time.time() - t0 > a.timeout:
                raise SystemExit(f"timeout: {count_done()} of {n} done")
            d = count_done()
            if phase == "first" and d >= a.first:
                phase = "idle"
                mark("first pictures done; waiting for the agent to release its idle memory", d)
            elif phase == "idle" and "memory_released" in (work / "agent.log").read_text(errors="replace"):
                free, _ = torch.cuda.mem_get_info()
                try:
                    ballast.append(torch.empty(max(int(free - a.squeeze_gib * GIB), 0), dtype=torch.uint8, device="cuda"))
                    torch.cuda.synchronize()
                except torch.OutOfMemoryError:
                    pass
                mark("agent released its pool; tenant squeezes", d)
                staging.rename(inbox2)
                mark("second folder appears", d)
                phase = "squeezed"
            elif phase == "squeezed" and d >= a.first + a.free_at * a.second:
                ballast.clear()
                torch.cuda.empty_cache()
                mark("tenant frees everything", d)
                phase = "freed"
            time.sleep(0.05)
        # let the results of the last files reach the spool, then stop the agent gracefully
        time.sleep(1.0)
    finally:
        agent.send_signal(signal.SIGTERM)
        try:
            rc = agent.wait(60)
        except subprocess.TimeoutExpired:
            agent.kill()
            rc = "killed"
        log.close()
    elapsed = time.time() - t0
    text = (work / "agent.log").read_text(errors="replace")
    text = re.sub(r"\x1b\[[0-9;]*m", "", text)
    m = re.search(r"agent starting .*?batch=(\d+)", text)
    startup_batch = int(m.group(1)) if m else None
    events = []
    for line in text.splitlines():
        em = re.search(r"yolo_edge::events: (\{.*\}) event=\"(\w+)\"", line)
        if em:
            try:
                events.append((em.group(2), json.loads(em.group(1))))
            except json.JSONDecodeError:
                pass
    dets = []
    for fname, topic, payload in read_spool(spool):
        if "/detections/" in topic:
            dets.append(json.loads(payload))
    got = [Path(d["image"]["path"]).name for d in dets]
    seqs = [d["seq"] for d in dets]
    sizes = [d["batch_size"] for d in dets]
    failed = count(inbox / "failed") + count(work / "failed2")
    per_source = {src: [Path(x["image"]["path"]).name for x in dets if x["source"] == src] for src in ("cam", "cam2")}
    ooms = [e for k, e in events if k == "oom_fallback"]
    changes = [(e.get("from"), e.get("to")) for k, e in events if k == "batch_change"]
    checks = {
        "every frame exactly once": sorted(got) == names and len(got) == n,
        "in order, per source": per_source["cam"] == names[:a.first] and per_source["cam2"] == names[a.first:],
        "seq increasing": all(b > x for x, b in zip(seqs, seqs[1:])),
        "no failed files": failed == 0,
        "fell back on out-of-memory": len(ooms) > 0 and min(sizes) < (startup_batch or 0),
        "recovered to the startup batch": bool(changes) and changes[-1][1] == startup_batch
                                          and startup_batch in sizes[len(sizes) // 2:],
        "agent exited 0": rc == 0,
    }
    # batch-size runs, in order: (size, frames)
    runs = []
    for s in sizes:
        if runs and runs[-1][0] == s:
            runs[-1][1] += 1
        else:
            runs.append([s, 1])
    summary = {
        "n": n, "elapsed_s": round(elapsed, 1), "startup_batch": startup_batch, "detection_messages": len(dets),
        "distinct_images": len(set(got)), "failed_files": failed, "oom_fallback_events": len(ooms),
        "batch_changes": changes, "batch_runs": runs, "timeline": timeline, "checks": checks, "agent_rc": rc,
        "plan_reason": (m.group(1) if (m := re.search(r"agent starting .*? reason=([^\n]*)", text)) else None),
    }
    (work / "ballast.json").write_text(json.dumps(summary, indent=1))
    print(json.dumps({k: summary[k] for k in ("n", "elapsed_s", "startup_batch", "detection_messages", "distinct_images",
                                              "failed_files", "oom_fallback_events", "plan_reason")}))
    for e in timeline:
        print(f"  {e['t']:6.1f}s {e.get('done', 0):5d} done, {e['free_gib']:.2f} GiB free: {e['what']}")
    print("batch changes:", changes)
    print("batch runs (size x frames):", " ".join(f"{s}x{n}" for s, n in runs))
    for k, v in checks.items():
        print(f"  [{'ok' if v else 'FAIL'}] {k}")
    return 0 if all(checks.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
