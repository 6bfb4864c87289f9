//! `yolo-edge fleet`: what the people who subscribe see. Watches every agent's `status`, `info`
//! and `telemetry` under a topic prefix and shows one row per device, live, or once as JSON
//! (`--json`). Connects with the agent's own MQTT settings (`--config`: TLS, credentials,
//! protocol, prefix) or to `--broker HOST:PORT`, with no Last Will of its own.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use tokio::sync::mpsc;

use yolo_edge::agent::config::{Config, MqttConfig, Protocol};
use yolo_edge::agent::fleet::Fleet;
use yolo_edge::agent::mqtt::{self, ConnEvent};

#[derive(Args)]
pub struct FleetArgs {
    /// Broker address (overrides the config's host and port).
    #[arg(long)]
    broker: Option<String>,
    /// An agent config whose [mqtt] table gives TLS, credentials, protocol and prefix.
    #[arg(long, short)]
    config: Option<PathBuf>,
    /// Topic prefix of the agents (default: the config's, else `yolo-edge`).
    #[arg(long)]
    prefix: Option<String>,
    /// Print one JSON snapshot after --wait seconds and exit.
    #[arg(long)]
    json: bool,
    /// Seconds to collect before the snapshot (retained status and info arrive at once,
    /// telemetry at each agent's interval).
    #[arg(long, default_value_t = 3.0)]
    wait: f64,
    /// Seconds between table refreshes (live mode).
    #[arg(long, default_value_t = 2.0)]
    interval: f64,
}

fn settings(a: &FleetArgs) -> anyhow::Result<MqttConfig> {
    let mut m = match &a.config {
        Some(p) => Config::load(p)?.mqtt,
        None => MqttConfig {
            host: "127.0.0.1".into(),
            port: 1883,
            device_id: "fleet".into(),
            client_id: String::new(),
            prefix: "yolo-edge".into(),
            protocol: Protocol::V311,
            tls: None,
            username: None,
            password: None,
            keepalive: Duration::from_secs(30),
            qos: 1,
            max_inflight: 16,
            reconnect_min: Duration::from_millis(500),
            reconnect_max: Duration::from_secs(10),
        },
    };
    if let Some(b) = &a.broker {
        let (host, port) = b.rsplit_once(':').with_context(|| format!("--broker {b}: expected HOST:PORT"))?;
        m.host = host.trim_matches(['[', ']']).to_string();
        m.port = port.parse().with_context(|| format!("--broker {b}: bad port"))?;
    }
    if let Some(p) = &a.prefix {
        m.prefix = p.clone();
    }
    m.client_id = format!("yolo-edge-fleet-{}", std::process::id());
    Ok(m)
}

pub fn run(a: FleetArgs) -> anyhow::Result<ExitCode> {
    anyhow::ensure!(
        a.wait >= 0.0 && a.wait.is_finite() && a.interval > 0.0 && a.interval.is_finite(),
        "--wait and --interval must be positive"
    );
    let m = settings(&a)?;
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    rt.block_on(watch(a, m))
}

async fn watch(a: FleetArgs, m: MqttConfig) -> anyhow::Result<ExitCode> {
    let mut fleet = Fleet::new(&m.prefix);
    let (tx, mut rx) = mpsc::channel(4096);
    let client = mqtt::connect_observer(&m, 1024, tx);
    let connect_by = tokio::time::Instant::now() + Duration::from_secs(10);
    let mut snapshot_at: Option<tokio::time::Instant> = None;
    let mut tick = tokio::time::interval(Duration::from_secs_f64(a.interval));
    loop {
        let deadline = snapshot_at.unwrap_or(connect_by);
        tokio::select! {
            ev = rx.recv() => match ev.map(|(_, e)| e) {
                Some(ConnEvent::Connected) => {
                    for f in fleet.filters() {
                        client.try_subscribe(&f).map_err(|e| anyhow::anyhow!("subscribing to {f}: {e}"))?;
                    }
                    if snapshot_at.is_none() {
                        snapshot_at = Some(tokio::time::Instant::now() + Duration::from_secs_f64(a.wait));
                    }
                }
                Some(ConnEvent::Message { topic, payload, .. }) => {
                    fleet.update(&topic, &payload);
                }
                Some(ConnEvent::Refused { reason, .. }) => anyhow::bail!("broker {}:{} refused the connection: {reason}", m.host, m.port),
                Some(ConnEvent::Disconnected(reason)) => {
                    eprintln!("error: broker {}:{}: {reason}", m.host, m.port);
                    return Ok(ExitCode::from(super::exit::BROKER));
                }
                Some(_) => {}
                None => return Ok(ExitCode::from(super::exit::BROKER)),
            },
            _ = tokio::time::sleep_until(deadline) => {
                if snapshot_at.is_none() {
                    eprintln!("error: broker {}:{} did not answer within 10 s", m.host, m.port);
                    return Ok(ExitCode::from(super::exit::BROKER));
                }
                if a.json {
                    println!("{}", serde_json::to_string_pretty(&fleet.rows())?);
                    client.try_disconnect();
                    return Ok(ExitCode::SUCCESS);
                }
                snapshot_at = Some(tokio::time::Instant::now() + Duration::from_secs(3600));
            },
            _ = tick.tick(), if !a.json => {
                print!("\x1b[2J\x1b[H{}", fleet.table());
            },
            _ = tokio::signal::ctrl_c() => return Ok(ExitCode::SUCCESS),
        }
    }
}
