//! The edge agent against a real Mosquitto broker: hot folder throughput and schema, broker
//! restarts, SIGTERM/SIGKILL, config field updates and model swap, TLS + auth, bad input, and
//! the runtime OOM fallback (driven on the CPU by the test-only injector); `yolo-edge demo` end
//! to end (embedded broker, or this test's Mosquitto); `/metrics` scraped by a real Prometheus
//! that answers every dashboard panel's query, promtool on the text and the alert rules, and
//! `/readyz` during model loads.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use common::*;
use image::ImageEncoder;
use yolo_edge::agent::messages::{BatchChangeReason, Detections, EventBody, FrameImage, ImageName, Info, MemoryScope, Status, Telemetry};

const T: Duration = Duration::from_secs(300);

/// seq values must be 1..=n with no gap; duplicates (QoS 1) must repeat the same message.
fn check_seq(dets: &[Detections], n: usize) {
    let by_seq = check_seq_partial(dets);
    assert_eq!(by_seq.len(), n, "distinct seq");
    assert_eq!(by_seq.keys().copied().collect::<Vec<_>>(), (1..=n as u64).collect::<Vec<_>>(), "seq gap-free");
}

/// For a stream that may miss messages: duplicates carry the same picture and first arrivals
/// come in increasing `seq`. Returns seq -> picture.
fn check_seq_partial(dets: &[Detections]) -> BTreeMap<u64, String> {
    let mut by_seq: BTreeMap<u64, String> = BTreeMap::new();
    let mut last_first = 0;
    for v in dets {
        let s = v.seq;
        let img = image_name(v);
        match by_seq.get(&s) {
            Some(prev) => assert_eq!(prev, &img, "duplicate seq {s} carries another image"),
            None => {
                assert!(s > last_first, "seq {s} first seen after {last_first}: out of order");
                last_first = s;
                by_seq.insert(s, img);
            }
        }
    }
    by_seq
}

#[test]
fn hot_folder_500_images_schema_status_info_telemetry() {
    let tmp = tempfile::tempdir().unwrap();
    let Some(broker) = Broker::start(&tmp.path().join("broker"), "") else { return };
    let col = Collector::start(broker.port, "yolo-edge/#", ClientOpts::default());
    let conf = AgentConf::new(tmp.path(), broker.port);
    let cfg = tmp.path().join("agent.toml");
    conf.write(&cfg);
    let mut agent = Agent::spawn(&cfg, &[]);
    wait_until(T, "status online", || col.on("/status").iter().any(|m| m.status() == Status::Online));
    let jpeg = small_jpeg("horses.jpg", 96);
    let names = drop_images(&conf.input, 0, 500, &jpeg);
    wait_until(T, "500 detections", || col.detections().len() >= 500);
    wait_until(T, "all files in done/", || files_in(&conf.input.join("done")).len() == 500);
    std::thread::sleep(Duration::from_millis(300));
    let dets: Vec<_> = col.detections().iter().map(|m| check_detection(m, "box-1")).collect();
    assert_eq!(dets.len(), 500, "exactly one message per image");
    check_seq(&dets, 500);
    let seen: BTreeSet<String> = dets.iter().map(image_name).collect();
    assert_eq!(seen, names.iter().cloned().collect::<BTreeSet<_>>());
    assert_eq!(files_in(&conf.input), Vec::<String>::new(), "input folder drained");
    assert_eq!(files_in(&conf.input.join("done")), names);
    // one image, in order per source: seq follows file name order
    let order: Vec<String> = dets.iter().map(image_name).collect();
    assert_eq!(order, names);

    // telemetry: on time, counters only grow
    let tel: Vec<_> = col.on("/telemetry");
    assert!(tel.len() >= 2, "telemetry messages: {}", tel.len());
    for w in tel.windows(2) {
        let dt = w[1].at.duration_since(w[0].at).as_secs_f64();
        assert!((0.5..=2.5).contains(&dt), "telemetry interval {dt}s for interval_s = 1");
        let (a, b) = (w[0].parse::<Telemetry>().frames, w[1].parse::<Telemetry>().frames);
        let grew = b.ok >= a.ok && b.failed >= a.failed && b.frames_in >= a.frames_in && b.batches >= a.batches;
        assert!(grew, "frames went down: {a:?} -> {b:?}");
        assert!(w[1].parse::<Telemetry>().uptime_s > w[0].parse::<Telemetry>().uptime_s);
    }
    let last: Telemetry = tel.last().unwrap().parse();
    let l = last.latency_ms;
    for (k, p) in [("decode", l.decode), ("infer", l.infer), ("post", l.post)] {
        assert!(p.p99 >= p.p50, "{k}: {p:?}");
    }
    assert!(last.process_memory.rss.unwrap() > 0);
    assert!(last.device_memory.total.unwrap() > 0);
    assert_eq!(last.batch.startup, 4);

    // retained status and info, seen by a late subscriber
    let late = Collector::start(broker.port, "yolo-edge/box-1/+", ClientOpts::default());
    wait_until(Duration::from_secs(10), "retained status+info", || late.on("/status").len() == 1 && late.on("/info").len() == 1);
    let st = &late.on("/status")[0];
    assert!(st.retain && st.status() == Status::Online);
    let info: Info = late.on("/info")[0].parse();
    assert!(late.on("/info")[0].retain);
    assert_eq!(info.model.classes, ["ball"]);
    assert_eq!(info.model.sha256.len(), 64);
    assert_eq!(info.device, "cpu");
    assert_eq!(info.dtype, "f32");
    assert_eq!(info.batch_plan.startup, 4);
    assert_eq!(info.config_sha256.len(), 64);
    assert_eq!(info.sources, ["cam"]);

    agent.signal(libc::SIGTERM);
    assert_eq!(agent.wait(Duration::from_secs(30)), Some(0), "exit code; log:\n{}", agent.log());
    wait_until(Duration::from_secs(10), "offline", || col.on("/status").last().is_some_and(|m| m.status() == Status::Offline));
    // every message on every topic parsed into its type, and each type was seen
    let kinds = col.assert_all_typed();
    for k in ["Detections", "Telemetry", "Info", "Status"] {
        assert!(kinds.get(k).is_some_and(|&n| n > 0), "no {k} message: {kinds:?}");
    }
    late.assert_all_typed();
}

#[test]
fn broker_killed_and_restarted_twice_during_2000_images() {
    let tmp = tempfile::tempdir().unwrap();
    let Some(mut broker) = Broker::start(&tmp.path().join("broker"), "") else { return };
    let col = Collector::start(broker.port, "yolo-edge/#", ClientOpts { id: "restart-sub".into(), persistent: true, ..Default::default() });
    let conf = AgentConf::new(tmp.path(), broker.port);
    let cfg = tmp.path().join("agent.toml");
    conf.write(&cfg);
    let mut agent = Agent::spawn(&cfg, &[]);
    wait_until(T, "status online", || col.on("/status").iter().any(|m| m.status() == Status::Online));
    let jpeg = small_jpeg("horses.jpg", 64);
    let names = drop_images(&conf.input, 0, 2000, &jpeg);
    // the highest seq the subscriber had seen when each stop began
    let mut seen_at_stop: Vec<u64> = Vec::new();
    for (round, at) in [(1, 400usize), (2, 1100)] {
        wait_until(Duration::from_secs(600), "progress before broker stop", || col.detections().len() >= at);
        seen_at_stop.push(col.detections().iter().map(|m| m.parse::<Detections>().seq).max().unwrap_or(0));
        broker.stop();
        // the agent keeps processing into its spool meanwhile
        let done_before = files_in(&conf.input.join("done")).len();
        wait_until(T, "files move to done/ while the broker is down (spooled)", || {
            files_in(&conf.input.join("done")).len() >= done_before + 50
        });
        broker.restart();
        eprintln!("broker restart {round} done");
    }
    // the agent's side: every picture done exactly once and every detection acknowledged by the
    // broker (nothing left in the spool)
    wait_until(Duration::from_secs(600), "all files in done/", || files_in(&conf.input.join("done")).len() == 2000);
    assert_eq!(files_in(&conf.input.join("done")), names);
    wait_until(T, "spool empty", || std::fs::read_dir(&conf.spool).unwrap().count() == 0);
    // the subscriber's side: what a persistent session receives across SIGTERM restarts also
    // depends on the broker's own persistence. mosquitto 2.0.11 was seen to drop messages it had
    // acknowledged to the agent but not yet delivered to the subscriber when it went down, always
    // the run right after what the subscriber had at that stop (seq 401-452 twice on 2026-12-01,
    // once with a window of 20 in flight per client). So a missing seq must lie in such a run:
    // within LOST_AT_STOP after the subscriber's highest seq when a stop began. A gap anywhere
    // else (the agent's side) fails, and the missing ones are listed. Duplicates must carry the
    // same picture, and first arrivals must be in order.
    let distinct = || col.detections().iter().map(|m| m.parse::<Detections>().seq).collect::<BTreeSet<_>>();
    let t0 = std::time::Instant::now();
    while distinct().len() < 2000 && t0.elapsed() < Duration::from_secs(30) {
        std::thread::sleep(Duration::from_millis(200));
    }
    let got = distinct();
    let missing: Vec<u64> = (1..=2000).filter(|s| !got.contains(s)).collect();
    eprintln!("subscriber got {} of 2000 distinct detections; missing seq {missing:?}", got.len());
    const LOST_AT_STOP: u64 = 150;
    let stray: Vec<u64> = missing.iter().copied().filter(|&s| !seen_at_stop.iter().any(|&h| s > h && s <= h + LOST_AT_STOP)).collect();
    assert!(
        stray.is_empty(),
        "subscriber got {} of 2000; missing {missing:?}, of which {stray:?} not right after a broker stop (subscriber at {seen_at_stop:?})",
        got.len()
    );
    let dets: Vec<_> = col.detections().iter().map(|m| check_detection(m, "box-1")).collect();
    assert_eq!(check_seq_partial(&dets).len(), got.len());
    let seen: BTreeSet<String> = dets.iter().map(image_name).collect();
    assert_eq!(seen.len(), got.len(), "one picture per seq");
    // telemetry after the reconnects counts every frame, those processed offline included
    wait_until(T, "telemetry counting all 2000 frames", || {
        col.on("/telemetry").last().is_some_and(|m| m.parse::<Telemetry>().frames.ok == 2000)
    });
    let tel: Telemetry = col.on("/telemetry").last().unwrap().parse();
    assert!(tel.mqtt.reconnects >= 2, "{tel:?}");
    assert!(tel.mqtt.spooled_total >= 100, "{tel:?}");
    // the link's events: each loss, and each return with how long and how much was spooled
    let lost = col.events("mqtt_disconnected");
    let back: Vec<(f64, u64, u32)> = col
        .events("mqtt_reconnected")
        .into_iter()
        .map(|e| match e {
            EventBody::MqttReconnected { down_s, spooled, attempts, .. } => (down_s, spooled, attempts),
            _ => unreachable!(),
        })
        .collect();
    eprintln!("link events: {} lost, back {back:?}", lost.len());
    // the agent reports both returns; the subscriber, itself cut off by each stop, may miss
    // what was published right after a restart (see above), so it must see at least one
    let log = agent.log();
    let spooled_at_return: Vec<u64> = log
        .lines()
        .filter(|l| l.contains("MQTT back after a loss"))
        .filter_map(|l| {
            // the log is coloured: drop the escape sequences, then read `spooled=N`
            let mut plain = String::new();
            let mut esc = false;
            for c in l.chars() {
                match (esc, c) {
                    (false, '\x1b') => esc = true,
                    (true, 'm') => esc = false,
                    (false, c) => plain.push(c),
                    _ => {}
                }
            }
            plain.split("spooled=").nth(1)?.split_whitespace().next()?.parse().ok()
        })
        .collect();
    assert_eq!(spooled_at_return.len(), 2, "the agent saw two losses and returns: {spooled_at_return:?}");
    // each stop lasted until at least 50 files were spooled
    assert!(spooled_at_return.iter().all(|&n| n >= 50), "{spooled_at_return:?}");
    assert!(!lost.is_empty() && !back.is_empty(), "{lost:?} {back:?}");
    for &(down_s, spooled, attempts) in &back {
        assert!(down_s > 0.0 && down_s < 300.0 && attempts >= 1, "{back:?}");
        assert!(spooled <= tel.mqtt.spooled_total, "{back:?}");
    }

    eprintln!("duplicates delivered: {}", dets.len() - got.len());
    agent.signal(libc::SIGTERM);
    assert_eq!(agent.wait(Duration::from_secs(30)), Some(0));
    col.assert_all_typed();
}

#[test]
fn sigterm_mid_run_loses_nothing_and_publishes_offline() {
    let tmp = tempfile::tempdir().unwrap();
    let Some(broker) = Broker::start(&tmp.path().join("broker"), "") else { return };
    let col = Collector::start(broker.port, "yolo-edge/#", ClientOpts::default());
    let conf = AgentConf::new(tmp.path(), broker.port);
    let cfg = tmp.path().join("agent.toml");
    conf.write(&cfg);
    let mut agent = Agent::spawn(&cfg, &[]);
    wait_until(T, "status online", || col.on("/status").iter().any(|m| m.status() == Status::Online));
    let names = drop_images(&conf.input, 0, 400, &small_jpeg("horses.jpg", 96));
    wait_until(T, "some detections", || col.detections().len() >= 60);
    let t = Instant::now();
    agent.signal(libc::SIGTERM);
    assert_eq!(agent.wait(Duration::from_secs(30)), Some(0), "log:\n{}", agent.log());
    assert!(t.elapsed() < Duration::from_secs(20), "exit within grace");
    wait_until(Duration::from_secs(10), "offline", || col.on("/status").last().is_some_and(|m| m.status() == Status::Offline));
    std::thread::sleep(Duration::from_millis(300));
    let left = files_in(&conf.input);
    let done = files_in(&conf.input.join("done"));
    assert!(!left.is_empty(), "SIGTERM came before the end of the run");
    let all: BTreeSet<String> = left.iter().chain(done.iter()).cloned().collect();
    assert_eq!(all.len(), left.len() + done.len(), "a file is in one place only");
    assert_eq!(all, names.iter().cloned().collect(), "no file lost");
    let published: BTreeSet<String> = col.detections().iter().map(|m| image_name(&m.parse())).collect();
    let spooled = std::fs::read_dir(&conf.spool).map(|d| d.count()).unwrap_or(0);
    for f in &done {
        assert!(published.contains(f) || spooled > 0, "{f} in done/ but neither published nor spooled");
    }
    assert_eq!(published.len() + spooled, done.len(), "every done file is published or spooled");
}

#[test]
fn sigkill_mid_run_then_restart_every_file_done_once_and_published() {
    let tmp = tempfile::tempdir().unwrap();
    let Some(broker) = Broker::start(&tmp.path().join("broker"), "") else { return };
    let col = Collector::start(broker.port, "yolo-edge/#", ClientOpts::default());
    let conf = AgentConf::new(tmp.path(), broker.port);
    let cfg = tmp.path().join("agent.toml");
    conf.write(&cfg);
    let mut agent = Agent::spawn(&cfg, &[]);
    wait_until(T, "status online", || col.on("/status").iter().any(|m| m.status() == Status::Online));
    let names = drop_images(&conf.input, 0, 400, &small_jpeg("horses.jpg", 96));
    wait_until(T, "some detections", || col.detections().len() >= 80);
    agent.signal(libc::SIGKILL);
    assert_eq!(agent.wait(Duration::from_secs(10)), None, "killed by signal");
    wait_until(Duration::from_secs(10), "LWT offline", || col.on("/status").last().is_some_and(|m| m.status() == Status::Offline));
    assert!(!files_in(&conf.input).is_empty(), "killed before the end of the run");
    let mut agent = Agent::spawn(&cfg, &[]);
    wait_until(T, "all files in done/", || files_in(&conf.input.join("done")).len() >= 400);
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(files_in(&conf.input.join("done")), names, "every file exactly once in done/");
    wait_until(T, "every image published at least once", || {
        col.detections().iter().map(|m| image_name(&m.parse())).collect::<BTreeSet<_>>().len() == 400
    });
    let boots: BTreeSet<String> = col.detections().iter().map(|m| m.parse::<Detections>().boot_id).collect();
    assert_eq!(boots.len(), 2, "two boots");
    agent.signal(libc::SIGTERM);
    assert_eq!(agent.wait(Duration::from_secs(30)), Some(0));
}

