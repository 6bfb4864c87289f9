//! yolo-edge: a YOLOv9 edge runtime on candle — model, pre/post-processing, device memory
//! planning, and the MQTT agent.

pub mod model;
pub mod postprocess;
pub mod preprocess;
pub mod weights;
pub mod annotate;
pub mod detector;
pub mod device;
pub mod eval;
pub mod samples;
