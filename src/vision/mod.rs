//! Pictures in and detections out, on the host: decoding with bounds (JPEGs by the reference's
//! own decoder, libjpeg-turbo: `jpeg`) and the reference's letterbox ([`preprocess`]),
//! confidence filtering, NMS and mapping back to the picture ([`postprocess`]), drawing boxes for
//! people ([`annotate`]), and files prepared ahead of the model on all cores ([`feed`]).
//!
//! May use: the `image` crate, turbojpeg-sys, rayon, the standard library, `crate::files`
//! (bounded reads). Knows nothing of devices or the model.

pub mod annotate;
pub mod feed;
mod jpeg;
pub mod postprocess;
pub mod preprocess;
