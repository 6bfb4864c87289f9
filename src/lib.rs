//! yolo-edge: a YOLOv9 edge runtime on candle — model, pre/post-processing, device memory
//! planning, and the MQTT agent.

pub mod model;
pub mod postprocess;
pub mod preprocess;
pub mod weights;
pub mod annotate;
pub mod detector;
pub mod upload;
pub mod device;
pub mod agent;
pub mod config;
pub mod events;
pub mod messages;
pub mod memory;
pub mod mqtt;
pub mod pipeline;
pub mod publisher;
pub mod sources;
pub mod spool;
pub mod telemetry;
pub mod benchreport;
pub mod devmem;
pub mod arena;
pub mod fastconv;
pub mod planner;
pub mod profile;
pub mod randweights;
pub mod startup;
pub mod eval;
pub mod samples;
pub mod demo;