#[test]
fn config_field_updates_valid_invalid_and_model_swap() {
    let tmp = tempfile::tempdir().unwrap();
    let Some(broker) = Broker::start(&tmp.path().join("broker"), "") else { return };
    let col = Collector::start(broker.port, "yolo-edge/#", ClientOpts::default());
    let m1 = tmp.path().join("m1.pt");
    let m2 = tmp.path().join("m2.pt");
    std::fs::copy(fixture("yolov9t-ball.pt"), &m1).unwrap();
    std::fs::copy(fixture("yolov9t-ball.pt"), &m2).unwrap();
    let mut conf = AgentConf::new(tmp.path(), broker.port);
    conf.model = m1.clone();
    let cfg = tmp.path().join("agent.toml");
    conf.write(&cfg);
    let mut agent = Agent::spawn(&cfg, &[]);
    wait_until(T, "info", || !col.on("/info").is_empty());
    let sha0 = col.on("/info").last().unwrap().parse::<Info>().config_sha256;

    // valid edit: thresholds + telemetry interval, applied live
    conf.conf = 0.6;
    conf.telemetry_s = 0.5;
    conf.write(&cfg);
    wait_until(T, "config_applied", || !col.events("config_applied").is_empty());
    let ev = &col.events("config_applied")[0];
    let EventBody::ConfigApplied { changed, .. } = ev else { unreachable!() };
    assert!(changed.iter().any(|c| c == "model.thresholds") && changed.iter().any(|c| c == "telemetry"), "{ev:?}");
    wait_until(T, "info republished with the new config", || col.on("/info").last().unwrap().parse::<Info>().config_sha256 != sha0);

    // invalid edit: rejected with file/line/key, old config keeps running
    let good = conf.toml();
    write_atomic(&cfg, &good.replace("conf = 0.6", "conf = 7.5"));
    wait_until(T, "config_rejected", || !col.events("config_rejected").is_empty());
    let EventBody::ConfigRejected { error: err, running_sha256, .. } = &col.events("config_rejected")[0] else { unreachable!() };
    assert_eq!(running_sha256.len(), 64);
    assert!(err.contains("agent.toml:") && err.contains("model.conf") && err.contains("out of range"), "{err}");
    assert!(agent.alive());
    // the same content is judged once: reads of the file, and writing the same bytes again, wake
    // the watcher but bring no second event over the next 10 s
    let bad = good.replace("conf = 0.6", "conf = 7.5");
    for _ in 0..5 {
        std::thread::sleep(Duration::from_secs(2));
        let _ = std::fs::read(&cfg).unwrap();
        write_atomic(&cfg, &bad);
    }
    assert_eq!(col.events("config_rejected").len(), 1, "a rejected config was judged again");

    // model swap while images flow: no frame dropped
    let names = drop_images(&conf.input, 0, 300, &small_jpeg("horses.jpg", 96));
    wait_until(T, "first detections", || col.detections().len() >= 40);
    conf.model = m2.clone();
    conf.write(&cfg);
    wait_until(T, "model_reloaded", || !col.events("model_reloaded").is_empty());
    let rl = &col.events("model_reloaded")[0];
    assert!(matches!(rl, EventBody::ModelReloaded { path, .. } if path.ends_with("m2.pt")), "{rl:?}");
    wait_until(T, "300 detections", || col.detections().len() >= 300);
    wait_until(T, "all files in done/", || files_in(&conf.input.join("done")).len() == 300);
    let dets: Vec<_> = col.detections().iter().map(|m| check_detection(m, "box-1")).collect();
    check_seq(&dets, 300);
    assert_eq!(dets.iter().map(image_name).collect::<Vec<_>>(), names);
    wait_until(T, "info names the new model", || col.on("/info").last().unwrap().parse::<Info>().model.path.ends_with("m2.pt"));
    // a broken model path is rejected and the running model stays
    write_atomic(&cfg, &conf.toml().replace("m2.pt", "missing.pt"));
    wait_until(T, "second config_rejected", || col.events("config_rejected").len() >= 2);
    drop_images(&conf.input, 300, 5, &small_jpeg("horses.jpg", 96));
    wait_until(T, "agent still detects", || col.detections().len() >= 305);
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(col.events("config_rejected").len(), 2, "the rejected model edit was retried");
    // a model whose file does not have the configured sha256 is rejected before it is parsed;
    // with the right digest the same edit is applied
    let digest = {
        use sha2::Digest;
        format!("{:x}", sha2::Sha256::digest(std::fs::read(&m1).unwrap()))
    };
    let with_sha = |sha: &str| conf.toml().replace("m2.pt\"", &format!("m1.pt\"\nsha256 = \"{sha}\""));
    write_atomic(&cfg, &with_sha(&"0".repeat(64)));
    wait_until(T, "third config_rejected", || col.events("config_rejected").len() >= 3);
    let EventBody::ConfigRejected { error, .. } = &col.events("config_rejected")[2] else { unreachable!() };
    assert!(error.contains("sha256") && error.contains("m1.pt"), "{error}");
    drop_images(&conf.input, 305, 5, &small_jpeg("horses.jpg", 96));
    wait_until(T, "old model still detects", || col.detections().len() >= 310);
    write_atomic(&cfg, &with_sha(&digest.to_uppercase()));
    wait_until(T, "model_reloaded with the right digest", || col.events("model_reloaded").len() >= 2);
    assert!(matches!(&col.events("model_reloaded")[1], EventBody::ModelReloaded { path, .. } if path.ends_with("m1.pt")));
    agent.signal(libc::SIGTERM);
    assert_eq!(agent.wait(Duration::from_secs(30)), Some(0));
    let kinds = col.assert_all_typed();
    assert!(kinds.get("Event").is_some_and(|&n| n >= 4), "{kinds:?}");
}

/// Hostile model files named by config edits while the agent runs: each edit is rejected with
/// exactly one `config_rejected` (none repeated while the file stays), the old model keeps
/// detecting, the agent's peak memory stays within what the one-shot loader is allowed
/// (`tests/model/bad_input.rs` runs it under 1.5 GiB of address space), and SIGTERM still exits 0.
/// A load that overruns `load_timeout_s` is abandoned and rejected; a model rejected as a partial
/// copy is loaded once its file is complete, with no further config edit.
#[test]
fn hostile_model_edits_are_rejected_once_and_the_old_model_serves() {
    use common::hostile;
    let tmp = tempfile::tempdir().unwrap();
    let Some(broker) = Broker::start(&tmp.path().join("broker"), "") else { return };
    let col = Collector::start(broker.port, "yolo-edge/#", ClientOpts::default());
    let conf = AgentConf::new(tmp.path(), broker.port);
    let cfg = tmp.path().join("agent.toml");
    conf.write(&cfg);
    let mut agent = Agent::spawn(&cfg, &[]);
    wait_until(T, "info", || !col.on("/info").is_empty());
    let jpeg = small_jpeg("horses.jpg", 96);
    drop_images(&conf.input, 0, 4, &jpeg);
    wait_until(T, "first detections", || col.detections().len() >= 4);
    let pid = agent.child.id();
    let hwm_before = vm_hwm_kb(pid);

    let files: [(&str, Vec<u8>, &str); 8] = [
        ("nested-lists.pt", hostile::nested_lists(1_000_000), "levels deep"),
        ("nested-tuples.pt", hostile::nested_tuples(1_000_000), "levels deep"),
        ("memo-chain.pt", hostile::memo_chain(400_000), "neither a dict nor a module"),
        ("build-doubling.pt", hostile::build_doubling(), "values"),
        ("shared-modules.pt", hostile::shared_modules(60), "self-module.pt"),
        ("self-module.pt", hostile::self_module(), "self-module.pt"),
        ("storage-bomb.pt", hostile::storage_bomb(), "allowed"),
        ("trillion-elements.pt", hostile::trillion_elements(), "reaches byte"),
    ];
    let good = conf.toml();
    let mut images = 4;
    for (i, (name, bytes, needle)) in files.iter().enumerate() {
        let path = tmp.path().join(name);
        std::fs::write(&path, bytes).unwrap();
        let t = Instant::now();
        write_atomic(&cfg, &good.replace(&conf.model.display().to_string(), &path.display().to_string()));
        wait_until(T, name, || col.events("config_rejected").len() > i);
        let EventBody::ConfigRejected { error, .. } = &col.events("config_rejected")[i] else { unreachable!() };
        eprintln!("{name}: {} bytes, rejected in {:.2} s: {error}", bytes.len(), t.elapsed().as_secs_f64());
        assert!(error.contains(name) && (error.contains(needle) || needle.ends_with(".pt")), "{name}: {error}");
        // the running model still detects
        drop_images(&conf.input, images, 2, &jpeg);
        images += 2;
        wait_until(T, "detections after the rejected edit", || col.detections().len() >= images);
    }
    // none judged again while the files stay
    std::thread::sleep(Duration::from_secs(10));
    assert_eq!(col.events("config_rejected").len(), files.len(), "a rejected edit was judged again");
    let hwm_after = vm_hwm_kb(pid);
    eprintln!("agent VmHWM {hwm_before} kB -> {hwm_after} kB over {} hostile model edits", files.len());
    assert!(hwm_after - hwm_before < 3 << 19, "peak memory grew by {} kB", hwm_after - hwm_before);

    // a deadline too short for any model: abandoned, rejected, the old model serves
    let m2 = tmp.path().join("m2.pt");
    std::fs::copy(fixture("yolov9t-ball.pt"), &m2).unwrap();
    let with_model = |path: &std::path::Path, extra: &str| {
        good.replace(&format!("path = \"{}\"", conf.model.display()), &format!("path = \"{}\"\n{extra}", path.display()))
    };
    write_atomic(&cfg, &with_model(&m2, "load_timeout_s = 0.001"));
    wait_until(T, "timeout rejected", || col.events("config_rejected").len() > files.len());
    let EventBody::ConfigRejected { error, .. } = col.events("config_rejected").pop().unwrap() else { unreachable!() };
    assert!(error.contains("load_timeout_s"), "{error}");
    drop_images(&conf.input, images, 2, &jpeg);
    images += 2;
    wait_until(T, "detections after the timeout", || col.detections().len() >= images);

    // a partial copy, named with the digest of the whole file: rejected; completing the file on
    // disk (no config edit) loads it
    let whole = std::fs::read(fixture("yolov9t-ball.pt")).unwrap();
    let digest = {
        use sha2::Digest;
        format!("{:x}", sha2::Sha256::digest(&whole))
    };
    let late = tmp.path().join("late.pt");
    std::fs::write(&late, &whole[..whole.len() / 2]).unwrap();
    write_atomic(&cfg, &with_model(&late, &format!("sha256 = \"{digest}\"")));
    wait_until(T, "partial copy rejected", || col.events("config_rejected").len() > files.len() + 1);
    let EventBody::ConfigRejected { error, .. } = col.events("config_rejected").pop().unwrap() else { unreachable!() };
    assert!(error.contains("sha256") && error.contains("late.pt"), "{error}");
    assert!(col.events("model_reloaded").is_empty());
    std::fs::write(late.with_extension("part"), &whole).unwrap();
    std::fs::rename(late.with_extension("part"), &late).unwrap();
    wait_until(T, "the completed model loaded", || !col.events("model_reloaded").is_empty());
    assert!(matches!(&col.events("model_reloaded")[0], EventBody::ModelReloaded { path, .. } if path.ends_with("late.pt")));
    wait_until(T, "config_applied", || !col.events("config_applied").is_empty());
    assert_eq!(col.events("config_rejected").len(), files.len() + 2);
    drop_images(&conf.input, images, 2, &jpeg);
    images += 2;
    wait_until(T, "detections with the new model", || col.detections().len() >= images);

    // a hostile edit in flight does not hold shutdown
    write_atomic(&cfg, &good.replace(&conf.model.display().to_string(), &tmp.path().join("memo-chain.pt").display().to_string()));
    std::thread::sleep(Duration::from_millis(200));
    agent.signal(libc::SIGTERM);
    assert_eq!(agent.wait(Duration::from_secs(conf.grace_s as u64)), Some(0));
    let dets: Vec<_> = col.detections().iter().map(|m| check_detection(m, "box-1")).collect();
    check_seq(&dets, images);
    col.assert_all_typed();
}

/// Messages the broker will not take never block the uplink. An MQTT 5 broker that refuses a
/// topic by ACL (a real Mosquitto): each refused detection goes to the spool's dead-letter
/// folder with a `publish_refused` event naming it, and the other source's pictures are
/// delivered. A broker that drops the connection on one message (MQTT 3.1.1): detections then go
/// one at a time, and after `POISON_DROPS` drops with it alone in flight, it is dead-lettered;
/// the pictures before and after it are delivered.
#[test]
fn refused_and_poisoned_messages_are_dead_lettered_and_the_uplink_goes_on() {
    use yolo_edge::agent::publisher::POISON_DROPS;
    let tmp = tempfile::tempdir().unwrap();
    let bdir = tmp.path().join("broker");
    std::fs::create_dir_all(&bdir).unwrap();
    let acl = bdir.join("acl");
    std::fs::write(&acl, "topic readwrite #\ntopic deny yolo-edge/box-1/detections/denied\n").unwrap();
    let Some(broker) = Broker::start(&bdir, &format!("allow_anonymous true\nacl_file {}\n", acl.display())) else { return };
    let col = Collector::start(broker.port, "yolo-edge/#", ClientOpts::default());
    let mut conf = AgentConf::new(tmp.path(), broker.port);
    conf.mqtt_extra = "protocol = \"v5\"\n".into();
    let denied = tmp.path().join("denied");
    std::fs::create_dir_all(&denied).unwrap();
    conf.extra = format!(
        "[[sources]]\ntype = \"folder\"\nid = \"denied\"\npath = \"{}\"\nsettle_ms = 50\nscan_interval_ms = 100\n",
        denied.display()
    );
    let cfg = tmp.path().join("agent.toml");
    conf.write(&cfg);
    let mut agent = Agent::spawn(&cfg, &[]);
    let jpeg = small_jpeg("horses.jpg", 96);
    drop_images(&conf.input, 0, 5, &jpeg);
    drop_images(&denied, 0, 3, &jpeg);
    drop_images(&conf.input, 5, 5, &jpeg);
    // events are QoS 1: a connection lost before their acknowledgement sends them again
    let refused = || {
        col.events("publish_refused")
            .into_iter()
            .map(|ev| {
                let EventBody::PublishRefused { topic, reason, dead_letter } = ev else { unreachable!() };
                (dead_letter.expect("dead-letter path"), (topic, reason))
            })
            .collect::<BTreeMap<_, _>>()
    };
    wait_until(T, "three refused detections", || refused().len() >= 3);
    wait_until(T, "the allowed source's 10 detections", || col.detections().len() >= 10);
    for (path, (topic, reason)) in refused() {
        assert!(topic.ends_with("/detections/denied"), "{topic}");
        // Mosquitto 2.0.11 drops an MQTT 5 connection right after a PUBACK that refuses a publish
        // by ACL; when the reset discards that PUBACK, the refusal is seen as drops
        assert!(reason.contains("NotAuthorized") || reason.contains("dropped the connection"), "{reason}");
        let path = std::path::PathBuf::from(path);
        assert!(path.starts_with(conf.spool.join("dead")) && path.exists(), "{path:?}");
        assert!(std::fs::read(&path).unwrap().windows(6).any(|w| w == b"denied"));
    }
    wait_until(T, "refused inputs completed", || files_in(&denied.join("done")).len() == 3);
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(refused().len(), 3, "a refused message was sent again");
    let dead =
        std::fs::read_dir(conf.spool.join("dead")).unwrap().filter(|e| e.as_ref().unwrap().path().extension().unwrap() == "msg").count();
    assert_eq!(dead, 3);
    let dets: Vec<_> = col.detections().iter().map(|m| check_detection(m, "box-1")).collect();
    assert_eq!(dets.iter().map(image_name).collect::<BTreeSet<_>>().len(), 10);
    wait_until(T, "telemetry counts the dead letters", || {
        col.on("/telemetry").last().is_some_and(|m| m.parse::<Telemetry>().mqtt.dead_letters == 3)
    });
    agent.signal(libc::SIGTERM);
    assert_eq!(agent.wait(Duration::from_secs(30)), Some(0));
    col.assert_all_typed();
    drop(broker);

    // a broker that drops the connection whenever it gets one message
    let poison = PoisonBroker::start(b"tainted");
    let dir = tmp.path().join("drops");
    let mut conf = AgentConf::new(&dir, poison.port);
    conf.spool = dir.join("spool");
    let cfg = dir.join("agent.toml");
    conf.write(&cfg);
    let mut agent = Agent::spawn(&cfg, &[]);
    let mut names = drop_images(&conf.input, 0, 3, &jpeg);
    std::fs::write(conf.input.join("tainted-picture.jpg"), &jpeg).unwrap();
    names.extend(drop_images(&conf.input, 3, 3, &jpeg));
    let events = || poison.on("/events").into_iter().filter(|e| e["type"] == "publish_refused").collect::<Vec<_>>();
    wait_until(Duration::from_secs(60), "the poisoned message dead-lettered", || !events().is_empty());
    // one drop with the full window in flight, then POISON_DROPS with the message alone
    assert_eq!(poison.drops.load(std::sync::atomic::Ordering::SeqCst), POISON_DROPS as usize + 1);
    let ev = &events()[0];
    assert!(ev["reason"].as_str().unwrap().contains("dropped the connection"), "{ev}");
    let path = std::path::PathBuf::from(ev["dead_letter"].as_str().unwrap());
    assert!(std::fs::read(&path).unwrap().windows(7).any(|w| w == b"tainted"));
    // the uplink goes on: everything else, and pictures after it, are delivered
    names.extend(drop_images(&conf.input, 6, 4, &jpeg));
    let delivered = || {
        poison
            .on("/detections/")
            .into_iter()
            .map(|d| image_name(&serde_json::from_value::<Detections>(d).unwrap()))
            .collect::<BTreeSet<_>>()
    };
    wait_until(T, "the other 10 pictures delivered", || delivered().len() >= 10);
    assert_eq!(delivered(), names.iter().cloned().collect(), "every picture but the poisoned one, once");
    wait_until(T, "all inputs done", || files_in(&conf.input.join("done")).len() == 11);
    // one drop with the full window in flight, then POISON_DROPS with the message alone
    assert_eq!(poison.drops.load(std::sync::atomic::Ordering::SeqCst), POISON_DROPS as usize + 1);
    agent.signal(libc::SIGTERM);
    assert_eq!(agent.wait(Duration::from_secs(30)), Some(0));
}

