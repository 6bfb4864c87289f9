//! Subcommands of the `yolo-edge` binary and the exit codes scripts can rely on.

mod bench;
mod common;
mod convert;
mod demo;
mod detect;
mod eval;
mod fleet;
mod info;
#[cfg(feature = "cuda")]
mod jpeg_selfcheck;
mod letterbox;
mod plan;
mod probe;
mod run;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

use yolo_edge::backend::device;
use yolo_edge::{model, weights};

/// Exit codes (documented in the README).
pub mod exit {
    /// Some inputs failed (the others were processed).
    pub const PARTIAL: u8 = 3;
    /// The model could not be loaded.
    pub const MODEL: u8 = 4;
    /// The device could not be opened (or its JPEG decoder, where the config asks for it).
    pub const DEVICE: u8 = 5;
    /// The configuration is invalid.
    pub const CONFIG: u8 = 6;
    /// `demo`, `fleet`: no MQTT broker (the embedded one did not start, or `--broker` is unreachable).
    pub const BROKER: u8 = 7;
    /// `demo`: not every sample picture was reported (timeout, or the agent stopped).
    pub const INCOMPLETE: u8 = 8;
    /// `demo`: the detections do not match the objects drawn in the samples.
    pub const CHECK: u8 = 9;
    /// Any other failure.
    pub const OTHER: u8 = 1;
}

#[derive(Parser)]
#[command(name = "yolo-edge", version, about = "YOLOv9 edge runtime on candle: detection, memory-aware batching, MQTT telemetry")]
pub struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

/// Whether SIGPIPE goes back to its default (end quietly when stdout's reader goes away): for the
/// short commands that print, not for `run` and `demo`, which write to MQTT sockets and must
/// survive a broker that goes away mid-write.
pub fn restores_sigpipe(cli: &Cli) -> bool {
    !matches!(cli.cmd, Cmd::Run(_) | Cmd::Demo(_))
}

#[derive(Subcommand)]
enum Cmd {
    /// The whole product in one command: embedded MQTT broker, sample pictures, the agent with
    /// the built-in model, every message printed, and a summary.
    Demo(demo::DemoArgs),
    /// Detect objects in image files.
    Detect(detect::DetectArgs),
    /// Describe a model: variant, head, classes, parameters, GFLOPs.
    Info(info::InfoArgs),
    /// Measure mAP50, mAP50-95, precision and recall on a YOLO-format dataset (as ultralytics val).
    Eval(eval::EvalArgs),
    /// Fold a checkpoint (BatchNorm, RepConv) into a safetensors file that loads fastest.
    Convert(convert::ConvertArgs),
    /// Run the edge agent: sources -> batched inference -> MQTT (until SIGTERM/SIGINT).
    Run(run::RunArgs),
    /// Throughput, latency and peak memory against batch size (Markdown, CSV, JSON, PNG).
    Bench(bench::BenchArgs),
    /// Pick the batch size from the device's memory and explain the decision.
    Plan(plan::PlanArgs),
    /// Write what the network sees: a picture letterboxed to the model input (PNG or u8 .npy).
    Letterbox(letterbox::LetterboxArgs),
    /// Ask a running agent's `[metrics]` listener for /readyz or /healthz (exit 0: HTTP 200).
    Probe(probe::ProbeArgs),
    /// Watch every agent on a broker: status, model, device, batch, memory, img/s, p99, last seen.
    Fleet(fleet::FleetArgs),
    /// Check nvJPEG decoding and the device letterbox against the host's on this GPU.
    #[cfg(feature = "cuda")]
    #[command(hide = true)]
    JpegSelfcheck(jpeg_selfcheck::JpegSelfcheckArgs),
}

pub fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    match cli.cmd {
        Cmd::Demo(a) => demo::run(a),
        Cmd::Detect(a) => detect::run(a),
        Cmd::Run(a) => run::run(a),
        Cmd::Convert(a) => convert::run(a),
        Cmd::Bench(a) => bench::run(a),
        Cmd::Plan(a) => plan::run(a),
        Cmd::Eval(a) => eval::run(a),
        Cmd::Info(a) => info::run(a),
        Cmd::Letterbox(a) => letterbox::run(a),
        Cmd::Probe(a) => probe::run(a),
        Cmd::Fleet(a) => fleet::run(a),
        #[cfg(feature = "cuda")]
        Cmd::JpegSelfcheck(a) => jpeg_selfcheck::run(a),
    }
}

/// The log filter when `RUST_LOG` is unset: `info`, but only warnings for `demo`, whose
/// readable output goes to stdout. The embedded broker (rumqttd) is silenced unless `RUST_LOG`
/// names it.
pub fn log_filter(cli: &Cli, rust_log: Option<&str>) -> String {
    let demo = matches!(cli.cmd, Cmd::Demo(_));
    match rust_log.filter(|s| !s.trim().is_empty()) {
        Some(f) if !demo || f.contains("rumqttd") => f.to_string(),
        Some(f) => format!("{f},rumqttd=off"),
        None if demo => "warn,rumqttd=off".into(),
        None => "info".into(),
    }
}

/// Maps an error chain to an exit code.
pub fn exit_code_for(e: &anyhow::Error) -> u8 {
    for cause in e.chain() {
        if cause.is::<yolo_edge::agent::config::ConfigError>() {
            return exit::CONFIG;
        }
        if cause.is::<device::DeviceError>() || matches!(cause.downcast_ref(), Some(yolo_edge::agent::AgentError::JpegDecoder(_))) {
            return exit::DEVICE;
        }
        let model_file = cause.downcast_ref::<yolo_edge::agent::AgentError>().is_some_and(|e| {
            matches!(e, yolo_edge::agent::AgentError::ModelRead { .. } | yolo_edge::agent::AgentError::ModelDigest { .. })
        });
        if model_file || cause.is::<model::ModelError>() || cause.is::<weights::WeightsError>() {
            return exit::MODEL;
        }
    }
    exit::OTHER
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_model_file_that_does_not_match_its_digest_exits_as_a_model_error() {
        let e = yolo_edge::agent::AgentError::ModelDigest { path: "m.pt".into(), want: "a".repeat(64), got: "b".repeat(64) };
        assert_eq!(exit_code_for(&anyhow::Error::new(e).context("starting the agent")), exit::MODEL);
    }

    #[test]
    fn demo_logs_quietly_and_never_from_the_embedded_broker() {
        let demo = Cli::parse_from(["yolo-edge", "demo"]);
        let run = Cli::parse_from(["yolo-edge", "run", "--config", "a.toml"]);
        assert_eq!(log_filter(&demo, None), "warn,rumqttd=off");
        assert_eq!(log_filter(&demo, Some("debug")), "debug,rumqttd=off");
        assert_eq!(log_filter(&demo, Some("info,rumqttd=debug")), "info,rumqttd=debug");
        assert_eq!(log_filter(&run, None), "info");
        assert_eq!(log_filter(&run, Some("debug")), "debug");
    }
}
