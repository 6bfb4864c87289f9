//! Pictures in and detections out, on the host: decoding with bounds and the reference's
//! letterbox ([`preprocess`]), confidence filtering, NMS and mapping back to the picture
//! ([`postprocess`]), drawing boxes for people ([`annotate`]), and files prepared ahead of the
//! model on all cores ([`feed`]).
//!
//! May use: the `image` crate, rayon, the standard library, `crate::files` (bounded reads).
//! Knows nothing of devices or the model.

pub mod annotate;
pub mod feed;
pub mod postprocess;
pub mod preprocess;
