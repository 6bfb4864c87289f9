//! Sample pictures of the default model's five classes, drawn here with the `image` crate (no
//! files, no Python): what a demo can drop into a hot folder and what the end-to-end tests
//! evaluate. A different renderer from `scripts/make_shapes_dataset.py`, on purpose: a model
//! that finds these learned shapes, not one generator's pixels.

use std::path::Path;

use image::{Rgb, RgbImage};

/// The default model's classes, in class-id order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shape {
    Circle,
    Square,
    Triangle,
    Star,
    Ring,
}

impl Shape {
    pub fn class_id(self) -> usize {
        self as usize
    }
    pub fn name(self) -> &'static str {
        ["circle", "square", "triangle", "star", "ring"][self as usize]
    }
}

/// One drawn object and its box (xyxy, pixels).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DrawnObject {
    pub shape: Shape,
    pub bbox: [f64; 4],
}

/// A drawn picture and what is in it.
#[derive(Debug, Clone)]
pub struct SampleImage {
    pub image: RgbImage,
    pub objects: Vec<DrawnObject>,
}

impl SampleImage {
    /// The objects as a YOLO label file (`class cx cy w h`, normalised).
    pub fn yolo_labels(&self) -> String {
        let (w, h) = (self.image.width() as f64, self.image.height() as f64);
        self.objects
            .iter()
            .map(|o| {
                let b = o.bbox;
                format!(
                    "{} {:.6} {:.6} {:.6} {:.6}\n",
                    o.shape.class_id(),
                    (b[0] + b[2]) / 2.0 / w,
                    (b[1] + b[3]) / 2.0 / h,
                    (b[2] - b[0]) / w,
                    (b[3] - b[1]) / h
                )
            })
            .collect()
    }
}

/// Coverage (0..1) of a pixel by a shape, 4x4 supersampled.
fn coverage(inside: &dyn Fn(f64, f64) -> bool, x: u32, y: u32) -> f64 {
    let mut n = 0;
    for i in 0..4 {
        for j in 0..4 {
            if inside(x as f64 + (i as f64 + 0.5) / 4.0, y as f64 + (j as f64 + 0.5) / 4.0) {
                n += 1;
            }
        }
    }
    n as f64 / 16.0
}

fn point_in_polygon(px: f64, py: f64, pts: &[(f64, f64)]) -> bool {
    let mut inside = false;
    let mut j = pts.len() - 1;
    for i in 0..pts.len() {
        let ((xi, yi), (xj, yj)) = (pts[i], pts[j]);
        if (yi > py) != (yj > py) && px < (xj - xi) * (py - yi) / (yj - yi) + xi {
            inside = !inside;
        }
        j = i;
    }
    inside
}

/// Paints one shape of radius `r` at (cx, cy), rotated by `angle`; returns its box (xyxy).
pub fn paint(img: &mut RgbImage, shape: Shape, cx: f64, cy: f64, r: f64, angle: f64, colour: [u8; 3]) -> [f64; 4] {
    let poly = |n: usize, radius: &dyn Fn(usize) -> f64| -> Vec<(f64, f64)> {
        (0..n)
            .map(|k| {
                let a = angle + k as f64 * std::f64::consts::TAU / n as f64;
                (cx + radius(k) * a.cos(), cy + radius(k) * a.sin())
            })
            .collect()
    };
    let pts = match shape {
        Shape::Square => poly(4, &|_| r),
        Shape::Triangle => poly(3, &|_| r),
        Shape::Star => poly(10, &|k| if k % 2 == 0 { r } else { r * 0.45 }),
        Shape::Circle | Shape::Ring => vec![],
    };
    let inside: Box<dyn Fn(f64, f64) -> bool> = match shape {
        Shape::Circle => Box::new(move |x, y| (x - cx).powi(2) + (y - cy).powi(2) <= r * r),
        Shape::Ring => Box::new(move |x, y| {
            let d2 = (x - cx).powi(2) + (y - cy).powi(2);
            d2 <= r * r && d2 >= (0.6 * r).powi(2)
        }),
        _ => {
            let pts = pts.clone();
            Box::new(move |x, y| point_in_polygon(x, y, &pts))
        }
    };
    let bbox = if pts.is_empty() {
        [cx - r, cy - r, cx + r, cy + r]
    } else {
        let xs = pts.iter().map(|p| p.0);
        let ys = pts.iter().map(|p| p.1);
        [xs.clone().fold(f64::MAX, f64::min), ys.clone().fold(f64::MAX, f64::min), xs.fold(f64::MIN, f64::max), ys.fold(f64::MIN, f64::max)]
    };
    let (x0, y0) = ((bbox[0].floor().max(0.0)) as u32, (bbox[1].floor().max(0.0)) as u32);
    let (x1, y1) = ((bbox[2].ceil() as u32).min(img.width() - 1), (bbox[3].ceil() as u32).min(img.height() - 1));
    for y in y0..=y1 {
        for x in x0..=x1 {
            let a = coverage(&*inside, x, y);
            if a > 0.0 {
                let p = img.get_pixel_mut(x, y);
                for (v, &k) in p.0.iter_mut().zip(&colour) {
                    *v = (*v as f64 * (1.0 - a) + k as f64 * a).round() as u8;
                }
            }
        }
    }
    bbox
}

