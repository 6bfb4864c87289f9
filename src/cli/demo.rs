//! `yolo-edge demo`: embedded broker, sample pictures, the real agent, a subscriber that prints
//! what arrives, and a summary (see `yolo_edge::demo`); maps its failures to exit codes.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Args;

use yolo_edge::agent::config::BatchSpec;
use yolo_edge::agent::AgentError;
use yolo_edge::demo::{self, DemoError, DemoOptions};

use super::exit;

#[derive(Args)]
pub struct DemoArgs {
    /// auto, cpu, cuda or cuda:N
    #[arg(long, default_value = "auto")]
    device: String,
    /// Use this MQTT broker (HOST:PORT) instead of starting an embedded one.
    #[arg(long, value_name = "HOST:PORT")]
    broker: Option<String>,
    /// Use this model instead of the built-in default (yolov9t-shapes).
    #[arg(long)]
    model: Option<PathBuf>,
    /// Network input size (multiple of 32); the default model was trained at 416.
    #[arg(long, default_value_t = demo::DEFAULT_IMGSZ, value_parser = super::common::parse_imgsz)]
    imgsz: usize,
    /// Write each picture with its detections drawn into this folder.
    #[arg(long, value_name = "DIR")]
    annotate: Option<PathBuf>,
    /// Number of sample pictures (the six sample scenes, repeated in turn).
    #[arg(long, default_value_t = 6, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    images: u32,
    /// Pictures per forward pass: N, or auto (the agent decides).
    #[arg(long, default_value = "auto", value_parser = parse_batch)]
    batch: BatchSpec,
    /// Give up (exit 8) when the pictures are not all reported within this many seconds.
    #[arg(long, default_value_t = 180, value_parser = clap::value_parser!(u64).range(1..))]
    timeout: u64,
}

fn parse_batch(s: &str) -> Result<BatchSpec, String> {
    match s.trim() {
        "auto" => Ok(BatchSpec::Auto),
        n => match n.parse::<usize>() {
            Ok(b) if (1..=1024).contains(&b) => Ok(BatchSpec::Fixed(b)),
            _ => Err(format!("`{s}` is not a batch size (1..=1024) or auto")),
        },
    }
}

pub fn run(a: DemoArgs) -> anyhow::Result<ExitCode> {
    let o = DemoOptions {
        device: a.device,
        broker: a.broker,
        model: a.model,
        imgsz: a.imgsz,
        annotate: a.annotate,
        images: a.images as usize,
        batch: a.batch,
        timeout: Duration::from_secs(a.timeout),
    };
    let mut out = std::io::stdout().lock();
    match demo::run(&o, &mut out) {
        Ok(_) => Ok(ExitCode::SUCCESS),
        Err(e) => {
            let code = exit_code(&e);
            // the agent's own errors keep their usual codes and wording (as `run`'s)
            match e {
                DemoError::Agent(a) => match *a {
                    AgentError::Config(e) => Err(e.into()),
                    AgentError::Device(e) => Err(e.into()),
                    AgentError::Model { path, source } => {
                        Err(anyhow::Error::new(source).context(format!("cannot load model {}", path.display())))
                    }
                    a => Err(a.into()),
                },
                e => {
                    eprintln!("error: {e}");
                    Ok(ExitCode::from(code))
                }
            }
        }
    }
}

/// The exit code of a failed demo (documented in the README).
fn exit_code(e: &DemoError) -> u8 {
    match e {
        DemoError::Broker(_) | DemoError::Subscriber { .. } => exit::BROKER,
        DemoError::Timeout { .. } | DemoError::AgentStopped { .. } => exit::INCOMPLETE,
        DemoError::Check { .. } => exit::CHECK,
        DemoError::Failed { .. } => exit::PARTIAL,
        DemoError::Agent(a) => match **a {
            AgentError::Config(_) => exit::CONFIG,
            AgentError::Device(_) | AgentError::JpegDecoder(_) => exit::DEVICE,
            AgentError::Model { .. } => exit::MODEL,
            _ => exit::OTHER,
        },
        _ => exit::OTHER,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batch_argument() {
        assert_eq!(parse_batch("auto"), Ok(BatchSpec::Auto));
        assert_eq!(parse_batch("8"), Ok(BatchSpec::Fixed(8)));
        assert!(parse_batch("0").is_err() && parse_batch("2000").is_err() && parse_batch("x").is_err());
    }
}
