//! Input sources: a hot folder and an MQTT image topic, each with its own id, feeding the
//! pipeline's bounded intake (a full intake pauses them); and, with feature `gstreamer`, camera
//! and video streams (`camera`), whose frames wait in the pipeline's per-stream slots.

#[cfg(feature = "gstreamer")]
pub mod camera;
pub mod folder;
pub mod mqtt;

/// Longest source id taken from outside (an MQTT topic level or user property), in bytes. The id
/// becomes a topic level (`{prefix}/{device_id}/detections/{source}`), so it is bounded like the
/// configured ids (`device_id`, `prefix`: 128 bytes each), which keeps every topic the agent
/// publishes far below MQTT's 65,535-byte limit.
pub const MAX_SOURCE_ID: usize = 128;

/// Longest picture id taken from an MQTT 5 user property `image_id`, in bytes (it goes into the
/// detections payload, not a topic).
pub const MAX_IMAGE_ID: usize = 1024;

/// Checks a source id that came from outside: 1 to [`MAX_SOURCE_ID`] bytes of ASCII letters,
/// digits and `-_.:@`. Anything else is refused, never rewritten or truncated, so that two
/// publishers cannot end up on one topic and no id can make a topic the broker refuses.
pub fn check_source_id(id: &str) -> Result<(), String> {
    let shown = || {
        let head: String = id.chars().take(24).collect();
        if head.len() < id.len() {
            format!("`{}...` ({} bytes)", head.escape_debug(), id.len())
        } else {
            format!("`{}`", head.escape_debug())
        }
    };
    if id.is_empty() || id.len() > MAX_SOURCE_ID {
        return Err(format!("source id {} must be 1 to {MAX_SOURCE_ID} bytes", shown()));
    }
    if let Some(c) = id.chars().find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | ':' | '@'))) {
        return Err(format!("source id {} holds {:?}: only ASCII letters, digits and -_.:@ are allowed", shown(), c));
    }
    Ok(())
}
