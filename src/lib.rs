//! yolo-edge: a YOLOv9 edge runtime on candle.
//!
//! The modules are layered; each imports only from the layers below it (see
//! `docs/architecture.md` for the picture's path through them):
//!
//! | layer | modules | job |
//! |---|---|---|
//! | applications | [`agent`], [`demo`], [`eval`], [`bench`] | the MQTT agent, the one-command demo, mAP evaluation, benchmark reports |
//! | planning | [`planner`] | the batch size from device memory: memory model, probe, search, report |
//! | detection | [`detector`] | a loaded model with its batched pre- and post-processing |
//! | model | [`model`], [`weights`] | YOLOv9 itself, and the checkpoint formats it loads from |
//! | pictures | [`vision`] | decoding, letterbox, NMS, annotation (host only) |
//! | acceleration | [`backend`] | devices, memory, CPU and CUDA kernels, uploads, the arena |
//! | foundations | [`units`], [`env`] | byte sizes; the process environment, read once |

#![deny(unsafe_op_in_unsafe_fn)]
#![deny(clippy::undocumented_unsafe_blocks)]

pub mod units;
pub mod env;
pub mod backend;
pub mod vision;
pub mod weights;
pub mod model;
pub mod detector;
pub mod planner;
pub mod bench;
pub mod eval;
pub mod agent;
pub mod demo;
