//! The config file: TOML, then every validation, with file:line errors (`Config::parse`, what
//! `Config::load` runs on the file's text). The config's directory does not exist, so relative
//! paths in it (password and TLS files) are not found.
#![no_main]

use std::path::Path;

use libfuzzer_sys::fuzz_target;
use yolo_edge::agent::config::Config;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let path = Path::new("/nonexistent/yolo-edge-fuzz/agent.toml");
    match Config::parse(text, path) {
        Ok(c) => {
            let _ = c.restart_required(&c);
        }
        Err(e) => {
            let _ = e.to_string();
        }
    }
});
