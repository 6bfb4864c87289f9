//! Benchmark results and how they are shown: the Markdown table, CSV and PNG chart of
//! `yolo-edge bench` ([`report`]).
//!
//! May use: plotters, serde. The measuring itself is `cli/bench.rs`, over the detector.

pub mod report;
