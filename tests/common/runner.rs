//! The yolo-edge binary as a command, started through a cross target's runner where the tests
//! run under one.

use std::process::Command;

/// `yolo-edge` (cargo's `CARGO_BIN_EXE_yolo-edge`). Cargo starts the test binaries of a cross
/// target through its runner (`.cargo/config.toml`: qemu for aarch64) but not the programs they
/// start, so a test that starts the binary starts it through the command line in
/// `YOLO_EDGE_TEST_RUNNER` when that is set (`scripts/aarch64.sh test` sets it to the same qemu
/// command; time-bounded unit tests read it too, to allow for emulation); otherwise directly.
pub fn yolo_edge() -> Command {
    let bin = env!("CARGO_BIN_EXE_yolo-edge");
    let runner = std::env::var("YOLO_EDGE_TEST_RUNNER").unwrap_or_default();
    let mut parts = runner.split_whitespace();
    match parts.next() {
        Some(program) => {
            let mut cmd = Command::new(program);
            cmd.args(parts).arg(bin);
            cmd
        }
        None => Command::new(bin),
    }
}