/// The agent letterboxes as `detect` does (rect by default): 1280x720 frames, mixed in one batch
/// with 960x720 ones (two input shapes, one pass each), give the same detections as `yolo-edge
/// detect` on the same files.
#[test]
fn agent_rect_frames_match_detect() {
    let tmp = tempfile::tempdir().unwrap();
    let court = image::open(fixture("volleyball-court.jpg")).unwrap().to_rgb8();
    let frames = tmp.path().join("frames");
    std::fs::create_dir_all(&frames).unwrap();
    let mut files = Vec::new();
    for (i, (x, w)) in [(0, 1280), (640, 1280), (300, 960), (100, 960), (500, 1280), (960, 960)].into_iter().enumerate() {
        let p = frames.join(format!("frame-{i}.png"));
        image::imageops::crop_imm(&court, x, 200, w, 720).to_image().save(&p).unwrap();
        files.push(p);
    }
    let json = tmp.path().join("detect.jsonl");
    let out = yolo_edge()
        .args(["detect", "--device", "cpu", "--imgsz", "640", "--conf", "0.01", "--json"])
        .arg(&json)
        .arg("--model")
        .arg(fixture("yolov9t-ball.pt"))
        .args(&files)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let want: BTreeMap<String, Vec<yolo_edge::vision::postprocess::Detection>> = std::fs::read_to_string(&json)
        .unwrap()
        .lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            let name = std::path::Path::new(v["image"].as_str().unwrap()).file_name().unwrap().to_string_lossy().into_owned();
            (name, serde_json::from_value(v["detections"].clone()).unwrap())
        })
        .collect();

    let Some(broker) = Broker::start(&tmp.path().join("broker"), "") else { return };
    let col = Collector::start(broker.port, "yolo-edge/#", ClientOpts::default());
    let mut conf = AgentConf::new(tmp.path(), broker.port);
    conf.imgsz = 640;
    conf.conf = 0.01;
    conf.batch = 6;
    conf.max_wait_ms = 2000;
    let cfg = tmp.path().join("agent.toml");
    conf.write(&cfg);
    let mut agent = Agent::spawn(&cfg, &[]);
    wait_until(T, "info", || !col.on("/info").is_empty());
    for f in &files {
        std::fs::copy(f, conf.input.join(format!(".{}.tmp", f.file_name().unwrap().to_string_lossy()))).unwrap();
    }
    for f in &files {
        let name = f.file_name().unwrap().to_string_lossy().into_owned();
        std::fs::rename(conf.input.join(format!(".{name}.tmp")), conf.input.join(&name)).unwrap();
    }
    wait_until(T, "six detections messages", || col.detections().len() >= 6);
    let dets: Vec<_> = col.detections().iter().map(|m| check_detection(m, "box-1")).collect();
    assert!(
        dets.iter().any(|d| d.batch_size > 1),
        "the frames never shared a batch: {:?}",
        dets.iter().map(|d| d.batch_size).collect::<Vec<_>>()
    );
    let mut boxes = 0;
    for d in &dets {
        let name = image_name(d);
        let theirs = &want[&name];
        assert_eq!(d.detections.len(), theirs.len(), "{name}");
        for (a, b) in d.detections.iter().zip(theirs) {
            assert_eq!(a.class_id, b.class_id, "{name}");
            let iw = (a.bbox[2].min(b.bbox[2]) - a.bbox[0].max(b.bbox[0])).max(0.0);
            let ih = (a.bbox[3].min(b.bbox[3]) - a.bbox[1].max(b.bbox[1])).max(0.0);
            let area = |x: &[f32; 4]| (x[2] - x[0]) * (x[3] - x[1]);
            let iou = iw * ih / (area(&a.bbox) + area(&b.bbox) - iw * ih);
            assert!(iou >= 0.99 && (a.confidence - b.confidence).abs() <= 1e-3, "{name}: {a:?} vs {b:?}");
            boxes += 1;
        }
    }
    assert!(boxes >= 6, "only {boxes} boxes compared");
    agent.signal(libc::SIGTERM);
    assert_eq!(agent.wait(Duration::from_secs(30)), Some(0));
}

/// `yolo-edge fleet --json` against one broker with 16 agents (the small model on the CPU): all
/// 16 listed online with their model, device, batch and the frames each processed; an agent
/// killed with SIGKILL shows offline (its Last Will) within the keep-alive.
#[test]
fn fleet_lists_sixteen_agents_and_a_killed_one_goes_offline() {
    let tmp = tempfile::tempdir().unwrap();
    let Some(broker) = Broker::start(&tmp.path().join("broker"), "") else { return };
    let col = Collector::start(broker.port, "yolo-edge/+/status", ClientOpts::default());
    let jpeg = small_jpeg("horses.jpg", 64);
    let mut agents = Vec::new();
    for i in 0..16 {
        let dir = tmp.path().join(format!("a{i:02}"));
        std::fs::create_dir_all(&dir).unwrap();
        let mut conf = AgentConf::new(&dir, broker.port);
        conf.device_id = format!("box-{i:02}");
        conf.telemetry_s = 0.5;
        let cfg = dir.join("agent.toml");
        conf.write(&cfg);
        agents.push((Agent::spawn(&cfg, &[]), conf));
    }
    wait_until(T, "16 agents online", || {
        col.on("/status").iter().filter(|m| m.status() == Status::Online).map(|m| m.topic.clone()).collect::<BTreeSet<_>>().len() == 16
    });
    for (i, (_, conf)) in agents.iter().enumerate() {
        drop_images(&conf.input, 0, i % 4, &jpeg);
    }
    for (i, (_, conf)) in agents.iter().enumerate() {
        wait_until(T, "pictures done", || files_in(&conf.input.join("done")).len() == i % 4);
    }
    let fleet = |wait: &str| -> Vec<serde_json::Value> {
        let out =
            yolo_edge().args(["fleet", "--broker", &format!("127.0.0.1:{}", broker.port), "--json", "--wait", wait]).output().unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        serde_json::from_slice(&out.stdout).unwrap()
    };
    // telemetry every 0.5 s: a 2 s window holds a snapshot taken after the pictures were done
    let rows = fleet("2");
    assert_eq!(rows.len(), 16, "{rows:?}");
    for (i, r) in rows.iter().enumerate() {
        assert_eq!(r["device_id"], format!("box-{i:02}"));
        assert_eq!(r["online"], true, "{r}");
        assert!(r["model"].as_str().unwrap().contains("yolov9t"), "{r}");
        assert_eq!((r["device"].as_str().unwrap(), r["dtype"].as_str().unwrap()), ("cpu", "f32"), "{r}");
        assert_eq!(r["batch"], 4, "{r}");
        assert_eq!(r["frames_ok"], (i % 4) as u64, "{r}");
        assert!(r["fps"].is_number() && r["infer_p99_ms"].is_number() && r["last_seen"].is_string(), "{r}");
    }
    // SIGKILL: no clean `offline`; the broker publishes the Last Will after 1.5 keep-alives (5 s)
    let killed = std::time::Instant::now();
    agents[5].0.signal(libc::SIGKILL);
    wait_until(Duration::from_secs(20), "the killed agent's Last Will", || {
        col.on("/status").iter().any(|m| m.topic.contains("box-05") && m.status() == Status::Offline)
    });
    let after = killed.elapsed();
    eprintln!("Last Will after {after:?}");
    assert!(after <= Duration::from_secs(10), "{after:?}");
    let rows = fleet("1");
    let offline: Vec<&str> = rows.iter().filter(|r| r["online"] == false).map(|r| r["device_id"].as_str().unwrap()).collect();
    assert_eq!(offline, ["box-05"]);
    for (i, (agent, _)) in agents.iter_mut().enumerate() {
        if i != 5 {
            agent.signal(libc::SIGTERM);
            assert_eq!(agent.wait(Duration::from_secs(30)), Some(0));
        }
    }
}

/// CA + server certificate for 127.0.0.1/localhost, written as PEM files; returns the CA PEM.
fn make_certs(dir: &std::path::Path) -> Vec<u8> {
    use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair};
    let ca_key = KeyPair::generate().unwrap();
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params.distinguished_name.push(DnType::CommonName, "yolo-edge test CA");
    let ca = ca_params.self_signed(&ca_key).unwrap();
    let key = KeyPair::generate().unwrap();
    let mut params = CertificateParams::new(vec!["localhost".to_string(), "127.0.0.1".to_string()]).unwrap();
    params.distinguished_name.push(DnType::CommonName, "localhost");
    let cert = params.signed_by(&key, &ca, &ca_key).unwrap();
    std::fs::write(dir.join("ca.pem"), ca.pem()).unwrap();
    std::fs::write(dir.join("server.pem"), cert.pem()).unwrap();
    std::fs::write(dir.join("server.key"), key.serialize_pem()).unwrap();
    ca.pem().into_bytes()
}

#[test]
fn tls_username_password_acl_wrong_credentials_refused_and_reported() {
    let tmp = tempfile::tempdir().unwrap();
    let bdir = tmp.path().join("broker");
    std::fs::create_dir_all(&bdir).unwrap();
    if mosquitto().is_none() {
        return;
    }
    let ca = make_certs(&bdir);
    let pw = bdir.join("passwd");
    std::fs::write(&pw, "").unwrap();
    for (u, p) in [("box-1", "s3cret"), ("reader", "r3ad")] {
        let st = std::process::Command::new("mosquitto_passwd")
            .arg("-b")
            .arg(&pw)
            .arg(u)
            .arg(p)
            .status()
            .expect("mosquitto_passwd (mosquitto package)");
        assert!(st.success());
    }
    let acl = bdir.join("acl");
    std::fs::write(
        &acl,
        "user box-1\ntopic write yolo-edge/box-1/#\ntopic read cameras/#\n\nuser reader\ntopic read #\ntopic write cameras/#\n",
    )
    .unwrap();
    let extra = format!(
        "allow_anonymous false\npassword_file {}\nacl_file {}\ncafile {d}/ca.pem\ncertfile {d}/server.pem\nkeyfile {d}/server.key\n",
        pw.display(),
        acl.display(),
        d = bdir.display()
    );
    let Some(broker) = Broker::start(&bdir, &extra) else { return };
    let reader = ClientOpts { username: Some(("reader".into(), "r3ad".into())), ca: Some(ca.clone()), ..Default::default() };
    let col = Collector::start(broker.port, "#", reader);

    let mut conf = AgentConf::new(tmp.path(), broker.port);
    let secret = tmp.path().join("mqtt-password");
    std::fs::write(&secret, "wrong\n").unwrap();
    conf.mqtt_extra = format!(
        "protocol = \"v5\"\nusername = \"box-1\"\npassword_file = \"{}\"\n[mqtt.tls]\nca = \"{}/ca.pem\"\n",
        secret.display(),
        bdir.display()
    );
    let cfg = tmp.path().join("agent.toml");
    conf.write(&cfg);
    let mut agent = Agent::spawn(&cfg, &[]);
    drop_images(&conf.input, 0, 20, &small_jpeg("horses.jpg", 96));
    wait_until(T, "refusal reported in the log", || agent.log().contains("authentication failed"));
    std::thread::sleep(Duration::from_secs(1));
    assert!(agent.alive());
    assert!(col.snapshot().iter().all(|m| !m.topic.starts_with("yolo-edge/")), "nothing published with wrong credentials");
    // nobody can publish anonymously
    let anon = rumqttc::MqttOptions::new("anon", "127.0.0.1", broker.port);
    let mut anon = anon;
    anon.set_transport(rumqttc::Transport::tls_with_config(rumqttc::TlsConfiguration::Simple {
        ca: ca.clone(),
        alpn: None,
        client_auth: None,
    }));
    let (_c, mut conn) = rumqttc::Client::new(anon, 10);
    let refused = conn.iter().take(3).any(|e| matches!(e, Err(rumqttc::ConnectionError::ConnectionRefused(_))));
    assert!(refused, "anonymous connection must be refused");

    // fix the password file and touch the config: the agent reconnects with it, over TLS
    std::fs::write(&secret, "s3cret\n").unwrap();
    write_atomic(&cfg, &format!("{}\n# password rotated\n", conf.toml()));
    wait_until(T, "20 detections over TLS", || col.detections().len() >= 20);
    wait_until(T, "mqtt_refused event delivered once connected", || !col.events("mqtt_refused").is_empty());
    assert!(matches!(col.events("mqtt_refused")[0], EventBody::MqttRefused { auth: true, .. }));
    let dets: Vec<_> = col.detections().iter().map(|m| check_detection(m, "box-1")).collect();
    check_seq(&dets, 20);
    assert!(col.on("/status").iter().any(|m| m.status() == Status::Online));
    agent.signal(libc::SIGTERM);
    assert_eq!(agent.wait(Duration::from_secs(30)), Some(0));
}

