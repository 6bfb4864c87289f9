//! `yolo-edge`: the command-line entry point (argument parsing, logging, exit codes).

#![deny(unsafe_op_in_unsafe_fn)]
#![deny(clippy::undocumented_unsafe_blocks)]

mod cli;

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    let args = cli::Cli::parse();
    // `yolo-edge info m.pt | head` must end quietly, not panic on a closed pipe. Never for the
    // long-running commands that hold network connections: with SIGPIPE at its default, a
    // broker that dies while the agent writes to it kills the agent silently (found by the
    // broker-restart test, which hung in ~1 of 3 runs with the agent dead at the broker stop).
    #[cfg(unix)]
    if cli::restores_sigpipe(&args) {
        // SAFETY: restoring a signal's default disposition at startup, before any other thread
        // exists; no handler code is installed.
        unsafe {
            libc::signal(libc::SIGPIPE, libc::SIG_DFL);
        }
    }
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_new(cli::log_filter(&args, std::env::var("RUST_LOG").ok().as_deref()))
                .unwrap_or_else(|_| "info".into()),
        )
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
