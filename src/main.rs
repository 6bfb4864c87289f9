//! `yolo-edge`: the command-line entry point (argument parsing, logging, exit codes).

mod cli;

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    // `yolo-edge info m.pt | head` must end quietly, not panic on a closed pipe
    #[cfg(unix)]
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
    let args = cli::Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_new(cli::log_filter(&args, std::env::var("RUST_LOG").ok().as_deref())).unwrap_or_else(|_| "info".into()))
        .with_writer(std::io::stderr)
        .init();
    match cli::run(args) {
        Ok(code) => code,
        Err(e) => {
            let code = cli::exit_code_for(&e);
            eprintln!("error: {e:#}");
            ExitCode::from(code)
        }
    }
}
