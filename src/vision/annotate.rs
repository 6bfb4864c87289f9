//! Drawing detections onto pictures (boxes and `label 0.87` captions) for people to look at.

use font8x8::UnicodeFonts;
use image::{Rgb, RgbImage};

use crate::vision::postprocess::Detection;

/// The ultralytics palette, so pictures look familiar to people who know the reference.
const PALETTE: [[u8; 3]; 10] = [
    [255, 56, 56],
    [255, 157, 151],
    [255, 112, 31],
    [255, 178, 29],
    [207, 210, 49],
    [72, 249, 10],
    [146, 204, 23],
    [61, 219, 134],
    [26, 147, 52],
    [0, 212, 187],
];

fn fill(img: &mut RgbImage, x0: i64, y0: i64, x1: i64, y1: i64, c: Rgb<u8>) {
    let (w, h) = (img.width() as i64, img.height() as i64);
    for y in y0.max(0)..y1.min(h) {
        for x in x0.max(0)..x1.min(w) {
            img.put_pixel(x as u32, y as u32, c);
        }
    }
}

fn text(img: &mut RgbImage, x: i64, y: i64, s: &str, scale: i64, c: Rgb<u8>) {
    for (i, ch) in s.chars().enumerate() {
        let Some(glyph) = font8x8::BASIC_FONTS.get(ch) else { continue };
        for (row, bits) in glyph.iter().enumerate() {
            for col in 0..8 {
                if bits >> col & 1 == 1 {
                    let px = x + (i as i64 * 8 + col) * scale;
                    let py = y + row as i64 * scale;
                    fill(img, px, py, px + scale, py + scale, c);
                }
            }
        }
    }
}

/// Draws every detection: a box in its class colour and a caption above it.
pub fn draw(img: &mut RgbImage, dets: &[Detection]) {
    let t = ((img.width().max(img.height()) as i64) / 400).max(1);
    for d in dets {
        let c = Rgb(PALETTE[d.class_id % PALETTE.len()]);
        let [x1, y1, x2, y2] = d.bbox.map(|v| v.round() as i64);
        fill(img, x1, y1, x2, y1 + t, c);
        fill(img, x1, y2 - t, x2, y2, c);
        fill(img, x1, y1, x1 + t, y2, c);
        fill(img, x2 - t, y1, x2, y2, c);
        let caption = format!("{} {:.2}", d.label, d.confidence);
        let scale = t.max(1);
        let h = 8 * scale + 2;
        let top = if y1 - h >= 0 { y1 - h } else { y1 };
        fill(img, x1, top, x1 + caption.len() as i64 * 8 * scale + 2, top + h, c);
        text(img, x1 + 1, top + 1, &caption, scale, Rgb([255, 255, 255]));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn draws_inside_the_picture_only() {
        let mut img = RgbImage::new(50, 40);
        let det = Detection { class_id: 0, label: "ball".into(), confidence: 0.9, bbox: [10.0, 10.0, 30.0, 30.0] };
        draw(&mut img, &[det.clone(), Detection { bbox: [-20.0, -20.0, 500.0, 500.0], ..det }]);
        assert_eq!(*img.get_pixel(10, 20), Rgb(PALETTE[0])); // left edge of the first box
        assert_eq!(*img.get_pixel(20, 20), Rgb([0, 0, 0])); // inside stays untouched
    }
}
