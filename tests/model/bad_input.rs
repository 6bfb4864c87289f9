//! Bad input. Pictures: each gets its own clear error record, nothing panics, the others are
//! processed. Model files: hostile `.pt` checkpoints (built here, in a temporary directory) are
//! refused with one clean error line naming the file, exit code 4, in under 5 s and within a
//! 1.5 GiB address space: impossible tensor views, deeply nested or self-multiplying pickles,
//! modules shared along exponentially many paths, zip bombs and oversized archives.

use std::io::Write;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use crate::common::*;
use crate::hostile::*;

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
    let out = crate::runner::yolo_edge()
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

/// The address space `yolo-edge info` runs in: ample for the fixture model, far below what the
/// hostile files would take.
const AS_LIMIT: u64 = 3 << 29; // 1.5 GiB

/// Runs `yolo-edge info <path>` under [`AS_LIMIT`]; returns its output and run time.
fn info_limited(path: &Path) -> (std::process::Output, Duration) {
    use std::os::unix::process::CommandExt;
    // started directly, also under a cross runner: the address-space limit is the binary's own,
    // which under an emulator would bound the emulator instead
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_yolo-edge"));
    cmd.arg("info").arg(path);
    // SAFETY: the closure runs in the child between fork and exec; it only calls setrlimit, which
    // is async-signal-safe, and allocates nothing.
    unsafe {
        cmd.pre_exec(|| {
            let lim = libc::rlimit { rlim_cur: AS_LIMIT as libc::rlim_t, rlim_max: AS_LIMIT as libc::rlim_t };
            if libc::setrlimit(libc::RLIMIT_AS, &lim) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let t = Instant::now();
    let out = cmd.output().unwrap();
    (out, t.elapsed())
}

/// `bytes`, written as `name`, is refused: exit code 4 (not a signal), one `error:` line that
/// names the file and contains one of `needles`, in under 5 s.
fn assert_refused(dir: &Path, name: &str, bytes: &[u8], needles: &[&str]) {
    let path = dir.join(name);
    std::fs::write(&path, bytes).unwrap();
    let (out, took) = info_limited(&path);
    let stderr = String::from_utf8_lossy(&out.stderr);
    eprintln!("{name}: {} bytes, refused in {:.2} s: {}", bytes.len(), took.as_secs_f64(), stderr.trim());
    assert!(!stderr.contains("panicked"), "{name}: {stderr}");
    assert_eq!(out.status.code(), Some(4), "{name}: status {:?} (None: killed by a signal); stderr: {stderr}", out.status);
    let errors: Vec<&str> = stderr.lines().filter(|l| l.starts_with("error")).collect();
    assert_eq!(errors.len(), 1, "{name}: {stderr}");
    assert!(errors[0].contains(&path.display().to_string()), "{name}: the error names the file: {}", errors[0]);
    assert!(needles.iter().any(|n| errors[0].contains(n)), "{name}: {} (expected one of {needles:?})", errors[0]);
    assert!(took < Duration::from_secs(5), "{name}: {took:?}");
    std::fs::remove_file(&path).unwrap();
}

#[test]
fn pt_tensors_with_impossible_shapes_offsets_or_storages_are_refused() {
    let dir = tmpdir();
    // the address-space limit itself is ample for a real model
    let (out, _) = info_limited(&fixture("yolov9t-ball.pt"));
    assert!(out.status.success(), "fixture under {AS_LIMIT} bytes: {}", String::from_utf8_lossy(&out.stderr));

    let ten_floats = [0u8; 40];
    // file, storage elements, offset, shape, stride, expected words
    type Case<'a> = (&'a str, i64, i64, &'a [i64], &'a [i64], &'a str);
    let cases: [Case; 6] = [
        ("trillion-elements.pt", 10, 0, &[1_000_000, 1_000_000], &[1_000_000, 1], "reaches byte"),
        ("offset-2-63.pt", 10, i64::MAX, &[1], &[1], "overflow 64 bits"),
        ("shape-overflow.pt", 10, 0, &[1 << 40, 1 << 40], &[0, 0], "overflow 64 bits"),
        ("broadcast-billion.pt", 10, 0, &[1_000_000_000], &[0], "over the load budget"),
        ("storage-claims-4-tib.pt", 1 << 40, 0, &[1], &[1], "holds 40 bytes"),
        ("storage-size-overflow.pt", i64::MAX, 0, &[1], &[1], "overflows 64 bits"),
    ];
    for (name, numel, offset, shape, stride, needle) in cases {
        let pkl = model_with(|p| p.tensor("0", numel, offset, shape, stride));
        assert_refused(dir.path(), name, &pt(&pkl, &[("0", &ten_floats)]), &[needle]);
    }
}

#[test]
fn pickles_nested_a_million_levels_deep_are_refused() {
    let dir = tmpdir();
    assert_refused(dir.path(), "nested-lists.pt", &nested_lists(1_000_000), &["1000 levels deep"]);
    assert_refused(dir.path(), "nested-tuples.pt", &nested_tuples(1_000_000), &["1000 levels deep"]);
    // a chain 400,000 lists deep, linked through the memo so that no single step looks
    // deep: parsed, refused as a checkpoint, and dropped without recursion
    assert_refused(dir.path(), "memo-chain.pt", &memo_chain(400_000), &["neither a dict nor a module"]);
}

#[test]
fn pickles_that_multiply_their_values_are_refused() {
    let dir = tmpdir();
    assert_refused(dir.path(), "build-doubling.pt", &build_doubling(), &["values"]);
    // half a million distinct keys set one by one: linear, then refused as not a checkpoint
    let mut p = Pickle::new().raw(b"}");
    for i in 0..500_000 {
        p = p.str(&format!("key{i}")).raw(b"Ns");
    }
    assert_refused(dir.path(), "many-keys.pt", &pt(&p.raw(b".").0, &[]), &["no `model` or `ema`"]);
    // the largest pickle accepted, all of it opcodes that allocate (a list, a dict or a memoised
    // tuple per byte or two): the worst case for memory stays within the limit
    let most = 8 << 20;
    for (name, op) in [("most-lists.pt", &b"]"[..]), ("most-dicts.pt", b"}"), ("most-memo.pt", b")\x94")] {
        let body = op.repeat((most - 16) / op.len());
        let pkl = [&b"\x80\x02"[..], &body, b"N."].concat();
        assert_refused(dir.path(), name, &pt(&pkl, &[]), &["neither a dict nor a module"]);
    }
}

#[test]
fn modules_shared_along_many_paths_are_walked_once() {
    let dir = tmpdir();
    assert_refused(dir.path(), "shared-modules.pt", &shared_modules(60), &[""]);
    assert_refused(dir.path(), "self-module.pt", &self_module(), &[""]);
}

/// Names that would grow with the square of the nesting (one long memoised key per level, one
/// `_parameters` dict shared by every level), and one `_modules` dict shared by 20,000 modules
/// that it all holds: refused within `assert_refused`'s 5 s and address-space limit, instead of
/// gigabytes of names or 4 x 10^8 entries read.
#[test]
fn module_paths_that_grow_quadratically_are_refused() {
    let dir = tmpdir();
    assert_refused(dir.path(), "long-paths.pt", &long_module_paths(64, 1000, 8000), &["name of more than 512 bytes"]);
    // short keys: every name fits, and 64 x 1000 names are a legal (if odd) walk that ends in
    // the usual refusal of tensors no model has
    assert_refused(dir.path(), "many-names.pt", &long_module_paths(64, 1000, 1), &[""]);
    assert_refused(dir.path(), "shared-modules-dict.pt", &shared_modules_dict(20_000), &["more than 1000000 entries"]);
}

#[test]
fn zip_bombs_and_oversized_archives_are_refused() {
    let dir = tmpdir();
    assert_refused(dir.path(), "storage-bomb.pt", &storage_bomb(), &["over the load budget", "allowed"]);
    // a data.pkl of 9 MiB
    assert_refused(dir.path(), "pickle-bomb.pt", &zip_bomb(&[], "data.pkl", 9), &["allowed", "over the load budget"]);
    // more members than any checkpoint has
    let mut z = zip::ZipWriter::new(std::io::Cursor::new(Vec::new()));
    let stored = zip::write::SimpleFileOptions::default().compression_method(zip::CompressionMethod::Stored);
    for i in 0..100_001 {
        z.start_file(format!("m/data/{i}"), stored).unwrap();
    }
    z.start_file("m/data.pkl", stored).unwrap();
    z.write_all(&model_with(|p| p.tensor("0", 0, 0, &[0], &[1]))).unwrap();
    assert_refused(dir.path(), "many-members.pt", &z.finish().unwrap().into_inner(), &["100000 allowed"]);
}

/// Sets the uncompressed size of member `name` to `size` in both its local and central headers.
fn patch_declared_size(zip: &mut [u8], name: &str, size: u32) {
    let mut patched = 0;
    for i in 0..zip.len().saturating_sub(46 + name.len()) {
        let (sig, name_at, size_at) = match &zip[i..i + 4] {
            b"PK\x03\x04" => ("local", 30, 22),
            b"PK\x01\x02" => ("central", 46, 24),
            _ => continue,
        };
        if &zip[i + name_at..i + name_at + name.len()] == name.as_bytes() {
            zip[i + size_at..i + size_at + 4].copy_from_slice(&size.to_le_bytes());
            patched += 1;
            eprintln!("patched the {sig} header of {name}");
        }
    }
    assert_eq!(patched, 2, "{name}: local and central headers");
}

#[test]
fn zip_members_longer_than_their_headers_say_and_hostile_safetensors_are_refused() {
    let dir = tmpdir();
    // 80 bytes stored, the headers say 40: the read stops at 41
    let pkl = model_with(|p| p.tensor("0", 10, 0, &[10], &[1]));
    let mut liar = pt(&pkl, &[("0", &[0u8; 80])]);
    patch_declared_size(&mut liar, "m/data/0", 40);
    assert_refused(dir.path(), "member-longer-than-header.pt", &liar, &["its header says 40", "larger than its declared"]);

    let safetensors = |header: &str, data: &[u8]| [&(header.len() as u64).to_le_bytes()[..], header.as_bytes(), data].concat();
    let trillion = safetensors(r#"{"w":{"dtype":"F32","shape":[1000000,1000000],"data_offsets":[0,40]}}"#, &[0; 40]);
    assert_refused(dir.path(), "trillion.safetensors", &trillion, &["safetensors"]);
    let overflow = safetensors(r#"{"w":{"dtype":"F32","shape":[4294967296,4294967296,4294967296],"data_offsets":[0,40]}}"#, &[0; 40]);
    assert_refused(dir.path(), "overflow.safetensors", &overflow, &["safetensors"]);
    let past_end = safetensors(r#"{"w":{"dtype":"F32","shape":[1000000000],"data_offsets":[0,4000000000]}}"#, &[0; 40]);
    assert_refused(dir.path(), "past-end.safetensors", &past_end, &["safetensors"]);
    let mut huge_header = u64::MAX.to_le_bytes().to_vec();
    huge_header.extend_from_slice(b"{}");
    assert_refused(dir.path(), "huge-header.safetensors", &huge_header, &["safetensors"]);
    let nested = safetensors(&format!("{}{}", r#"{"a":"#.repeat(100_000), "}".repeat(100_000)), &[]);
    assert_refused(dir.path(), "nested-header.safetensors", &nested, &["safetensors"]);
}
