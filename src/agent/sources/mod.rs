//! Input sources: a hot folder and an MQTT image topic, each with its own id, feeding the
//! pipeline's bounded intake (a full intake pauses them).

pub mod folder;
pub mod mqtt;

/// Makes `s` usable as one MQTT topic level (the `{source}` of `detections/{source}`).
pub fn topic_level(s: &str) -> String {
    let v: String = s.chars().map(|c| if matches!(c, '/' | '+' | '#') || c.is_whitespace() || c.is_control() { '_' } else { c }).collect();
    if v.is_empty() {
        "_".into()
    } else {
        v
    }
}
