//! `yolo-edge run --config PATH`: the headless edge agent (see `configs/` for documented examples).

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;

#[derive(Args)]
pub struct RunArgs {
    /// Agent configuration (TOML).
    #[arg(long, short)]
    config: PathBuf,
    /// Validate the configuration and exit.
    #[arg(long)]
    check: bool,
}

pub fn run(a: RunArgs) -> anyhow::Result<ExitCode> {
    if a.check {
        let c = yolo_edge::agent::config::Config::load(&a.config)?;
        println!("{}: ok (sha256 {})", a.config.display(), c.sha256);
        return Ok(ExitCode::SUCCESS);
    }
    match yolo_edge::agent::run(&a.config) {
        Ok(()) => Ok(ExitCode::SUCCESS),
        Err(yolo_edge::agent::AgentError::Config(e)) => Err(e.into()),
        Err(yolo_edge::agent::AgentError::Device(e)) => Err(e.into()),
        Err(yolo_edge::agent::AgentError::Model { path, source }) => {
            Err(anyhow::Error::new(source).context(format!("cannot load model {}", path.display())))
        }
        Err(e) => Err(e.into()),
    }
}
