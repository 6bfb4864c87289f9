//! JPEG pixels against the reference's loader: files of every sampling, progressive, restart
//! intervals, grayscale, CMYK, EXIF orientation, sides below one MCU and data libjpeg-turbo
//! decodes through with a warning, made and decoded by `scripts/make_test_jpegs.py` with OpenCV
//! (`cv2.imread`, as ultralytics loads pictures). CI generates them (`.ci/run`); a developer
//! machine without the reference venv skips, unless `YOLO_EDGE_REQUIRE_TESTDATA` is set.

use yolo_edge::vision::preprocess::{self, DecodeLimits, ImageError};

use crate::common::testdata;

#[test]
fn jpeg_pixels_are_the_references() {
    let Some(dir) = testdata("jpeg", "scripts/make_test_jpegs.py") else { return };
    let manifest: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(dir.join("manifest.json")).unwrap()).unwrap();
    let files = manifest["files"].as_array().unwrap();
    let (mut exact, mut refused) = (0, 0);
    for f in files {
        let name = f["name"].as_str().unwrap();
        let bytes = std::fs::read(dir.join(format!("{name}.jpg"))).unwrap();
        let got = preprocess::decode_image(&bytes, &DecodeLimits::default());
        if let Some(why) = f["refused"].as_str() {
            let e = got.expect_err(name);
            assert!(matches!(e, ImageError::Corrupt { .. }), "{name} ({why}): {e}");
            eprintln!("{name}: refused ({e})");
            refused += 1;
            continue;
        }
        let img = got.unwrap_or_else(|e| panic!("{name}: {e}"));
        let want = std::fs::read(dir.join(format!("{name}.rgb"))).unwrap();
        let (w, h) = (f["width"].as_u64().unwrap() as u32, f["height"].as_u64().unwrap() as u32);
        assert_eq!(img.dimensions(), (w, h), "{name}");
        let differ = img.as_raw().iter().zip(&want).filter(|(a, b)| a != b).count();
        let worst = img.as_raw().iter().zip(&want).map(|(a, b)| a.abs_diff(*b)).max().unwrap_or(0);
        assert!(differ == 0, "{name} ({}): {differ} of {} bytes differ from cv2.imread's, by up to {worst}", f["what"], want.len());
        exact += 1;
    }
    eprintln!("{exact} files decoded byte for byte as cv2.imread, {refused} refused by design");
    assert!(exact >= 30 && refused >= 2, "the manifest lists too few files: {exact} and {refused}");
}