/// Six fixed scenes (320 to 416 px a side, 18 objects, every class three or four times) on
/// vertical gradients, strong colours, objects of 40 to 80 px radius.
pub fn scenes() -> Vec<SampleImage> {
    use Shape::*;
    type Obj = (Shape, f64, f64, f64, f64);
    let scenes: [(u32, u32, &[Obj]); 6] = [
        (416, 320, &[(Circle, 90.0, 90.0, 50.0, 0.0), (Square, 250.0, 100.0, 60.0, 0.3), (Star, 330.0, 240.0, 55.0, 0.1)]),
        (320, 416, &[(Triangle, 100.0, 110.0, 60.0, 0.5), (Ring, 210.0, 290.0, 70.0, 0.0)]),
        (
            416,
            416,
            &[
                (Star, 100.0, 100.0, 65.0, 0.7),
                (Circle, 300.0, 110.0, 40.0, 0.0),
                (Triangle, 150.0, 300.0, 55.0, 1.2),
                (Square, 310.0, 300.0, 50.0, 0.0),
            ],
        ),
        (400, 300, &[(Ring, 110.0, 150.0, 80.0, 0.0), (Star, 300.0, 150.0, 70.0, 0.3)]),
        (360, 360, &[(Square, 110.0, 250.0, 70.0, 0.8), (Circle, 250.0, 90.0, 60.0, 0.0), (Ring, 280.0, 270.0, 45.0, 0.0)]),
        (
            416,
            352,
            &[
                (Triangle, 300.0, 120.0, 75.0, 2.0),
                (Square, 100.0, 90.0, 45.0, 0.2),
                (Star, 120.0, 260.0, 60.0, 0.0),
                (Circle, 300.0, 280.0, 45.0, 0.0),
            ],
        ),
    ];
    let colours = [[220, 40, 40], [30, 160, 60], [40, 70, 220], [240, 200, 30], [160, 40, 190], [20, 20, 20]];
    let (top, bottom) = ([200.0, 205.0, 215.0], [120.0, 135.0, 150.0]);
    scenes
        .iter()
        .enumerate()
        .map(|(i, &(w, h, objs))| {
            let mut image = RgbImage::from_fn(w, h, |_, y| {
                let t = y as f64 / h as f64;
                Rgb(std::array::from_fn(|c| (top[c] * (1.0 - t) + bottom[c] * t) as u8))
            });
            let objects = objs
                .iter()
                .enumerate()
                .map(|(k, &(shape, cx, cy, r, angle))| DrawnObject {
                    shape,
                    bbox: paint(&mut image, shape, cx, cy, r, angle, colours[(i + k) % colours.len()]),
                })
                .collect();
            SampleImage { image, objects }
        })
        .collect()
}

/// Writes [`scenes`] as a YOLO dataset: `root/images/<split>/NNN.png`, `root/labels/<split>/NNN.txt`
/// and a `root/data.yaml` naming the split and the classes. Returns the picture paths.
pub fn write_yolo_dataset(root: &Path, split: &str) -> Result<Vec<std::path::PathBuf>, image::ImageError> {
    let (images, labels) = (root.join("images").join(split), root.join("labels").join(split));
    std::fs::create_dir_all(&images)?;
    std::fs::create_dir_all(&labels)?;
    let mut out = Vec::new();
    for (i, s) in scenes().iter().enumerate() {
        let p = images.join(format!("{i:03}.png"));
        s.image.save(&p)?;
        std::fs::write(labels.join(format!("{i:03}.txt")), s.yolo_labels())?;
        out.push(p);
    }
    std::fs::write(root.join("data.yaml"), format!("{split}: images/{split}\nnames: [circle, square, triangle, star, ring]\n"))?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scenes_hold_every_class_and_boxes_inside() {
        let s = scenes();
        assert_eq!(s.len(), 6);
        let mut counts = [0; 5];
        for img in &s {
            for o in &img.objects {
                counts[o.shape.class_id()] += 1;
                let b = o.bbox;
                assert!(b[0] >= 0.0 && b[1] >= 0.0 && b[2] <= img.image.width() as f64 && b[3] <= img.image.height() as f64, "{o:?}");
                // the centre of every filled shape is painted, far from the background there
                if o.shape != Shape::Ring {
                    let (x, y) = (((b[0] + b[2]) / 2.0) as u32, ((b[1] + b[3]) / 2.0) as u32);
                    let p = img.image.get_pixel(x, y).0;
                    let bg = img.image.get_pixel(0, y).0;
                    assert!((0..3).any(|c| (p[c] as i32 - bg[c] as i32).abs() > 40), "{o:?} {p:?} {bg:?}");
                }
            }
        }
        assert_eq!(counts.iter().sum::<usize>(), 18);
        assert!(counts.iter().all(|&c| c >= 3), "{counts:?}");
    }

    #[test]
    fn yolo_labels_are_normalised() {
        for img in scenes() {
            for line in img.yolo_labels().lines() {
                let v: Vec<f64> = line.split(' ').map(|t| t.parse().unwrap()).collect();
                assert_eq!(v.len(), 5);
                assert!(v[1..].iter().all(|x| (0.0..=1.0).contains(x)), "{line}");
            }
        }
    }
}