#[test]
fn bad_inputs_are_counted_reported_and_moved_to_failed() {
    let tmp = tempfile::tempdir().unwrap();
    let Some(broker) = Broker::start(&tmp.path().join("broker"), "") else { return };
    let col = Collector::start(broker.port, "#", ClientOpts::default());
    let mut conf = AgentConf::new(tmp.path(), broker.port);
    conf.extra = "[input]\nmax_bytes = 200000\nmax_side = 2000\n\n[[sources]]\ntype = \"mqtt\"\ntopic = \"cameras/+/jpeg\"\nid_from_topic_level = 2\n".into();
    let cfg = tmp.path().join("agent.toml");
    conf.write(&cfg);
    let mut agent = Agent::spawn(&cfg, &[]);
    wait_until(T, "online", || col.on("/status").iter().any(|m| m.status() == Status::Online));
    let good = small_jpeg("horses.jpg", 96);
    let dir = &conf.input;
    std::fs::write(dir.join("a-empty.jpg"), b"").unwrap();
    std::fs::write(dir.join("b-corrupt.jpg"), &good[..good.len() / 3]).unwrap();
    std::fs::write(dir.join("c-text.jpg"), b"this is not an image at all").unwrap();
    std::fs::write(dir.join("d-oversized.bin"), vec![0xffu8; 300_000]).unwrap();
    // a PNG whose header claims 30000x30000 pixels
    let mut huge = Vec::new();
    image::codecs::png::PngEncoder::new(&mut huge).write_image(&[0u8; 3], 1, 1, image::ExtendedColorType::Rgb8).unwrap();
    huge[16..20].copy_from_slice(&30000u32.to_be_bytes());
    huge[20..24].copy_from_slice(&30000u32.to_be_bytes());
    std::fs::write(dir.join("e-bomb.png"), &huge).unwrap();
    // links are followed: to a picture (detected; the link moves, the picture stays), to nothing
    // and to a FIFO (both refused, not passed over); a link to a folder is left as a folder is
    let outside = tmp.path().join("outside");
    std::fs::create_dir_all(&outside).unwrap();
    std::fs::write(outside.join("linked.jpg"), &good).unwrap();
    std::os::unix::fs::symlink(outside.join("linked.jpg"), dir.join("f-link.jpg")).unwrap();
    std::os::unix::fs::symlink(outside.join("missing.jpg"), dir.join("g-dangling.jpg")).unwrap();
    let fifo = std::ffi::CString::new(dir.join("h-fifo.jpg").to_str().unwrap()).unwrap();
    // SAFETY: a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o600) }, 0);
    std::os::unix::fs::symlink(&outside, dir.join("i-folder-link")).unwrap();
    drop_images(dir, 0, 2, &good);
    col.publish("cameras/door/jpeg", b"garbage payload".to_vec());
    col.publish("cameras/door/jpeg", Vec::new());
    col.publish("cameras/door/jpeg", good.clone());
    let bad = ["a-empty.jpg", "b-corrupt.jpg", "c-text.jpg", "d-oversized.bin", "e-bomb.png", "g-dangling.jpg", "h-fifo.jpg"];
    let failed = conf.input.join("failed");
    wait_until(T, "bad files in failed/", || bad.iter().all(|b| std::fs::symlink_metadata(failed.join(b)).is_ok()));
    wait_until(T, "good ones detected", || col.detections().len() >= 4);
    wait_until(T, "input_rejected events", || col.events("input_rejected").len() >= 9);
    for b in bad {
        let reason = std::fs::read_to_string(conf.input.join("failed").join(format!("{b}.reason.txt"))).unwrap();
        assert!(!reason.trim().is_empty());
    }
    let rej = col.events("input_rejected");
    let reasons: Vec<String> = rej
        .iter()
        .map(|e| match e {
            EventBody::InputRejected { reason, .. } => reason.clone(),
            _ => unreachable!(),
        })
        .collect();
    assert!(reasons.iter().any(|r| r.contains("empty")), "{reasons:?}");
    assert!(reasons.iter().any(|r| r.contains("limit")), "{reasons:?}");
    assert!(reasons.iter().any(|r| r.contains("not a regular file")), "{reasons:?}");
    let from_door =
        |e: &EventBody| matches!(e, EventBody::InputRejected { source: Some(s), image: Some(ImageName::Id { .. }), .. } if s == "door");
    assert!(rej.iter().any(from_door), "{rej:?}");
    let door: Vec<_> = col.detections().into_iter().filter(|m| m.topic.ends_with("/detections/door")).collect();
    assert_eq!(door.len(), 1);
    check_detection(&door[0], "box-1");
    // files move to done/ once their results are published (the broker acked), so wait for it
    wait_until(T, "the good files and the link in done/", || files_in(&conf.input.join("done")).len() == 3);
    assert!(std::fs::symlink_metadata(conf.input.join("done/f-link.jpg")).unwrap().file_type().is_symlink());
    assert_eq!(std::fs::read(outside.join("linked.jpg")).unwrap(), good, "what the link names stays");
    assert!(conf.input.join("i-folder-link").is_dir(), "a link to a folder is left alone");

    // the folder disappears and comes back
    std::fs::rename(&conf.input, tmp.path().join("moved-away")).unwrap();
    wait_until(T, "source_error event", || !col.events("source_error").is_empty());
    std::fs::create_dir_all(&conf.input).unwrap();
    wait_until(T, "source_recovered event", || !col.events("source_recovered").is_empty());
    drop_images(&conf.input, 10, 1, &good);
    wait_until(T, "agent keeps running", || col.detections().len() >= 5);
    wait_until(T, "telemetry counts failures", || col.on("/telemetry").last().is_some_and(|m| m.parse::<Telemetry>().frames.failed >= 9));
    assert!(agent.alive());
    agent.signal(libc::SIGTERM);
    assert_eq!(agent.wait(Duration::from_secs(30)), Some(0));
    col.assert_all_typed();
}

