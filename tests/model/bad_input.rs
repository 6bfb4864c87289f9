//! Bad pictures: each gets its own clear error record, nothing panics, the others are processed.

use std::path::Path;
use std::process::Command;

use crate::common::*;

fn crc32(data: &[u8]) -> u32 {
    let mut c = 0xFFFF_FFFFu32;
    for &b in data {
        c ^= b as u32;
        for _ in 0..8 {
            c = if c & 1 != 0 { 0xEDB8_8320 ^ (c >> 1) } else { c >> 1 };
        }
    }
    !c
}

fn png_chunk(kind: &[u8; 4], data: &[u8]) -> Vec<u8> {
    let mut v = (data.len() as u32).to_be_bytes().to_vec();
    let body = [&kind[..], data].concat();
    v.extend_from_slice(&body);
    v.extend_from_slice(&crc32(&body).to_be_bytes());
    v
}

/// A valid PNG header claiming 30000x30000 RGB, followed by a tiny compressed stream.
fn png_bomb() -> Vec<u8> {
    let mut ihdr = 30000u32.to_be_bytes().to_vec();
    ihdr.extend_from_slice(&30000u32.to_be_bytes());
    ihdr.extend_from_slice(&[8, 2, 0, 0, 0]);
    [
        b"\x89PNG\r\n\x1a\n".to_vec(),
        png_chunk(b"IHDR", &ihdr),
        png_chunk(b"IDAT", &[0x78, 0x9c, 0x03, 0x00, 0x00, 0x00, 0x00, 0x01]),
        png_chunk(b"IEND", &[]),
    ]
    .concat()
}

fn write(dir: &Path, name: &str, bytes: &[u8]) -> String {
    let p = dir.join(name);
    std::fs::write(&p, bytes).unwrap();
    p.display().to_string()
}

#[test]
fn each_bad_picture_gets_its_own_error_and_the_rest_go_on() {
    let dir = tmpdir();
    let good = std::fs::read(fixture("horses.jpg")).unwrap();
    let mut corrupt = good.clone();
    for b in corrupt[600..4000].iter_mut() {
        *b = 0xA5;
    }
    let inputs = vec![
        fixture("horses.jpg").display().to_string(),
        write(dir.path(), "empty.jpg", b""),
        write(dir.path(), "truncated.jpg", &good[..2000]),
        write(dir.path(), "notes.txt", b"hello, not an image"),
        write(dir.path(), "bomb.png", &png_bomb()),
        write(dir.path(), "header-only.jpg", &good[..20]),
        dir.path().join("does-not-exist.jpg").display().to_string(),
        fixture("volleyball-court.jpg").display().to_string(),
        write(dir.path(), "corrupt-middle.jpg", &corrupt),
    ];
    let json = dir.path().join("out.jsonl");
    let out = Command::new(env!("CARGO_BIN_EXE_yolo-edge"))
        .args(["detect", "--model"])
        .arg(fixture("yolov9t-ball.pt"))
        .args(["--device", "cpu", "--imgsz", "320", "--batch", "4", "--conf", "0.05", "--json"])
        .arg(&json)
        .args(&inputs)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert_eq!(out.status.code(), Some(3), "partial failure exit code; stderr: {stderr}");
    let lines: Vec<serde_json::Value> = std::fs::read_to_string(&json).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(lines.len(), inputs.len(), "one record per input");
    for (rec, input) in lines.iter().zip(&inputs) {
        assert_eq!(rec["image"].as_str().unwrap(), input, "records keep input order");
    }
    let errors: Vec<&str> = lines.iter().filter_map(|r| r["error"].as_str()).collect();
    let expect_error = ["empty.jpg", "truncated.jpg", "notes.txt", "bomb.png", "header-only.jpg", "does-not-exist.jpg"];
    for (rec, input) in lines.iter().zip(&inputs) {
        let is_bad = expect_error.iter().any(|n| input.ends_with(n));
        if input.ends_with("corrupt-middle.jpg") {
            // damaged entropy data: a decoder may recover (grey blocks) or refuse; either is a record
            assert!(rec.get("error").is_some() || rec.get("detections").is_some(), "{rec}");
            continue;
        }
        assert_eq!(rec.get("error").is_some(), is_bad, "{input}: {rec}");
        if is_bad {
            // one line per bad input on stderr, naming it
            assert!(stderr.lines().any(|l| l.contains(input.as_str()) && l.starts_with("error")), "no error line for {input}");
        }
    }
    assert!(errors.iter().any(|e| e.contains("30000x30000")), "the bomb's error names its size: {errors:?}");
    assert!(errors.iter().any(|e| e.contains("empty")), "{errors:?}");
    // the real photos still got processed with sizes
    assert_eq!(lines[0]["width"], 773);
    assert_eq!(lines[7]["width"], 1920);
    assert!(lines[7]["detections"].as_array().unwrap().len() <= 300);
}
