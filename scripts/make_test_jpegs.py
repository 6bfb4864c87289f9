#!/usr/bin/env python3
"""JPEG files of the kinds cameras, phones and web pages hand out, and the pixels the reference decodes from each
(not committed; CI runs this beside make_test_checkpoints.py).

    python scripts/make_test_jpegs.py [OUTDIR]      # default: target/testdata/jpeg

Writes OUTDIR/NAME.jpg and OUTDIR/manifest.json. For every file the reference loads, what ultralytics' loader returns
(`cv2.imread(path, cv2.IMREAD_COLOR)`: libjpeg-turbo at its defaults, EXIF orientation applied) is written as RGB rows
to OUTDIR/NAME.rgb, and the manifest entry is {"name", "width", "height", "rgb_sha256", "what"}. Files yolo-edge refuses
by design have {"name", "refused": reason, "what"} instead: a truncated file (OpenCV fills the cut-off rows with grey)
and a progressive file of more scans than the decoder's bound. tests/model/jpeg.rs decodes each with yolo-edge.

Pictures: the fixture photos (real camera content, `../shared/fixtures`) cropped to several sizes, and a seeded
synthetic picture (gradients, hard edges, noise) for the sizes below one MCU. Encoders: OpenCV's (libjpeg-turbo:
samplings 4:4:4, 4:2:2, 4:2:0, 4:4:0, 4:1:1, progressive, restart intervals, optimised Huffman tables, grayscale) and
Pillow's (EXIF orientation, CMYK).
"""

from __future__ import annotations

import hashlib
import io
import json
import sys
from pathlib import Path

import cv2
import numpy as np
from PIL import Image

REPO = Path(__file__).resolve().parent.parent
FIXTURES = REPO.parent / "shared" / "fixtures"
# the decoder's bound on a progressive file's scans (src/vision/jpeg.rs MAX_SCANS)
MAX_SCANS = 500

SAMPLING = {
    "444": cv2.IMWRITE_JPEG_SAMPLING_FACTOR_444,
    "422": cv2.IMWRITE_JPEG_SAMPLING_FACTOR_422,
    "420": cv2.IMWRITE_JPEG_SAMPLING_FACTOR_420,
    "440": cv2.IMWRITE_JPEG_SAMPLING_FACTOR_440,
    "411": cv2.IMWRITE_JPEG_SAMPLING_FACTOR_411,
}