/// Hot folders and MQTT image topics follow config edits without a restart: a folder whose
/// settings change while its pictures are in the pipeline restarts without taking them twice; a
/// folder and an image topic added start at once; removed, they take nothing more.
#[test]
fn folder_and_mqtt_sources_follow_config_edits() {
    let tmp = tempfile::tempdir().unwrap();
    let Some(broker) = Broker::start(&tmp.path().join("broker"), "") else { return };
    let col = Collector::start(broker.port, "#", ClientOpts::default());
    let mut conf = AgentConf::new(tmp.path(), broker.port);
    // each batch waits, so that pictures are still in the pipeline when the folder restarts
    conf.extra = "[debug]\ninfer_delay_ms = 150\n".into();
    let cfg = tmp.path().join("agent.toml");
    conf.write(&cfg);
    let mut agent = Agent::spawn(&cfg, &[]);
    wait_until(T, "online", || col.on("/status").iter().any(|m| m.status() == Status::Online));
    let good = small_jpeg("horses.jpg", 96);
    let applied = |n: usize| {
        wait_until(T, "config_applied", || col.events("config_applied").len() >= n);
        match col.events("config_applied").remove(n - 1) {
            EventBody::ConfigApplied { changed, restart_required, .. } => {
                assert!(restart_required.is_empty(), "{restart_required:?}");
                changed
            }
            _ => unreachable!(),
        }
    };

    // the folder's settings change while its 16 pictures are in the pipeline
    let names = drop_images(&conf.input, 0, 16, &good);
    wait_until(T, "the first picture detected", || !col.detections().is_empty());
    let text = conf.toml();
    write_atomic(&cfg, &text.replace("settle_ms = 50", "settle_ms = 60"));
    assert_eq!(applied(1), vec!["sources.folders"]);
    wait_until(T, "every picture in done/", || files_in(&conf.input.join("done")).len() == 16);
    std::thread::sleep(Duration::from_millis(500));
    let seen: Vec<String> = col
        .detections()
        .iter()
        .map(|m| std::path::Path::new(m.parse::<Detections>().image.name()).file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    let mut unique = seen.clone();
    unique.sort();
    unique.dedup();
    assert_eq!(seen.len(), 16, "each picture once: {seen:?}");
    assert_eq!(unique, names);

    // a second folder and an image topic added
    let yard = tmp.path().join("yard");
    std::fs::create_dir_all(&yard).unwrap();
    let added = format!(
        "[[sources]]\ntype = \"folder\"\nid = \"yard\"\npath = \"{}\"\nsettle_ms = 50\nscan_interval_ms = 100\n\n\
         [[sources]]\ntype = \"mqtt\"\ntopic = \"cams/+/jpeg\"\nid_from_topic_level = 2\n",
        yard.display()
    );
    let text = format!("{}\n{added}", text.replace("settle_ms = 50", "settle_ms = 60"));
    write_atomic(&cfg, &text);
    assert_eq!(applied(2), vec!["sources.folders", "sources.mqtt"]);
    drop_images(&yard, 100, 2, &good);
    wait_until(T, "a picture on the new topic detected", || {
        col.publish("cams/door/jpeg", good.clone());
        std::thread::sleep(Duration::from_millis(300));
        col.detections().iter().any(|m| m.topic.ends_with("/detections/door"))
    });
    wait_until(T, "the new folder's pictures detected", || {
        col.detections().iter().filter(|m| m.topic.ends_with("/detections/yard")).count() == 2
    });
    let info = col.on("/info").last().unwrap().parse::<Info>();
    assert_eq!(info.sources, vec!["cam", "yard", "cams/+/jpeg"]);

    // the first folder and the topic removed: the yard goes on, the others take nothing more
    let cam_block = format!(
        "[[sources]]\ntype = \"folder\"\nid = \"cam\"\npath = \"{}\"\nsettle_ms = 60\nscan_interval_ms = 100\n",
        conf.input.display()
    );
    assert!(text.contains(&cam_block));
    let mqtt_block = "[[sources]]\ntype = \"mqtt\"\ntopic = \"cams/+/jpeg\"\nid_from_topic_level = 2\n";
    write_atomic(&cfg, &text.replace(&cam_block, "").replace(mqtt_block, ""));
    assert_eq!(applied(3), vec!["sources.folders", "sources.mqtt"]);
    drop_images(&conf.input, 200, 1, &good);
    // a source id of its own: door pictures published above may still be in the pipeline
    col.publish("cams/gate/jpeg", good.clone());
    drop_images(&yard, 300, 1, &good);
    wait_until(T, "the yard goes on", || col.detections().iter().filter(|m| m.topic.ends_with("/detections/yard")).count() == 3);
    std::thread::sleep(Duration::from_secs(1));
    assert!(conf.input.join("img-00200.jpg").exists(), "a removed folder takes nothing");
    assert!(!col.detections().iter().any(|m| m.topic.ends_with("/detections/gate")), "a removed topic");
    assert!(col.events("input_rejected").is_empty(), "a removed topic's message is ignored, not refused");
    assert!(agent.alive());
    agent.signal(libc::SIGTERM);
    assert_eq!(agent.wait(Duration::from_secs(30)), Some(0));
    col.assert_all_typed();
}

/// A broker, a collector on every topic, and an agent speaking MQTT 5 with one MQTT image source
/// (`cameras/+/jpeg`, the second level as source id) after `input` (extra config before it),
/// online. `None` without Mosquitto.
fn start_v5_image_source(dir: &std::path::Path, input: &str) -> Option<(Broker, Collector, Agent)> {
    start_v5_image_source_on(dir, input, "cameras/+/jpeg")
}

/// [`start_v5_image_source`] subscribed to `topic`.
fn start_v5_image_source_on(dir: &std::path::Path, input: &str, topic: &str) -> Option<(Broker, Collector, Agent)> {
    let broker = Broker::start(&dir.join("broker"), "")?;
    let col = Collector::start(broker.port, "#", ClientOpts::default());
    let mut conf = AgentConf::new(dir, broker.port);
    conf.mqtt_extra = "protocol = \"v5\"\n".into();
    conf.extra = format!("{input}[[sources]]\ntype = \"mqtt\"\ntopic = \"{topic}\"\nid_from_topic_level = 2\n");
    let cfg = dir.join("agent.toml");
    conf.write(&cfg);
    let agent = Agent::spawn(&cfg, &[]);
    wait_until(T, "online", || col.on("/status").iter().any(|m| m.status() == Status::Online));
    Some((broker, col, agent))
}

/// Publishes `jpeg` on `topic` with MQTT 5 user properties through Mosquitto's own client.
fn publish_v5(port: u16, topic: &str, jpeg: &std::path::Path, props: &[(&str, &str)]) {
    let mut cmd = std::process::Command::new("mosquitto_pub");
    cmd.args(["-V", "mqttv5", "-h", "127.0.0.1", "-q", "1", "-p", &port.to_string(), "-t", topic, "-f"]).arg(jpeg);
    for (k, v) in props {
        cmd.args(["-D", "publish", "user-property", k, v]);
    }
    let out = cmd.output().expect("mosquitto_pub (package mosquitto-clients)");
    assert!(out.status.success(), "mosquitto_pub: {}", String::from_utf8_lossy(&out.stderr));
}

/// A shared subscription (`$share/<group>/<filter>`): the broker delivers on the picture's own
/// topic, which the agent matches against the filter part; every picture is detected, with its
/// source id from the topic and its `image_id` from the user property.
#[test]
fn mqtt_shared_subscription_delivers_every_picture() {
    let tmp = tempfile::tempdir().unwrap();
    let Some((broker, col, mut agent)) = start_v5_image_source_on(tmp.path(), "", "$share/detectors/cameras/+/jpeg") else { return };
    // the agent's subscription is in place once it is online; give the SUBACK a moment
    std::thread::sleep(Duration::from_millis(500));
    let jpeg = tmp.path().join("door.jpg");
    std::fs::write(&jpeg, small_jpeg("horses.jpg", 96)).unwrap();
    for i in 0..3 {
        publish_v5(broker.port, "cameras/door/jpeg", &jpeg, &[("image_id", &format!("door-{i}"))]);
    }
    publish_v5(broker.port, "cameras/gate/jpeg", &jpeg, &[]);
    wait_until(Duration::from_secs(60), "4 detections", || col.detections().len() >= 4);
    let dets: Vec<Detections> = col.detections().iter().map(|m| check_detection(m, "box-1")).collect();
    let door: Vec<String> = dets
        .iter()
        .filter(|d| d.source == "door")
        .map(|d| match &d.image {
            FrameImage::Id { id, .. } => id.clone(),
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(door, ["door-0", "door-1", "door-2"]);
    assert!(dets
        .iter()
        .any(|d| d.source == "gate" && matches!(&d.image, FrameImage::Id { id, .. } if id.starts_with("cameras/gate/jpeg#"))));
    assert!(col.events("input_rejected").is_empty());
    agent.signal(libc::SIGTERM);
    assert_eq!(agent.wait(Duration::from_secs(30)), Some(0));
    col.assert_all_typed();
}

/// Scaling out through the broker: three agents on one shared subscription
/// (`$share/detectors/cameras/+/jpeg`) and 600 pictures published to one topic. Every picture is
/// detected by exactly one agent, none is lost, and Mosquitto's round robin splits them within
/// 20 % of even.
#[test]
fn shared_subscription_splits_600_pictures_over_three_agents() {
    const N: usize = 600;
    let tmp = tempfile::tempdir().unwrap();
    let Some(broker) = Broker::start(&tmp.path().join("broker"), "") else { return };
    let col = Collector::start(broker.port, "yolo-edge/#", ClientOpts::default());
    let mut agents = Vec::new();
    for i in 0..3 {
        let dir = tmp.path().join(format!("agent-{i}"));
        std::fs::create_dir_all(&dir).unwrap();
        let mut conf = AgentConf::new(&dir, broker.port);
        conf.device_id = format!("box-{i}");
        conf.mqtt_extra = "protocol = \"v5\"\n".into();
        conf.extra = "[[sources]]\ntype = \"mqtt\"\ntopic = \"$share/detectors/cameras/+/jpeg\"\nid_from_topic_level = 2\n".into();
        let cfg = dir.join("agent.toml");
        conf.write(&cfg);
        agents.push(Agent::spawn(&cfg, &[]));
    }
    let online = |i: usize| {
        let topic = format!("yolo-edge/box-{i}/status");
        col.snapshot().iter().any(|m| m.topic == topic && m.status() == Status::Online)
    };
    wait_until(T, "three agents online", || (0..3).all(online));
    // the subscriptions are in place once the agents are online; give the SUBACKs a moment
    std::thread::sleep(Duration::from_millis(500));
    let jpeg = tmp.path().join("door.jpg");
    std::fs::write(&jpeg, small_jpeg("horses.jpg", 96)).unwrap();
    // one shell loop of Mosquitto's own client: 600 QoS 1 publishes, each with its image_id
    let script = format!(
        "for i in $(seq 0 {last}); do mosquitto_pub -V mqttv5 -h 127.0.0.1 -p {port} -q 1 -t cameras/door/jpeg -f '{f}' \
         -D publish user-property image_id door-$i || exit 1; done",
        last = N - 1,
        port = broker.port,
        f = jpeg.display()
    );
    let out = std::process::Command::new("sh").arg("-c").arg(&script).output().expect("sh");
    assert!(out.status.success(), "mosquitto_pub: {}", String::from_utf8_lossy(&out.stderr));

    // picture id -> the agents that detected it (a QoS 1 resend to the same agent counts once)
    let by_id = || {
        let mut m: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for msg in col.detections() {
            let d: Detections = msg.parse();
            let FrameImage::Id { id, .. } = &d.image else { panic!("{:?}", d.image) };
            m.entry(id.clone()).or_default().insert(d.device_id.clone());
        }
        m
    };
    wait_until(Duration::from_secs(240), "600 pictures detected", || by_id().len() >= N);
    std::thread::sleep(Duration::from_secs(1));
    let seen = by_id();
    assert_eq!(seen.len(), N, "picture ids: {:?}", seen.keys().filter(|k| !k.starts_with("door-")).collect::<Vec<_>>());
    let mut per_agent = BTreeMap::new();
    for (id, devices) in &seen {
        assert_eq!(devices.len(), 1, "{id} detected by {devices:?}");
        *per_agent.entry(devices.iter().next().unwrap().clone()).or_insert(0usize) += 1;
    }
    let even = N / 3;
    eprintln!("split over the three agents: {per_agent:?}");
    assert_eq!(per_agent.len(), 3, "{per_agent:?}");
    for (device, n) in &per_agent {
        assert!(n.abs_diff(even) * 5 <= even, "{device} detected {n} of {N} pictures; even is {even} (+-20 %): {per_agent:?}");
    }
    for msg in col.detections() {
        let d: Detections = msg.parse();
        check_detection(&msg, &d.device_id);
        assert_eq!(d.source, "door");
    }
    assert!(col.events("input_rejected").is_empty());
    for a in &mut agents {
        a.signal(libc::SIGTERM);
    }
    for a in &mut agents {
        assert_eq!(a.wait(Duration::from_secs(30)), Some(0));
    }
    col.assert_all_typed();
}

/// The memory watchdog on CPU: `[watchdog] memory_limit`, edited below what the agent holds,
/// gives one `memory_high` (and telemetry says so) and halves the batch at each reading down to 1
/// (`batch_change`, reason `memory_high`), losing no picture; raised again, one `memory_ok`, and
/// the batch probes back up to its startup size after the quiet period. No second event of
/// either kind while each limit stays, though the watchdog reads every 0.2 s.
#[test]
fn memory_watchdog_follows_a_limit_edited_in_the_config() {
    let tmp = tempfile::tempdir().unwrap();
    let Some(broker) = Broker::start(&tmp.path().join("broker"), "") else { return };
    let col = Collector::start(broker.port, "yolo-edge/#", ClientOpts::default());
    let mut conf = AgentConf::new(tmp.path(), broker.port);
    conf.telemetry_s = 0.5;
    conf.batch = 8;
    conf.quiet_s = 1.0;
    let watchdog = |limit: &str| format!("[watchdog]\ninterval_s = 0.2\nmemory_high = 0.9\nmemory_ok = 0.8\nmemory_limit = \"{limit}\"\n");
    conf.extra = watchdog("64GiB");
    let cfg = tmp.path().join("agent.toml");
    conf.write(&cfg);
    let mut agent = Agent::spawn(&cfg, &[]);
    wait_until(T, "info", || !col.on("/info").is_empty());
    std::thread::sleep(Duration::from_secs(1));
    assert!(col.events("memory_high").is_empty() && col.events("memory_ok").is_empty());
    let changes = || -> Vec<(u64, u64, BatchChangeReason)> {
        col.events("batch_change")
            .into_iter()
            .map(|e| match e {
                EventBody::BatchChange { from, to, reason, .. } => (from as u64, to as u64, reason),
                _ => unreachable!(),
            })
            .collect()
    };

    // a loaded agent holds far more than 16 MiB
    conf.extra = watchdog("16MiB");
    conf.write(&cfg);
    wait_until(T, "memory_high", || !col.events("memory_high").is_empty());
    let EventBody::MemoryHigh(high) = &col.events("memory_high")[0] else { unreachable!() };
    assert_eq!(
        (high.scope, high.limit, high.limit_name.as_str(), high.threshold),
        (MemoryScope::Process, 16 << 20, "config:watchdog.memory_limit", 0.9)
    );
    assert!(high.used > high.limit && high.share > 1.0, "{high:?}");
    let down = BatchChangeReason::MemoryHigh;
    wait_until(T, "the batch halved down to 1", || changes().len() >= 3);
    assert_eq!(changes(), [(8, 4, down), (4, 2, down), (2, 1, down)]);
    let tel = |high: bool| col.on("/telemetry").iter().rev().take(1).any(|m| m.parse::<Telemetry>().device_memory.high == high);
    wait_until(T, "telemetry with memory high", || tel(true));
    // pictures keep flowing, one at a time
    let names = drop_images(&conf.input, 0, 20, &small_jpeg("horses.jpg", 96));
    wait_until(T, "20 detections", || col.detections().len() >= 20);
    let dets: Vec<Detections> = col.detections().iter().map(|m| check_detection(m, "box-1")).collect();
    assert_eq!(dets.iter().map(image_name).collect::<Vec<_>>(), names);
    assert!(dets.iter().all(|d| d.batch_size == 1), "{:?}", dets.iter().map(|d| d.batch_size).collect::<Vec<_>>());
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!((col.events("memory_high").len(), col.events("memory_ok").len()), (1, 0));
    assert_eq!(changes().len(), 3, "no probe while memory is high: {:?}", changes());

    conf.extra = watchdog("64GiB");
    conf.write(&cfg);
    wait_until(T, "memory_ok", || !col.events("memory_ok").is_empty());
    let EventBody::MemoryOk(ok) = &col.events("memory_ok")[0] else { unreachable!() };
    assert_eq!((ok.scope, ok.limit, ok.threshold), (MemoryScope::Process, 64 << 30, 0.8));
    assert!(ok.share < 0.8 && ok.used > 16 << 20, "{ok:?}");
    wait_until(T, "telemetry with memory ok", || tel(false));
    let up = BatchChangeReason::Probe;
    wait_until(T, "the batch back at 8", || changes().len() >= 6);
    assert_eq!(changes()[3..], [(1, 2, up), (2, 4, up), (4, 8, up)]);
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!((col.events("memory_high").len(), col.events("memory_ok").len()), (1, 1));
    agent.signal(libc::SIGTERM);
    assert_eq!(agent.wait(Duration::from_secs(30)), Some(0));
    col.assert_all_typed();
}

/// Source ids from outside become topic levels: an id of 70,000 bytes (which would make a topic
/// the broker refuses, and the uplink would retry it forever) and ids with spaces or MQTT
/// wildcards are refused at intake with an event each, never rewritten; a normal picture sent
/// right after them is published within seconds.
#[test]
fn mqtt_source_ids_from_outside_are_checked() {
    let tmp = tempfile::tempdir().unwrap();
    let Some((broker, col, mut agent)) = start_v5_image_source(tmp.path(), "") else { return };
    let jpeg = tmp.path().join("door.jpg");
    std::fs::write(&jpeg, small_jpeg("horses.jpg", 96)).unwrap();
    let long = "x".repeat(70_000);
    publish_v5(broker.port, "cameras/door/jpeg", &jpeg, &[("source", &long)]);
    publish_v5(broker.port, "cameras/door/jpeg", &jpeg, &[("source", "front door")]);
    publish_v5(broker.port, "cameras/door/jpeg", &jpeg, &[("source", "a+#")]);
    publish_v5(broker.port, "cameras/side gate/jpeg", &jpeg, &[]);
    let t0 = Instant::now();
    publish_v5(broker.port, "cameras/door/jpeg", &jpeg, &[("image_id", "frame-1")]);
    wait_until(Duration::from_secs(20), "the normal picture published", || {
        col.detections().iter().any(|m| m.topic.ends_with("/detections/door"))
    });
    let published_s = t0.elapsed().as_secs_f64();
    wait_until(T, "four input_rejected events", || col.events("input_rejected").len() >= 4);
    let rej = col.events("input_rejected");
    assert_eq!(rej.len(), 4, "{rej:?}");
    for e in &rej {
        let EventBody::InputRejected { source, reason, .. } = e else { unreachable!() };
        assert!(source.is_none() && reason.starts_with("source id") && reason.len() < 300, "{e:?}");
    }
    let dets = col.detections();
    assert_eq!(dets.len(), 1, "only the normal picture is published");
    let image = dets[0].parse::<Detections>().image;
    assert!(dets[0].topic.len() < 100 && matches!(&image, FrameImage::Id { id, .. } if id == "frame-1"), "{} {image:?}", dets[0].topic);
    eprintln!("normal picture published {published_s:.2} s after it was sent, behind four refused ones");
    wait_until(T, "telemetry counts the refused ones", || {
        col.on("/telemetry").last().is_some_and(|m| m.parse::<Telemetry>().frames.failed >= 4)
    });
    assert!(agent.alive());
    agent.signal(libc::SIGTERM);
    assert_eq!(agent.wait(Duration::from_secs(30)), Some(0));
    col.assert_all_typed();
}

/// The agent's peak resident set so far (kB), from /proc.
fn vm_hwm_kb(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status.lines().find_map(|l| l.strip_prefix("VmHWM:")).and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok()).unwrap()
}

/// The agent in a real memory cgroup that the test makes (a child of the test's own memory
/// cgroup: the v1 hierarchy on this machine, v2 where that is what the box has), limited to
/// 256 MiB without swap: it plans its batch from the cgroup's headroom (the plan names that
/// cgroup; at 320x320 the limit, not max_batch 64, decides), runs 500 pictures without the kernel's OOM killer acting, and its resident peak
/// stays under the limit. Skips, saying why, where the cgroup cannot be made.
#[test]
fn agent_in_a_memory_cgroup_plans_within_the_limit_and_runs_500_pictures() {
    const LIMIT: u64 = 256 << 20;
    const N: usize = 500;
    let tmp = tempfile::tempdir().unwrap();
    let cg = match MemoryCgroup::create("yolo-edge-test", LIMIT) {
        Ok(cg) => cg,
        Err(why) => {
            eprintln!("skipped: no memory cgroup can be made here: {why}");
            return;
        }
    };
    let Some(broker) = Broker::start(&tmp.path().join("broker"), "") else { return };
    let col = Collector::start(broker.port, "yolo-edge/#", ClientOpts::default());
    let mut conf = AgentConf::new(tmp.path(), broker.port);
    conf.batch = 64;
    conf.batch_auto = true;
    conf.imgsz = 320;
    conf.max_wait_ms = 100;
    let cfg = tmp.path().join("agent.toml");
    conf.write(&cfg);
    let mut agent = Agent::spawn_in(&cg, &cfg);
    wait_until(T, "info", || !col.on("/info").is_empty());
    let info: Info = col.on("/info")[0].parse();
    let plan = info.batch_plan.plan.as_ref().unwrap_or_else(|| panic!("the planner ran: {:?}", info.batch_plan));
    eprintln!(
        "plan in {}: batch {}, budget {} MiB, verified peak {} MiB, bound by {}",
        cg.path,
        plan.batch,
        plan.budget.bytes >> 20,
        plan.verified_peak >> 20,
        plan.budget.limit
    );
    assert!(plan.budget.limit.starts_with("cgroup:") && plan.budget.limit.contains(&cg.path), "the test's cgroup binds: {plan:?}");
    assert!(plan.budget.free < LIMIT, "the headroom under the limit, not the machine's: {plan:?}");
    assert!(plan.verified_peak > 0 && plan.verified_peak <= plan.budget.bytes, "{plan:?}");
    assert!((1..64).contains(&plan.batch), "the limit decides, not max_batch: {plan:?}");

    // 96x63 pictures run at 320x224 (rect): the plan scaled to their pixels, inside the same limit
    let names = drop_images(&conf.input, 0, N, &small_jpeg("horses.jpg", 96));
    let t0 = std::time::Instant::now();
    while col.detections().len() < N {
        if !agent.alive() || t0.elapsed() > T {
            let log = agent.log();
            let tail: Vec<&str> = log.lines().rev().take(30).collect();
            panic!(
                "{} of {N} detections; agent alive: {}; cgroup peak {:?} MiB, OOM kills {:?}; log tail:\n{}",
                col.detections().len(),
                agent.alive(),
                cg.peak().map(|p| p >> 20),
                cg.oom_kills(),
                tail.into_iter().rev().collect::<Vec<_>>().join("\n")
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let shape_batch = shape_batch_320x224(&col, plan.batch as u64, 64) as usize;
    let dets: Vec<_> = col.detections().iter().map(|m| check_detection(m, "box-1")).collect();
    let mut seen: Vec<String> = dets.iter().map(image_name).collect();
    seen.sort();
    seen.dedup();
    let mut want = names.clone();
    want.sort();
    assert_eq!(seen, want, "every picture detected");
    assert!(dets.iter().all(|d| d.batch_size <= shape_batch), "batches at most what the shape allows ({shape_batch})");
    let hwm = vm_hwm_kb(agent.child.id()) << 10;
    eprintln!("agent resident peak {} MiB, cgroup peak {:?} MiB, OOM kills {:?}", hwm >> 20, cg.peak().map(|p| p >> 20), cg.oom_kills());
    assert!(hwm < LIMIT, "resident peak {hwm} under the limit {LIMIT}");
    assert!(agent.alive(), "not OOM-killed; log:\n{}", agent.log());
    assert_eq!(cg.oom_kills().unwrap_or(0), 0);
    agent.signal(libc::SIGTERM);
    assert_eq!(agent.wait(Duration::from_secs(30)), Some(0));
    col.assert_all_typed();
}

/// The MQTT client accepts packets up to `input.max_bytes` (with room for topic and properties),
/// and says so to an MQTT 5 broker: a payload of twice `max_bytes` is never delivered to the
/// agent, its memory does not grow by it, and a normal picture after it is detected.
#[test]
fn mqtt_payloads_over_max_bytes_never_reach_the_agent() {
    let tmp = tempfile::tempdir().unwrap();
    let max_bytes = 2_000_000;
    let Some((broker, col, mut agent)) = start_v5_image_source(tmp.path(), &format!("[input]\nmax_bytes = {max_bytes}\n\n")) else {
        return;
    };
    let jpeg = tmp.path().join("door.jpg");
    std::fs::write(&jpeg, small_jpeg("horses.jpg", 96)).unwrap();
    for i in 0..3 {
        publish_v5(broker.port, "cameras/door/jpeg", &jpeg, &[("image_id", &format!("warm-{i}"))]);
    }
    wait_until(T, "warm-up pictures detected", || col.detections().len() >= 3);
    let before = vm_hwm_kb(agent.child.id());
    let big = tmp.path().join("big.bin");
    std::fs::write(&big, vec![0xffu8; 2 * max_bytes]).unwrap();
    publish_v5(broker.port, "cameras/door/jpeg", &big, &[("image_id", "big")]);
    publish_v5(broker.port, "cameras/door/jpeg", &jpeg, &[("image_id", "after")]);
    wait_until(T, "the picture after the big one detected", || col.detections().len() >= 4);
    let after = vm_hwm_kb(agent.child.id());
    eprintln!("agent VmHWM {before} kB -> {after} kB around a {} kB payload", 2 * max_bytes / 1000);
    assert!((after - before) * 1000 < max_bytes as u64, "peak memory grew by {} kB", after - before);
    let dets = col.detections();
    assert_eq!(dets.len(), 4, "the big payload was delivered");
    assert!(col.events("input_rejected").is_empty(), "the big payload reached the agent");
    assert!(agent.alive());
    agent.signal(libc::SIGTERM);
    assert_eq!(agent.wait(Duration::from_secs(30)), Some(0));
    col.assert_all_typed();
}

/// MQTT 3.1.1 cannot tell the broker the agent's packet cap, so Mosquitto sends a payload of twice
/// `max_bytes` anyway: the client refuses it from the packet's header (the agent's memory does
/// not grow by it), the connection ends with that reason (an `mqtt_disconnected` event) and is
/// made again, and pictures published after it are detected.
#[test]
fn mqtt311_payloads_over_max_bytes_cost_a_reconnect_not_memory() {
    let tmp = tempfile::tempdir().unwrap();
    let max_bytes = 2_000_000;
    let Some(broker) = Broker::start(&tmp.path().join("broker"), "") else { return };
    let col = Collector::start(broker.port, "#", ClientOpts::default());
    let mut conf = AgentConf::new(tmp.path(), broker.port);
    conf.extra =
        format!("[input]\nmax_bytes = {max_bytes}\n\n[[sources]]\ntype = \"mqtt\"\ntopic = \"cameras/+/jpeg\"\nid_from_topic_level = 2\n");
    let cfg = tmp.path().join("agent.toml");
    conf.write(&cfg);
    let mut agent = Agent::spawn(&cfg, &[]);
    wait_until(T, "online", || col.on("/status").iter().any(|m| m.status() == Status::Online));
    let jpeg = tmp.path().join("door.jpg");
    std::fs::write(&jpeg, small_jpeg("horses.jpg", 96)).unwrap();
    let publish = |file: &std::path::Path| {
        let out = std::process::Command::new("mosquitto_pub")
            .args(["-V", "mqttv311", "-h", "127.0.0.1", "-q", "1", "-p", &broker.port.to_string(), "-t", "cameras/door/jpeg", "-f"])
            .arg(file)
            .output()
            .expect("mosquitto_pub (package mosquitto-clients)");
        assert!(out.status.success(), "mosquitto_pub: {}", String::from_utf8_lossy(&out.stderr));
    };
    for _ in 0..3 {
        publish(&jpeg);
    }
    wait_until(T, "warm-up pictures detected", || col.detections().len() >= 3);
    let before = vm_hwm_kb(agent.child.id());
    let big = tmp.path().join("big.bin");
    std::fs::write(&big, vec![0xffu8; 2 * max_bytes]).unwrap();
    publish(&big);
    wait_until(T, "the connection ended on the big packet", || !col.events("mqtt_disconnected").is_empty());
    // a picture published while the agent reconnects is the broker's to drop (a clean session):
    // publish until one is detected
    wait_until(T, "a picture after the big one detected", || {
        publish(&jpeg);
        std::thread::sleep(Duration::from_millis(200));
        col.detections().len() >= 4
    });
    let after = vm_hwm_kb(agent.child.id());
    eprintln!("agent VmHWM {before} kB -> {after} kB around a {} kB payload", 2 * max_bytes / 1000);
    assert!((after - before) * 1000 < max_bytes as u64, "peak memory grew by {} kB", after - before);
    let reasons: Vec<String> = col
        .events("mqtt_disconnected")
        .into_iter()
        .map(|e| match e {
            EventBody::MqttDisconnected { reason } => reason,
            _ => unreachable!(),
        })
        .collect();
    assert!(reasons.iter().any(|r| r.contains("payload size limit exceeded: 4000")), "the reason names the packet's size: {reasons:?}");
    assert!(col.events("input_rejected").is_empty(), "the big payload reached the agent");
    assert!(agent.alive());
    agent.signal(libc::SIGTERM);
    assert_eq!(agent.wait(Duration::from_secs(30)), Some(0));
    col.assert_all_typed();
}

/// `bench` in model mode on the CPU: one row per batch in bench.md, bench.csv and bench.json
/// (which `scripts/bench_compare.py` and `scripts/gpu_run.sh` read), with the median, p99 and
/// throughput of the timed runs, and the chart.
#[test]
fn bench_reports_every_batch_in_markdown_csv_and_json() {
    let tmp = tempfile::tempdir().unwrap();
    let out_dir = tmp.path().join("bench");
    let out = yolo_edge()
        .args(["bench", "--device", "cpu", "--variants", "t", "--dtype", "f32", "--imgsz", "64", "--batches", "1,2"])
        .args(["--mode", "model", "--warmup", "1", "--iters", "3", "--out"])
        .arg(&out_dir)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(out_dir.join("bench.json")).unwrap()).unwrap();
    let rows = v["rows"].as_array().unwrap();
    assert_eq!(rows.iter().map(|r| r["batch"].as_u64().unwrap()).collect::<Vec<_>>(), [1, 2], "{v}");
    for r in rows {
        assert_eq!((r["model"].as_str(), r["mode"].as_str(), r["status"].as_str()), (Some("yolov9t (random)"), Some("model"), Some("ok")));
        let (p50, p99, lo) = (r["latency_ms"].as_f64().unwrap(), r["p99_ms"].as_f64().unwrap(), r["min_ms"].as_f64().unwrap());
        assert!(0.0 < lo && lo <= p50 && p50 <= p99, "min <= p50 <= p99: {r}");
        let ips = r["images_per_s"].as_f64().unwrap();
        let batch = r["batch"].as_f64().unwrap();
        assert!((ips - batch * 1000.0 / p50).abs() < 1e-6 * ips, "img/s = batch / median: {r}");
        assert_eq!(r["iters"], 3, "{r}");
    }
    assert_eq!(v["startup"][0]["model"], "yolov9t (random)");
    let csv = std::fs::read_to_string(out_dir.join("bench.csv")).unwrap();
    let lines: Vec<&str> = csv.lines().collect();
    assert!(lines[0].starts_with("model,dtype,mode,batch,status,latency_ms,"), "{csv}");
    assert_eq!(lines.len(), 3, "a header and a line per batch: {csv}");
    let md = std::fs::read_to_string(out_dir.join("bench.md")).unwrap();
    assert_eq!(md.lines().filter(|l| l.starts_with("| yolov9t (random) | f32 | model |")).count(), 2, "{md}");
    assert!(std::fs::metadata(out_dir.join("bench.png")).unwrap().len() > 0, "the chart");
}

/// `plan --sweep`: every batch of the sweep's ladder up to the chosen one measured and compared
/// with the plan's prediction for the pictures its pass runs (on the CPU, no graphs: the batch
/// itself), and the largest batch that fits found.
#[test]
fn plan_sweep_measures_each_batch_against_the_prediction_for_what_it_runs() {
    let out = yolo_edge()
        .args(["plan", "--model", "random:yolov9t", "--device", "cpu", "--imgsz", "64", "--memory-limit", "48MiB"])
        .args(["--max-batch", "6", "--sweep", "--json"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let (plan, sweep) = (&v["plan"], &v["sweep"]);
    let chosen = plan["batch"].as_u64().unwrap();
    assert_eq!(chosen, 6, "48 MiB holds max_batch 6 at 64x64: {plan}");
    let points = sweep["points"].as_array().unwrap();
    let batches: Vec<u64> = points.iter().map(|p| p["batch"].as_u64().unwrap()).collect();
    assert_eq!(batches, [1, 2, 3, 4, 6], "the sweep's ladder up to max_batch, in order");
    // the plan's own readings, which its prediction returns for a measured batch
    let readings: BTreeMap<u64, u64> =
        plan["fit"]["points"].as_array().unwrap().iter().map(|p| (p[0].as_u64().unwrap(), p[1].as_u64().unwrap())).collect();
    for p in points {
        let (b, runs_as) = (p["batch"].as_u64().unwrap(), p["runs_as"].as_u64().unwrap());
        assert_eq!(runs_as, b, "no graphs on the CPU, so no padding: {p}");
        let (predicted, measured) = (p["predicted"].as_u64().unwrap(), p["measured"].as_u64().unwrap());
        if let Some(&r) = readings.get(&runs_as) {
            assert_eq!(predicted, r, "a measured batch is predicted at its own reading: {p}");
        }
        let error = p["error"].as_f64().unwrap();
        assert!((error - (predicted as f64 - measured as f64) / measured as f64).abs() < 1e-9, "{p}");
        assert!(measured > 0 && p["fits"] == true && p["oom"] == false, "{p}");
    }
    assert_eq!(sweep["largest_fitting"], 6, "every batch up to max_batch fits: {sweep}");
    let worst = points.iter().map(|p| p["error"].as_f64().unwrap().abs()).fold(0.0, f64::max);
    assert_eq!(sweep["worst_error_to_chosen"].as_f64().unwrap(), worst);
}

#[test]
fn planner_chooses_the_batch_from_a_small_cpu_memory_limit() {
    let tmp = tempfile::tempdir().unwrap();
    let Some(broker) = Broker::start(&tmp.path().join("broker"), "") else { return };
    let col = Collector::start(broker.port, "yolo-edge/#", ClientOpts::default());
    let mut conf = AgentConf::new(tmp.path(), broker.port);
    // at 320x320 the model needs ~5-6 MiB more resident memory per picture on the CPU: a
    // 40 MiB cap (32 MiB budget) holds far fewer than max_batch 16 (~100 MiB)
    conf.batch = 16;
    conf.batch_auto = true;
    conf.imgsz = 320;
    conf.device_extra = "memory_limit = \"40MiB\"\nmemory_fraction = 0.8\n".into();
    conf.max_wait_ms = 300;
    let cfg = tmp.path().join("agent.toml");
    conf.write(&cfg);
    let mut agent = Agent::spawn(&cfg, &[]);
    wait_until(T, "info", || !col.on("/info").is_empty());
    let info: Info = col.on("/info")[0].parse();
    let bp = &info.batch_plan;
    let plan = bp.plan.as_ref().unwrap_or_else(|| panic!("the planner ran: {bp:?}"));
    let chosen = plan.batch as u64;
    assert_eq!(bp.startup, chosen);
    assert!((1..16).contains(&chosen), "the memory limit, not max_batch, decides: {plan:?}");
    let budget = plan.budget.bytes as f64;
    let expect = (40.0 * 1048576.0f64).min(plan.budget.free as f64) * 0.8;
    assert!((budget - expect).abs() < 2.0, "budget = min(free, limit) x fraction: {budget} vs {expect}");
    // 40 MiB is below what any test box has free: the config's limit is the one that binds
    assert_eq!(plan.budget.limit, "config:memory_limit", "{plan:?}");
    assert!(plan.reasons[0].ends_with("; bound by config:memory_limit"), "{:?}", plan.reasons);
    let verified = plan.verified_peak;
    assert!(verified > 0 && verified as f64 <= budget, "verified peak within the budget: {plan:?}");
    let steps = &plan.steps;
    let probes: Vec<usize> = steps.iter().filter(|s| s.purpose == "probe").map(|s| s.batch).collect();
    assert_eq!(probes, [1, 2, 4], "{steps:?}");
    let verified_chosen = steps.iter().any(|s| s.purpose == "verify" && s.batch as u64 == chosen && s.outcome == "ok");
    assert!(verified_chosen, "the chosen batch was verified: {steps:?}");
    assert!(steps.iter().all(|s| s.outcome != "ok" || s.batch as u64 <= chosen), "no batch larger than the chosen one fitted: {steps:?}");
    assert!(!plan.reasons.is_empty());
    assert!(bp.reason.starts_with("planned"), "{bp:?}");
    assert!(agent.log().contains("batch plan"), "the decision is logged");

    // 64x42 pictures letterbox (rect) to 320x224: 0.7 of the planned square's pixels, so the plan
    // scaled by pixels holds floor(chosen / 0.7) of them (at most max_batch 16); on the CPU the
    // shape stays at the verified startup batch
    let names = drop_images(&conf.input, 0, 40, &small_jpeg("horses.jpg", 64));
    wait_until(T, "40 detections", || col.detections().len() >= 40);
    let want = shape_batch_320x224(&col, chosen, 16);
    assert_eq!(want, chosen);
    assert_eq!(col.events("shape_planned").len(), 1, "one event for the one shape");
    let dets: Vec<_> = col.detections().iter().map(|m| check_detection(m, "box-1")).collect();
    assert_eq!(dets.iter().map(image_name).collect::<Vec<_>>(), names, "every frame once, in order");
    assert!(dets.iter().all(|d| d.batch_size as u64 <= want), "batches at most what the shape allows ({want})");
    let shape_changes = col
        .events("batch_change")
        .into_iter()
        .filter(|e| matches!(e, EventBody::BatchChange { reason: BatchChangeReason::Shape, .. }))
        .count();
    assert_eq!(shape_changes, 0, "no change of batch for the shape: {:?}", col.events("batch_change"));
    wait_until(T, "telemetry with the shape's ceiling", || {
        col.on("/telemetry").last().is_some_and(|m| {
            let b = m.parse::<Telemetry>().batch;
            b.ceiling == want && b.shape == Some([320, 224])
        })
    });
    // a reloaded model starts again from the startup batch and decides the shape anew
    let m2 = tmp.path().join("m2.pt");
    std::fs::copy(&conf.model, &m2).unwrap();
    conf.model = m2;
    conf.write(&cfg);
    wait_until(T, "model_reloaded", || !col.events("model_reloaded").is_empty());
    let more = drop_images(&conf.input, 40, 40, &small_jpeg("horses.jpg", 64));
    wait_until(T, "80 detections", || col.detections().len() >= 80);
    wait_until(T, "the shape planned again", || col.events("shape_planned").len() == 2);
    let again = shape_batch_320x224(&col, chosen, 16);
    let after: Vec<_> = col.detections()[40..].iter().map(|m| check_detection(m, "box-1")).collect();
    assert_eq!(after.iter().map(image_name).collect::<Vec<_>>(), more, "every picture after the reload once, in order");
    assert!(after.iter().all(|d| d.batch_size as u64 <= again));
    wait_until(T, "telemetry with the plan", || {
        col.on("/telemetry").last().is_some_and(|m| m.parse::<Telemetry>().batch.verified_peak.is_some())
    });
    let tel: Telemetry = col.on("/telemetry").last().unwrap().parse();
    assert_eq!(tel.batch.startup, chosen);
    assert_eq!(tel.batch.verified_peak, Some(verified));
    assert!(tel.process_memory.high_water.unwrap() >= tel.process_memory.used.unwrap() / 2);
    assert!(tel.device_memory.total.unwrap() > 0);
    // the CPU's live figure: MemAvailable, or a cgroup limit's headroom where the test runs under one
    let live = tel.device_memory.limit.as_deref().unwrap_or_default();
    assert!(live == "meminfo:MemAvailable" || live.starts_with("cgroup:/"), "{:?}", tel.device_memory);
    agent.signal(libc::SIGTERM);
    assert_eq!(agent.wait(Duration::from_secs(30)), Some(0));
    col.assert_all_typed();
}

/// The last `shape_planned` event so far, for a 320x224 input planned from `startup` on the CPU:
/// checks its figures and returns the batch that shape runs at. The plan scaled by pixels gives
/// `floor(startup / 0.7)` (at most `max_batch`); on host memory the shape never runs above
/// `startup` and nothing is measured for it (`Plan::decide_shape`).
fn shape_batch_320x224(col: &Collector, startup: u64, max_batch: u64) -> u64 {
    let ev = col.events("shape_planned");
    let Some(EventBody::ShapePlanned { width, height, area_ratio, estimated, batch, verified_peak, startup: s, .. }) = ev.last() else {
        panic!("no shape_planned event");
    };
    eprintln!("shape_planned 320x224 from startup {startup}: {:?}", ev.last());
    assert_eq!((*width, *height, *s as u64), (320, 224, startup));
    assert!((area_ratio - 0.7).abs() < 1e-4);
    let est = ((startup as f64 / 0.7 + 1e-9).floor() as u64).clamp(1, max_batch);
    assert_eq!(*estimated as u64, est);
    assert_eq!(*batch as u64, startup.min(est), "on host memory, the startup batch at most: {:?}", ev.last());
    assert_eq!(*verified_peak, None, "no pass measured above the startup batch on host memory: {:?}", ev.last());
    *batch as u64
}

/// A broker, a collector on all of the agent's topics, and an agent at startup batch `batch`
/// (quiet period 0.3 s) with the test-only OOM injector set to `inject`, online. `None` without
/// Mosquitto.
/// The agent also serves `/metrics` on the returned port.
fn start_injected(dir: &std::path::Path, batch: usize, inject: &str) -> Option<(Broker, Collector, AgentConf, Agent, u16)> {
    let broker = Broker::start(&dir.join("broker"), "")?;
    let col = Collector::start(broker.port, "yolo-edge/#", ClientOpts::default());
    let mut conf = AgentConf::new(dir, broker.port);
    conf.batch = batch;
    conf.max_wait_ms = 500;
    conf.quiet_s = 0.3;
    let port = free_port();
    conf.extra = format!("[debug]\ninject_oom = \"{inject}\"\n\n[metrics]\nlisten = \"127.0.0.1:{port}\"\n");
    let cfg = dir.join("agent.toml");
    conf.write(&cfg);
    let agent = Agent::spawn(&cfg, &[]);
    wait_until(T, "online", || col.on("/status").iter().any(|m| m.status() == Status::Online));
    Some((broker, col, conf, agent, port))
}

/// Drops more pictures in small waves, a quiet period apart, until the agent has climbed back to
/// `startup` (at most 6 waves). The climb happens between batches, one step per quiet period, so
/// a burst processed faster than those periods (a fast or idle box) ends before the climb does.
/// Returns the names dropped, in order.
fn feed_until_recovered(col: &Collector, conf: &AgentConf, start: usize, startup: u64, jpeg: &[u8]) -> Vec<String> {
    let mut names = Vec::new();
    for _ in 0..6 {
        if batch_changes(col).last().is_some_and(|&(_, to)| to == startup) {
            break;
        }
        std::thread::sleep(Duration::from_millis(400));
        let next = start + names.len();
        names.extend(drop_images(&conf.input, next, 16, jpeg));
        wait_until(T, "a wave of 16 detections", || col.detections().len() >= next + 16);
    }
    names
}

/// Drops `n` pictures into an agent started by [`start_injected`], feeds more until it is back at
/// `startup`, and checks that every frame's detection arrived exactly once and in order; returns
/// the detections.
fn run_through_fallback(col: &Collector, conf: &AgentConf, n: usize, startup: u64) -> Vec<Detections> {
    let jpeg = small_jpeg("horses.jpg", 64);
    let mut names = drop_images(&conf.input, 0, n, &jpeg);
    wait_until(T, "the first detections", || col.detections().len() >= n);
    names.extend(feed_until_recovered(col, conf, n, startup, &jpeg));
    let total = names.len();
    wait_until(T, "all files in done/", || files_in(&conf.input.join("done")).len() == total);
    std::thread::sleep(Duration::from_millis(300));
    let dets: Vec<_> = col.detections().iter().map(|m| check_detection(m, "box-1")).collect();
    assert_eq!(dets.len(), total, "every frame exactly once");
    check_seq(&dets, total);
    assert_eq!(dets.iter().map(image_name).collect::<Vec<_>>(), names, "in order");
    dets
}

/// The (from, to) pairs of the agent's `batch_change` events, in order.
fn batch_changes(col: &Collector) -> Vec<(u64, u64)> {
    col.events("batch_change")
        .iter()
        .map(|e| match e {
            EventBody::BatchChange { from, to, .. } => (*from as u64, *to as u64),
            _ => unreachable!(),
        })
        .collect()
}

#[test]
fn oom_injector_halves_batches_and_recovers_without_losing_frames() {
    let tmp = tempfile::tempdir().unwrap();
    let Some((_broker, col, conf, mut agent, port)) = start_injected(tmp.path(), 8, "batch>=4;until=120") else { return };
    let dets = run_through_fallback(&col, &conf, 300, 8);
    let sizes: Vec<u64> = dets.iter().map(|v| v.batch_size as u64).collect();
    let first8 = sizes.iter().position(|&b| b == 8);
    let first2 = sizes.iter().position(|&b| b == 2).expect("batches of 2 after the fallback");
    assert!(sizes[..first2].iter().all(|&b| b < 4), "no batch >= 4 succeeded while injecting: {sizes:?}");
    assert!(first8.is_some_and(|i| i > first2), "recovered to batch 8 after the injector stopped: {sizes:?}");
    let ooms = col.events("oom_fallback");
    let oom_at = |b: usize| ooms.iter().any(|e| matches!(e, EventBody::OomFallback { batch, .. } if *batch == b));
    assert!(oom_at(8) && oom_at(4), "{ooms:?}");
    let changes = batch_changes(&col);
    assert!(changes.contains(&(8, 4)) && changes.contains(&(4, 2)), "halving: {changes:?}");
    assert!(changes.contains(&(2, 4)) && changes.contains(&(4, 8)), "recovery one step at a time: {changes:?}");
    let tel = col.on("/telemetry");
    assert!(tel.last().unwrap().parse::<Telemetry>().batch.oom_fallbacks >= 2);
    // /metrics counts the same fallbacks and frames, and the batch is back at its plan
    let metric = |name: &str| -> Option<f64> {
        let text = http_get(port, "/metrics", "text/plain")?.2;
        text.lines().find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
    };
    wait_until(Duration::from_secs(10), "oom_fallback events all arrived", || {
        metric("yolo_edge_oom_fallbacks_total") == Some(col.events("oom_fallback").len() as f64)
    });
    assert_eq!(metric("yolo_edge_frames_total{source=\"cam\",result=\"ok\"}"), Some(dets.len() as f64));
    assert_eq!((metric("yolo_edge_batch_size_current"), metric("yolo_edge_batch_size_planned")), (Some(8.0), Some(8.0)));
    agent.signal(libc::SIGTERM);
    assert_eq!(agent.wait(Duration::from_secs(30)), Some(0));
    col.assert_all_typed();
}

/// An odd startup batch: the working batch after a fallback is the larger half, so that doubling
/// climbs back to the startup batch itself (5 -> 3 -> 2, then 2 -> 4 -> 5), not one short of it.
#[test]
fn oom_fallback_from_an_odd_batch_recovers_to_it() {
    let tmp = tempfile::tempdir().unwrap();
    let Some((_broker, col, conf, mut agent, _)) = start_injected(tmp.path(), 5, "batch>=3;until=60") else { return };
    let dets = run_through_fallback(&col, &conf, 200, 5);
    let changes = batch_changes(&col);
    assert!(changes.contains(&(5, 3)) && changes.contains(&(3, 2)), "larger half kept: {changes:?}");
    assert!(changes.contains(&(2, 4)) && changes.contains(&(4, 5)), "back to the startup batch: {changes:?}");
    let sizes: Vec<u64> = dets.iter().map(|v| v.batch_size as u64).collect();
    // the injector fails batches of 3 or more until 60 frames are done; then full batches again
    // (a trailing partial batch may be smaller, so "after the last small batch" is not the test)
    assert!(sizes[..50].iter().all(|&b| b < 3), "no batch >= 3 succeeded while injecting: {sizes:?}");
    assert!(sizes[60..].contains(&5), "batches of 5 again after the injector stopped: {sizes:?}");
    agent.signal(libc::SIGTERM);
    assert_eq!(agent.wait(Duration::from_secs(30)), Some(0));
}

/// Throughput of the agent (hot folder -> MQTT, CPU, batch 4) beside the model alone on the
/// same pictures. Run: `cargo test --release --test agent -- --ignored bench_agent --nocapture`
/// (env BENCH_N images, default 400; BENCH_IMGSZ, default 640).
#[test]
#[ignore]
fn bench_agent_vs_model_only() {
    use yolo_edge::detector::Detector;
    let n: usize = std::env::var("BENCH_N").ok().and_then(|v| v.parse().ok()).unwrap_or(400);
    let imgsz: usize = std::env::var("BENCH_IMGSZ").ok().and_then(|v| v.parse().ok()).unwrap_or(640);
    let jpeg = small_jpeg("horses.jpg", 640);
    // model only: letterboxed frames, batches of 4
    let det = Detector::load(&fixture("yolov9t-ball.pt"), &candle_core::Device::Cpu, candle_core::DType::F32, Some(imgsz)).unwrap();
    let img = yolo_edge::vision::preprocess::decode_image(&jpeg, &Default::default()).unwrap();
    let lb = yolo_edge::vision::preprocess::letterbox(&img, imgsz as u32);
    let th = yolo_edge::vision::postprocess::Thresholds::default();
    let batch: Vec<_> = (0..4).map(|_| &lb).collect();
    det.detect(&batch, &th).unwrap();
    let t = Instant::now();
    for _ in 0..n / 4 {
        det.detect(&batch, &th).unwrap();
    }
    let model_fps = (n / 4 * 4) as f64 / t.elapsed().as_secs_f64();
    drop(det);

    let tmp = tempfile::tempdir().unwrap();
    let Some(broker) = Broker::start(&tmp.path().join("broker"), "") else { return };
    let col = Collector::start(broker.port, "yolo-edge/#", ClientOpts::default());
    let conf = AgentConf::new(tmp.path(), broker.port);
    let cfg = tmp.path().join("agent.toml");
    std::fs::write(&cfg, conf.toml().replace("imgsz = 160", &format!("imgsz = {imgsz}")).replace("max_wait_ms = 20", "max_wait_ms = 50"))
        .unwrap();
    let mut agent = Agent::spawn(&cfg, &[]);
    wait_until(T, "online", || col.on("/status").iter().any(|m| m.status() == Status::Online));
    // stage the files first, then move them in at once
    let stage = tmp.path().join("stage");
    std::fs::create_dir_all(&stage).unwrap();
    let names = drop_images(&stage, 0, n, &jpeg);
    let t = Instant::now();
    for f in &names {
        std::fs::rename(stage.join(f), conf.input.join(f)).unwrap();
    }
    wait_until(Duration::from_secs(3600), "all detections", || col.detections().len() >= n);
    let agent_fps = n as f64 / t.elapsed().as_secs_f64();
    let overhead = (1.0 - agent_fps / model_fps) * 100.0;
    println!("| imgsz | batch | model-only (img/s) | agent hot folder -> MQTT (img/s) | overhead |");
    println!("| {imgsz} | 4 | {model_fps:.2} | {agent_fps:.2} | {overhead:.1}% |");
    agent.signal(libc::SIGTERM);
    assert_eq!(agent.wait(Duration::from_secs(60)), Some(0));
}

/// The lines of a demo's output that report one picture's detections, by picture name.
fn demo_detection_lines(stdout: &str) -> BTreeMap<String, String> {
    stdout
        .lines()
        .filter_map(|l| l.strip_prefix("detections  "))
        .map(|l| (l.split_whitespace().next().unwrap().to_string(), l.to_string()))
        .collect()
}

/// `found` and `drawn` of the demo summary's `check` line.
fn demo_check(stdout: &str) -> (usize, usize) {
    let line = stdout.lines().find(|l| l.trim_start().starts_with("check ")).unwrap_or_else(|| panic!("no check line:\n{stdout}"));
    let w: Vec<&str> = line.split_whitespace().collect();
    assert_eq!((w[2], w[4]), ("of", "drawn"), "{line}");
    (w[1].parse().unwrap(), w[3].parse().unwrap())
}

#[test]
fn demo_end_to_end_with_embedded_broker() {
    let tmp = tempfile::tempdir().unwrap();
    let annotated = tmp.path().join("annotated");
    let r = run_demo(tmp.path(), &["--device", "cpu", "--annotate", annotated.to_str().unwrap()], Duration::from_secs(300));
    let all = format!("stdout:\n{}\nstderr:\n{}", r.stdout, r.stderr);
    assert_eq!(r.code, Some(0), "{all}");
    assert!(r.stdout.contains("(embedded rumqttd)"), "{all}");
    // the subscriber saw the agent's real messages
    assert!(r.stdout.lines().any(|l| l == "status      online"), "{all}");
    assert!(
        r.stdout.lines().any(|l| l
            .starts_with("info        model yolov9t:182a7e7c1428 (5 classes: circle, square, triangle, star, ring) on cpu f32, 416 px")),
        "{all}"
    );
    assert!(r.stdout.lines().any(|l| l.starts_with("telemetry   frames ")), "{all}");
    assert!(r.stdout.lines().any(|l| l == "status      offline"), "{all}");
    // every sample picture reported, once, with detections of the demo classes
    let dets = demo_detection_lines(&r.stdout);
    let names: Vec<String> = (1..=6).map(|i| format!("sample-{i:02}.png")).collect();
    assert_eq!(dets.keys().cloned().collect::<Vec<_>>(), names, "{all}");
    assert_eq!(r.stdout.lines().filter(|l| l.starts_with("detections  ")).count(), 6, "one line per picture\n{all}");
    for class in ["circle", "square", "triangle", "star", "ring"] {
        assert!(dets.values().any(|l| l.contains(&format!(" {class} 0."))), "no {class} detected\n{all}");
    }
    // the summary, and the check against the drawn objects
    assert!(r.stdout.contains("\nsummary\n"), "{all}");
    assert!(r.stdout.contains("  pictures    6 written, 6 reported, 0 failed"), "{all}");
    let (found, drawn) = demo_check(&r.stdout);
    assert_eq!(drawn, 18, "{all}");
    assert!(found * 10 >= drawn * 8, "found {found} of {drawn}\n{all}");
    for k in ["  batch       ", "  memory      peak ", "  throughput  ", "  wall time   "] {
        assert!(r.stdout.contains(k), "summary lacks `{k}`\n{all}");
    }
    // the broker's own logging stays out of the output
    assert!(!r.stderr.contains("rumqttd") && !r.stdout.contains("rumqttd::"), "{all}");
    // annotated pictures: the samples with boxes drawn on them
    let scenes = yolo_edge::demo::samples::scenes();
    for (i, name) in names.iter().enumerate() {
        let img = image::open(annotated.join(name)).unwrap_or_else(|e| panic!("{name}: {e}")).to_rgb8();
        assert_eq!(img.dimensions(), scenes[i].image.dimensions());
        assert_ne!(img, scenes[i].image, "{name}: no boxes drawn");
    }
}

#[test]
fn demo_publishes_to_a_named_broker() {
    let tmp = tempfile::tempdir().unwrap();
    let Some(broker) = Broker::start(&tmp.path().join("broker"), "") else { return };
    let col = Collector::start(broker.port, "yolo-edge/#", ClientOpts::default());
    let addr = format!("127.0.0.1:{}", broker.port);
    let r = run_demo(
        &tmp.path().join("demo"),
        &["--device", "cpu", "--broker", &addr, "--images", "3", "--batch", "2"],
        Duration::from_secs(300),
    );
    let all = format!("stdout:\n{}\nstderr:\n{}", r.stdout, r.stderr);
    assert_eq!(r.code, Some(0), "{all}");
    assert!(r.stdout.lines().any(|l| l == format!("broker      {addr}")), "{all}");
    assert!(r.stdout.contains("  pictures    3 written, 3 reported, 0 failed"), "{all}");
    assert!(r.stdout.contains("  batch       2 (fixed by config"), "{all}");
    // the test's own subscriber got the same detections through Mosquitto
    wait_until(Duration::from_secs(10), "offline status", || col.on("/status").last().is_some_and(|m| m.status() == Status::Offline));
    let msgs = col.detections();
    let device_id = msgs.first().map(|m| m.topic.split('/').nth(1).unwrap().to_string()).expect("no detections");
    assert!(device_id.starts_with("demo-"), "{device_id}");
    let dets: Vec<_> = msgs.iter().map(|m| check_detection(m, &device_id)).collect();
    let seen: BTreeSet<String> = dets.iter().map(image_name).collect();
    assert_eq!(seen, ["sample-01.png", "sample-02.png", "sample-03.png"].map(String::from).into_iter().collect::<BTreeSet<_>>(), "{all}");
    let labels: BTreeSet<String> = dets.iter().flat_map(|v| v.detections.iter().map(|d| d.label.clone())).collect();
    assert!(labels.iter().all(|l| ["circle", "square", "triangle", "star", "ring"].contains(&l.as_str())), "{labels:?}");
    assert!(labels.len() >= 4, "classes seen: {labels:?}");
    for v in &dets {
        assert!(!v.detections.is_empty(), "{v:?}");
        assert!(v.batch_size <= 2, "{v:?}");
    }
    let info: Info = col.on("/info").last().unwrap().parse();
    assert_eq!(info.model.classes, ["circle", "square", "triangle", "star", "ring"]);
    col.assert_all_typed();
}

#[test]
fn demo_exits_7_when_the_named_broker_is_unreachable() {
    let tmp = tempfile::tempdir().unwrap();
    let addr = format!("127.0.0.1:{}", free_port());
    let r = run_demo(tmp.path(), &["--broker", &addr], Duration::from_secs(60));
    assert_eq!(r.code, Some(7), "stdout:\n{}\nstderr:\n{}", r.stdout, r.stderr);
    assert!(r.stderr.contains(&format!("cannot reach the MQTT broker at {addr}")), "{}", r.stderr);
}

/// The dashboard's queries (every target of every panel), with the `instance` variable matching all.
fn dashboard_exprs() -> Vec<(String, String)> {
    let text = std::fs::read_to_string(manifest().join("deploy/grafana/yolo-edge.json")).unwrap();
    let d: serde_json::Value = serde_json::from_str(&text).unwrap();
    let mut out = Vec::new();
    for p in d["panels"].as_array().unwrap() {
        for t in p["targets"].as_array().unwrap() {
            out.push((p["title"].as_str().unwrap().to_string(), t["expr"].as_str().unwrap().replace("$instance", ".+")));
        }
    }
    out
}

/// `jpeg_decoder = "nvjpeg"` where nvJPEG cannot run (the tests' build has no CUDA) stops the
/// agent at start-up with the device's exit code, before any source or broker; on
/// `device = "cpu"` it is a config error at its line.
#[test]
fn nvjpeg_where_it_cannot_run_stops_the_agent_at_start() {
    let tmp = tempfile::tempdir().unwrap();
    let conf = AgentConf::new(tmp.path(), free_port());
    let path = tmp.path().join("agent.toml");
    let with = |device: &str| conf.toml().replace("device = \"cpu\"", &format!("device = \"{device}\"\njpeg_decoder = \"nvjpeg\""));
    std::fs::write(&path, with("auto")).unwrap();
    let (code, out) = run_tool(yolo_edge().args(["run", "--config"]).arg(&path));
    assert_eq!(code, Some(5), "{out}");
    assert!(out.contains("device.jpeg_decoder = \"nvjpeg\"") && out.contains("nvJPEG"), "{out}");
    std::fs::write(&path, with("cpu")).unwrap();
    let (code, out) = run_tool(yolo_edge().args(["run", "--config"]).arg(&path));
    assert_eq!(code, Some(6), "{out}");
    assert!(out.contains("agent.toml:3:") && out.contains("`device.jpeg_decoder`"), "{out}");
}

/// Runs a program, returns (exit code, stdout + stderr).
fn run_tool(cmd: &mut std::process::Command) -> (Option<i32>, String) {
    let out = cmd.output().unwrap();
    (out.status.code(), format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr)))
}

/// The readiness answer now: (status, body).
fn readyz(port: u16) -> Option<(u16, String)> {
    http_get(port, "/readyz", "*/*").map(|(s, _, b)| (s, b))
}

#[test]
fn grafana_dashboard_is_valid_and_every_panel_has_a_datasource_and_a_query() {
    let text = std::fs::read_to_string(manifest().join("deploy/grafana/yolo-edge.json")).unwrap();
    let d: serde_json::Value = serde_json::from_str(&text).expect("the dashboard is JSON");
    assert_eq!(d["__inputs"][0]["name"], "DS_PROMETHEUS", "importable with a Prometheus data source");
    let panels = d["panels"].as_array().unwrap();
    assert!(panels.len() >= 10, "{} panels", panels.len());
    let mut ids = BTreeSet::new();
    for p in panels {
        let title = p["title"].as_str().unwrap_or_default();
        assert!(!title.is_empty(), "a panel without a title: {p}");
        assert!(ids.insert(p["id"].as_u64().unwrap()), "duplicate panel id in {title}");
        assert_eq!(p["datasource"]["uid"], "${DS_PROMETHEUS}", "{title}: datasource");
        assert!(p["gridPos"]["w"].as_u64().unwrap() > 0, "{title}: gridPos");
        let targets = p["targets"].as_array().unwrap();
        assert!(!targets.is_empty(), "{title}: no query");
        for t in targets {
            assert_eq!(t["datasource"]["uid"], "${DS_PROMETHEUS}", "{title}: target datasource");
            let expr = t["expr"].as_str().unwrap_or_default();
            assert!(expr.contains("yolo_edge_"), "{title}: query {expr:?}");
        }
    }
    let titles: Vec<&str> = panels.iter().map(|p| p["title"].as_str().unwrap()).collect();
    for want in [
        "Device memory against budget and high-water",
        "Batch size",
        "OOM fallbacks",
        "Throughput",
        "Latency p50 per stage",
        "Latency p99 per stage",
        "Queue depth",
        "Spool",
        "Broker state",
    ] {
        assert!(titles.contains(&want), "no panel {want:?}: {titles:?}");
    }
    // every metric the dashboard and the alert rules name is documented
    let doc = std::fs::read_to_string(manifest().join("docs/monitoring.md")).unwrap();
    let rules = std::fs::read_to_string(manifest().join("deploy/prometheus/yolo-edge-alerts.yml")).unwrap();
    for src in [&text, &rules] {
        for part in src.split("yolo_edge_").skip(1) {
            let name: String = part.chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect();
            let base = ["_bucket", "_sum", "_count"].iter().fold(name.clone(), |n, s| n.strip_suffix(s).map(str::to_string).unwrap_or(n));
            assert!(doc.contains(&format!("yolo_edge_{base}")), "yolo_edge_{base} is not in docs/monitoring.md");
        }
    }
}

#[test]
fn metrics_scraped_by_prometheus_feed_every_dashboard_panel_and_readyz_follows_model_loads() {
    let tmp = tempfile::tempdir().unwrap();
    let Some(broker) = Broker::start(&tmp.path().join("broker"), "") else { return };
    let Some(promtool) = prometheus_tool("promtool") else { return };
    let col = Collector::start(broker.port, "yolo-edge/#", ClientOpts::default());
    let m1 = tmp.path().join("m1.pt");
    let m2 = tmp.path().join("m2.pt");
    std::fs::copy(fixture("yolov9t-ball.pt"), &m1).unwrap();
    std::fs::copy(fixture("yolov9t-ball.pt"), &m2).unwrap();
    let port = free_port();
    let mut conf = AgentConf::new(tmp.path(), broker.port);
    conf.model = m1.clone();
    // planned from memory, so that the budget panel has its figure
    conf.batch_auto = true;
    conf.extra = format!("[metrics]\nlisten = \"127.0.0.1:{port}\"\n\n[debug]\nmodel_load_delay_ms = 3000\n");
    let cfg = tmp.path().join("agent.toml");
    conf.write(&cfg);
    let t0 = Instant::now();
    let mut agent = Agent::spawn(&cfg, &[]);

    // alive at once, not ready while the model loads, ready once it serves
    wait_until(Duration::from_secs(30), "/healthz answers", || http_get(port, "/healthz", "*/*").is_some_and(|r| r.0 == 200));
    let (status, body) = readyz(port).unwrap();
    assert_eq!((status, body.as_str()), (503, "not ready: model loading\n"));
    wait_until(T, "/readyz ready", || readyz(port).is_some_and(|r| r.0 == 200));
    assert!(t0.elapsed() >= Duration::from_secs(3), "ready before the model was loaded");
    assert_eq!(readyz(port).unwrap().1, "ready\n");

    let Some(prom) = Prometheus::start(&tmp.path().join("prometheus"), "yolo-edge", &[port]) else { return };
    let names = drop_images(&conf.input, 0, 60, &small_jpeg("horses.jpg", 96));
    wait_until(T, "60 detections", || col.detections().len() >= 60);
    wait_until(T, "files in done/", || files_in(&conf.input.join("done")).len() == names.len());

    // the agent's own figures, through Prometheus
    let value = |expr: &str| -> Option<f64> { prom.query(expr).first().and_then(|r| r["value"][1].as_str()?.parse().ok()) };
    wait_until(Duration::from_secs(60), "Prometheus has the 60 pictures", || {
        value("sum(yolo_edge_frames_total{result=\"ok\",source=\"cam\"})") == Some(60.0)
    });
    assert_eq!(value("yolo_edge_ready{job=\"yolo-edge\"}"), Some(1.0));
    assert_eq!(value("yolo_edge_mqtt_connected"), Some(1.0));
    assert_eq!(value("sum(yolo_edge_stage_duration_seconds_count{stage=\"decode\"})"), Some(60.0));
    assert_eq!(value("sum(yolo_edge_stage_duration_seconds_count{stage=\"queue_wait\"})"), Some(60.0));
    assert!(value("yolo_edge_memory_budget_bytes").unwrap() > 0.0);
    let planned = value("yolo_edge_batch_size_planned").unwrap();
    assert!((1.0..=4.0).contains(&planned), "{planned}");
    assert_eq!(value("count(yolo_edge_model_info{variant=\"yolov9t\"})"), Some(1.0));

    // every panel's query returns data
    let exprs = dashboard_exprs();
    assert!(exprs.len() >= 20, "{} queries", exprs.len());
    for (title, expr) in &exprs {
        wait_until(Duration::from_secs(90), &format!("data for panel {title:?}: {expr}"), || !prom.query(expr).is_empty());
    }

    // the classic text format passes promtool's parser and lint; OpenMetrics on request
    let (status, head, text) = http_get(port, "/metrics", "text/plain").unwrap();
    assert_eq!(status, 200);
    assert!(head.contains("content-type: text/plain; version=0.0.4"), "{head}");
    assert!(text.contains("yolo_edge_frames_total{source=\"cam\",result=\"ok\"} 60\n"), "{text}");
    let scraped = tmp.path().join("metrics.txt");
    std::fs::write(&scraped, &text).unwrap();
    let (code, out) =
        run_tool(std::process::Command::new(&promtool).arg("check").arg("metrics").stdin(std::fs::File::open(&scraped).unwrap()));
    assert_eq!(code, Some(0), "promtool check metrics:\n{out}\n{text}");
    let (_, head, om) = http_get(port, "/metrics", "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5").unwrap();
    assert!(head.contains("content-type: application/openmetrics-text; version=1.0.0"), "{head}");
    assert!(om.ends_with("# EOF\n") && om.contains("# TYPE yolo_edge_frames counter\n"), "{om}");

    // the shipped alert rules and scrape config
    let deploy = manifest().join("deploy/prometheus");
    let (code, out) = run_tool(std::process::Command::new(&promtool).arg("check").arg("rules").arg(deploy.join("yolo-edge-alerts.yml")));
    assert_eq!(code, Some(0), "promtool check rules:\n{out}");
    assert!(out.contains("SUCCESS: 12 rules found"), "{out}");
    // and they fire when they should (broker down, spool growing and nearly full, no frames, not
    // ready, memory near budget), and not before
    let (code, out) =
        run_tool(std::process::Command::new(&promtool).arg("test").arg("rules").arg(deploy.join("yolo-edge-alerts.test.yml")));
    assert_eq!(code, Some(0), "promtool test rules:\n{out}");
    let (code, out) = run_tool(std::process::Command::new(&promtool).arg("check").arg("config").arg(deploy.join("prometheus.yml")));
    assert_eq!(code, Some(0), "promtool check config:\n{out}");

    // `yolo-edge probe` asks the listener the config names (the container HEALTHCHECK)
    let probe = |args: &[&str], config: &std::path::Path| run_tool(yolo_edge().arg("probe").arg("--config").arg(config).args(args));
    assert_eq!(probe(&["/readyz"], &cfg), (Some(0), "ready\n".to_string()));
    assert_eq!(probe(&["/healthz"], &cfg), (Some(0), "ok\n".to_string()));
    let plain = tmp.path().join("no-metrics.toml");
    std::fs::write(&plain, conf.toml().replace(&format!("listen = \"127.0.0.1:{port}\""), "").replace("[metrics]\n", "")).unwrap();
    assert_eq!(probe(&["--if-configured"], &plain).0, Some(0));
    let (code, out) = probe(&[], &plain);
    assert!(code != Some(0) && out.contains("no [metrics] table"), "{code:?} {out}");

    // the main panels, drawn from Prometheus' range queries into one PNG: 40 s of bursts of
    // pictures (40 every 4 s, at three sizes) give the lines their shape
    let (start, mut next) = (unix_s(), 60);
    for round in 0..10 {
        let side = [96, 320, 640][round % 3];
        next += drop_images(&conf.input, next, 40, &small_jpeg("horses.jpg", side)).len();
        std::thread::sleep(Duration::from_secs(4));
    }
    wait_until(T, "the bursts detected", || col.detections().len() >= next);
    std::thread::sleep(Duration::from_secs(3));
    let end = unix_s();
    let main = [
        ("Throughput", panels::Unit::Rate),
        ("Device memory against budget and high-water", panels::Unit::Bytes),
        ("Batch size", panels::Unit::Count),
        ("Latency p99 per stage", panels::Unit::Seconds),
        ("Queue depth", panels::Unit::Count),
        ("Broker state", panels::Unit::Count),
    ];
    let drawn: Vec<panels::Panel> = main
        .iter()
        .map(|&(title, unit)| {
            let series: Vec<panels::Series> = exprs
                .iter()
                .filter(|(t, _)| t == title)
                .flat_map(|(_, expr)| panels::series_of(&prom.query_range(expr, start, end, 1.0), start, expr))
                .collect();
            assert!(series.iter().any(|s| s.points.len() >= 10), "panel {title:?}: no line over the run");
            panels::Panel { title: title.to_string(), unit, series }
        })
        .collect();
    let png = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("dashboard-panels.png");
    panels::render(&png, &drawn, 2).unwrap();
    let img = image::open(&png).unwrap().to_rgb8();
    assert_eq!(img.dimensions(), (1200, 1140));
    // every panel drew lines, not just its frame: more than two colours in each
    for (i, p) in drawn.iter().enumerate() {
        let (x0, y0) = ((i as u32 % 2) * 600, (i as u32 / 2) * 380);
        let colours: BTreeSet<[u8; 3]> =
            (y0 + 40..y0 + 340).flat_map(|y| (x0 + 80..x0 + 590).map(move |x| (x, y))).map(|(x, y)| img.get_pixel(x, y).0).collect();
        assert!(colours.len() > 8, "panel {:?} looks empty ({} colours)", p.title, colours.len());
    }
    // `UPDATE_DOCS=1` keeps this run's picture for docs/monitoring.md
    if std::env::var_os("UPDATE_DOCS").is_some() {
        std::fs::copy(&png, manifest().join("docs/monitoring-panels.png")).unwrap();
    }

    // a live model change: not ready while the new model loads, ready again once it serves
    conf.model = m2.clone();
    conf.write(&cfg);
    wait_until(Duration::from_secs(60), "/readyz not ready during the reload", || readyz(port).is_some_and(|r| r.0 == 503));
    assert_eq!(readyz(port).unwrap().1, "not ready: model loading\n");
    assert_eq!(http_get(port, "/healthz", "*/*").unwrap().0, 200, "alive while loading");
    wait_until(T, "model_reloaded", || !col.events("model_reloaded").is_empty());
    wait_until(Duration::from_secs(30), "/readyz ready after the reload", || readyz(port).is_some_and(|r| r.0 == 200));
    wait_until(Duration::from_secs(30), "model_reloads_total 1", || value("yolo_edge_model_reloads_total") == Some(1.0));

    agent.signal(libc::SIGTERM);
    assert_eq!(agent.wait(Duration::from_secs(30)), Some(0), "exit code; log:\n{}", agent.log());
    col.assert_all_typed();
}
