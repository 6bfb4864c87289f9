//! Pictures in and detections out, on the host: decoding with bounds and the reference's
//! letterbox ([`preprocess`]), confidence filtering, NMS and mapping back to the picture
//! ([`postprocess`]), and drawing boxes for people ([`annotate`]).
//!
//! May use: the `image` crate, the standard library, `crate::files` (bounded reads). Knows
//! nothing of devices or the model.

pub mod annotate;
pub mod postprocess;
pub mod preprocess;