def synthetic(w: int, h: int, seed: int) -> np.ndarray:
    """BGR: two gradients, a hard-edged block and seeded noise, so every sampling and edge rule shows."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w]
    img = np.stack([x * 255 / max(w - 1, 1), y * 255 / max(h - 1, 1), (x + y) * 127 / max(w + h - 2, 1)], -1)
    img[(x // 5 + y // 3) % 2 == 0] = [250, 20, 120]
    img = img + rng.normal(0, 18, img.shape)
    return np.clip(img, 0, 255).astype(np.uint8)


def photo(name: str, x: int, y: int, w: int, h: int) -> np.ndarray:
    return np.ascontiguousarray(cv2.imread(str(FIXTURES / name))[y : y + h, x : x + w])


def cv2_jpeg(bgr: np.ndarray, sampling: str = "420", quality: int = 90, progressive: bool = False, restart: int = 0,
             optimize: bool = False) -> bytes:
    params = [cv2.IMWRITE_JPEG_QUALITY, quality, cv2.IMWRITE_JPEG_PROGRESSIVE, int(progressive),
              cv2.IMWRITE_JPEG_OPTIMIZE, int(optimize), cv2.IMWRITE_JPEG_RST_INTERVAL, restart]
    if bgr.ndim == 3:
        params += [cv2.IMWRITE_JPEG_SAMPLING_FACTOR, SAMPLING[sampling]]
    ok, buf = cv2.imencode(".jpg", bgr, params)
    assert ok
    return buf.tobytes()


def pil_jpeg(bgr: np.ndarray, orientation: int | None = None, mode: str = "RGB") -> bytes:
    im = Image.fromarray(bgr[:, :, ::-1]).convert(mode)
    out = io.BytesIO()
    kw = {"quality": 90}
    if orientation is not None:
        exif = Image.Exif()
        exif[0x0112] = orientation
        kw["exif"] = exif.tobytes()
    im.save(out, "JPEG", **kw)
    return out.getvalue()


def segments(b: bytes) -> tuple[bytes, list[bytes], bytes]:
    """(headers before the first scan, [each SOS segment with its entropy-coded data], the EOI marker)."""
    i, first = 2, None
    scans = []
    while i < len(b):
        assert b[i] == 0xFF, i
        m = b[i + 1]
        if m == 0xD9:
            break
        ln = int.from_bytes(b[i + 2 : i + 4], "big")
        j = i + 2 + ln
        if m == 0xDA:
            # the scan's data runs to the next marker that is not a stuffed 0xFF00 or a restart marker
            while not (b[j] == 0xFF and b[j + 1] != 0x00 and not 0xD0 <= b[j + 1] <= 0xD7):
                j += 1
            first = i if first is None else first
            scans.append(b[i:j])
        elif first is not None:
            scans[-1] += b[i:j]  # tables between scans travel with the scan before them
        i = j
    return b[:first], scans, b[i:]


def cases() -> list[tuple[str, bytes, str, str | None]]:
    """(name, file, what, refused-by-design reason or None)."""
    court, horses = "volleyball-court.jpg", "horses.jpg"
    out = []
    for s in SAMPLING:
        out.append((f"court-{s}", cv2_jpeg(photo(court, 333, 121, 641, 363), s), f"a photo crop, 641x363, {s}", None))
    for s in ("444", "422", "420", "440"):
        for w, h in ((1, 1), (2, 2), (3, 7), (17, 33), (33, 17)):
            out.append((f"synthetic-{w}x{h}-{s}", cv2_jpeg(synthetic(w, h, w * 100 + h), s), f"{w}x{h}, {s}", None))
    out += [
        ("court-progressive", cv2_jpeg(photo(court, 0, 0, 1280, 720), "420", progressive=True), "progressive 4:2:0",
         None),
        ("horses-progressive-444", cv2_jpeg(photo(horses, 0, 0, 773, 512), "444", progressive=True),
         "progressive 4:4:4", None),
        ("court-restart", cv2_jpeg(photo(court, 100, 50, 800, 600), "420", restart=7), "restart interval 7 MCUs", None),
        ("court-optimized", cv2_jpeg(photo(court, 500, 300, 601, 1000 - 300 + 80), "422", optimize=True, quality=75),
         "optimised Huffman tables, quality 75", None),
        ("court-gray", cv2_jpeg(cv2.cvtColor(photo(court, 10, 10, 509, 509), cv2.COLOR_BGR2GRAY)), "grayscale", None),
        ("court-q100", cv2_jpeg(photo(court, 900, 400, 640, 480), "444", quality=100), "quality 100, 4:4:4", None),
    ]
    for o in (3, 6, 8):
        out.append((f"horses-exif-{o}", pil_jpeg(photo(horses, 40, 20, 400, 300), orientation=o),
                    f"EXIF orientation {o} (Pillow's encoder)", None))
    out.append(("horses-cmyk", pil_jpeg(photo(horses, 0, 0, 320, 240), mode="CMYK"), "CMYK (Pillow's encoder)", None))
    # corrupt data that libjpeg-turbo decodes through with a warning, as OpenCV does
    base = cv2_jpeg(photo(court, 0, 0, 640, 480), "420")
    out.append(("extraneous-bytes", base[:-2] + b"\x00\x11\x22" + base[-2:], "3 bytes of junk before the EOI marker",
                None))
    head, scans, eoi = segments(base)
    data = bytearray(scans[0])
    for k in range(len(data) // 2, len(data) // 2 + 64, 8):
        data[k] = data[k] ^ 0x5A if data[k] ^ 0x5A != 0xFF and data[k - 1] != 0xFF else data[k]
    out.append(("corrupt-scan", head + bytes(data) + eoi, "entropy-coded data flipped in the middle", None))
    out.append(("truncated", base[: len(base) * 2 // 3], "cut after two thirds",
                "truncated: a half-written upload is not a picture (OpenCV fills the rest with grey)"))
    # a progressive file whose last scan repeats until there are more scans than the bound
    prog = cv2_jpeg(photo(court, 0, 0, 320, 240), "420", progressive=True)
    head, scans, eoi = segments(prog)
    many = head + b"".join(scans) + scans[-1] * (MAX_SCANS + 10 - len(scans)) + eoi
    out.append(("too-many-scans", many, f"{MAX_SCANS + 10} scans",
                f"more than {MAX_SCANS} scans: each is a pass over every coefficient"))
    return out


def main() -> None:
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else REPO / "target" / "testdata" / "jpeg"
    out.mkdir(parents=True, exist_ok=True)
    manifest = []
    for name, data, what, refused in cases():
        path = out / f"{name}.jpg"
        path.write_bytes(data)
        if refused:
            manifest.append({"name": name, "refused": refused, "what": what})
            continue
        bgr = cv2.imread(str(path), cv2.IMREAD_COLOR)
        assert bgr is not None, f"{name}: OpenCV does not load it"
        rgb = np.ascontiguousarray(bgr[:, :, ::-1])
        (out / f"{name}.rgb").write_bytes(rgb.tobytes())
        manifest.append({"name": name, "width": rgb.shape[1], "height": rgb.shape[0],
                         "rgb_sha256": hashlib.sha256(rgb.tobytes()).hexdigest(), "what": what})
    (out / "manifest.json").write_text(json.dumps({
        "made_by": "scripts/make_test_jpegs.py",
        "reference": f"cv2.imread(path, cv2.IMREAD_COLOR), OpenCV {cv2.__version__}, as RGB",
        "files": manifest}, indent=1))
    print(f"{out}: {len(manifest)} JPEG files")


if __name__ == "__main__":
    main()
