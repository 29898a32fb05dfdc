"""Real-looking test photos: random crops of the sample photographs scikit-image ships (no network),
with :func:`make_web_photos` the JPEG properties of web photo collections."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import TypeVar

import numpy as np
import simplejpeg
from PIL import Image

from feedpipe.errors import MissingDependencyError
from feedpipe.schema.codecs import JPEG_PROGRESSIVE, jpeg_frame

T = TypeVar("T")
PHOTOS = ("astronaut", "coffee", "chelsea", "rocket", "hubble_deep_field", "immunohistochemistry",
          "retina")
#: the photographs behind :func:`make_web_photos`, one per class: camera photos (NASA's astronaut,
#: coffee, Chelsea the cat, a rocket launch, the left view of a stereo motorcycle pair), the Hubble
#: deep field and a fundus camera's retina; 300-1411 px as shipped in scikit-image's wheel
WEB_PHOTOS = ("astronaut", "coffee", "chelsea", "rocket", "motorcycle", "hubble_deep_field",
              "retina")


def _load_photos(names: tuple[str, ...]) -> list[np.ndarray]:
    try:
        import skimage.data
    except ImportError as exc:
        raise MissingDependencyError("sample photos need scikit-image: pip install 'feedpipe[demo]'"
                                     ) from exc
    return [np.asarray(skimage.data.stereo_motorcycle()[0] if n == "motorcycle" else
                       getattr(skimage.data, n)())[:, :, :3] for n in names]


def _class_folders(out: str | Path, classes: int, seed: int, photos: tuple[str, ...] = PHOTOS
                   ) -> tuple[Path, np.random.Generator, tuple[str, ...], list[np.ndarray]]:
    """The output tree's class folders (one per photograph), the generator and the photographs."""
    out = Path(out)
    names = tuple(photos[: max(1, min(classes, len(photos)))])
    for name in names:
        (out / name).mkdir(parents=True, exist_ok=True)
    return out, np.random.default_rng(seed), names, _load_photos(names)


def make_photos(out: str | Path, n: int, *, size: tuple[int, int] = (500, 375), classes: int = 4,
                quality: int = 90, seed: int = 0) -> Path:
    """Write ``n`` JPEG photos (about ``size`` W×H) into an ImageFolder tree ``out/<class>/``,
    each class cropped from its own photograph (learnable labels) with varied scale, aspect, flip."""
    out, rng, names, photos = _class_folders(out, classes, seed)
    for i in range(n):
        c = i % len(names)
        src = photos[c]
        h, w = src.shape[:2]
        tw = int(size[0] * rng.uniform(0.92, 1.08))
        th = int(size[1] * rng.uniform(0.92, 1.08))
        scale = rng.uniform(0.45, 1.0) * min(w / tw, h / th)
        cw, ch = max(8, int(tw * scale)), max(8, int(th * scale))
        x, y = rng.integers(0, w - cw + 1), rng.integers(0, h - ch + 1)
        img = Image.fromarray(src[y:y + ch, x:x + cw]).resize((tw, th), Image.BILINEAR)
        if rng.random() < 0.5:
            img = img.transpose(Image.FLIP_LEFT_RIGHT)
        img.save(out / names[c] / f"{i:06d}.jpg", "JPEG", quality=quality)
    return out


# --- web photos: the JPEG properties of photo collections gathered from the web --------------
# (the mix is documented in benchmarks/README.md). Each entry: (value, share).
WEB_SIDES = ((640, .10), (800, .10), (1024, .15), (1280, .30), (1600, .15), (2048, .10),
             (3000, .05), (4000, .05))  # the longer side, px
WEB_ASPECTS = (((3, 2), .45), ((4, 3), .35), ((16, 9), .10), ((1, 1), .10))
WEB_PROGRESSIVE = 0.40       # share of progressive files (libjpeg's standard scan script)
WEB_SUBSAMPLING = (("4:2:0", .70), ("4:4:4", .30))
WEB_QUALITY = (75, 95)       # uniform, inclusive
WEB_PORTRAIT = 0.25          # share shown portrait; half of those with EXIF are camera-rotated
WEB_EXIF = 0.60              # share with an EXIF block (make, model, date, orientation)
WEB_UPSIDE_DOWN = 0.03       # share of EXIF landscape files tagged orientation 3
WEB_DOWNSCALE = (0.5, 1.0)   # each photo's pixels: the source's, shrunk by this much at most
_SAMPLING = {"4:4:4": 0, "4:2:2": 1, "4:2:0": 2}  # Pillow's subsampling codes
#: the transpose that stores an upright image under each EXIF orientation (undone when loading)
_STORE_AS = {3: Image.ROTATE_180, 6: Image.ROTATE_90, 8: Image.ROTATE_270}


def _pick(rng: np.random.Generator, table: tuple[tuple[T, float], ...]) -> T:
    """One value of a (value, share) table, drawn by share."""
    shares = np.array([share for _, share in table])
    return table[int(rng.choice(len(table), p=shares / shares.sum()))][0]


def _exif(orientation: int, rng: np.random.Generator) -> bytes:
    exif = Image.Exif()
    exif[0x010F], exif[0x0110] = "FeedpipeCam", f"Web {int(rng.integers(1, 9))}"
    exif[0x0132] = f"2026:{int(rng.integers(1, 13)):02d}:{int(rng.integers(1, 29)):02d} 12:00:00"
    exif[0x0112] = orientation
    return exif.tobytes()


def make_web_photos(out: str | Path, n: int, *, classes: int = 7, seed: int = 0,
                    scale: float = 1.0, progressive: bool = True) -> Path:
    """Write ``n`` JPEGs with the ``WEB_*`` tables' properties into ``out/<class>/``, each class
    cut from its own :data:`WEB_PHOTOS` photograph, never upscaled; ``scale`` shrinks every size
    (for tests); ``progressive=False`` writes the same files all baseline."""
    out, rng, names, photos = _class_folders(out, classes, seed, WEB_PHOTOS)
    for i in range(n):
        c = i % len(names)
        side = max(16, round(_pick(rng, WEB_SIDES) * scale))
        aw, ah = _pick(rng, WEB_ASPECTS)
        w, h = side, max(16, round(side * ah / aw))
        portrait, tagged = rng.random() < WEB_PORTRAIT, rng.random() < WEB_EXIF
        if portrait:
            w, h = h, w
        orientation = 1
        if tagged and portrait and rng.random() < 0.5:
            orientation = 6 if rng.random() < 0.6 else 8  # a camera held on its side
        elif tagged and not portrait and rng.random() < WEB_UPSIDE_DOWN:
            orientation = 3
        img = _real_pixels(photos[c], w, h, rng)
        if orientation != 1:
            img = img.transpose(_STORE_AS[orientation])
        save = {"quality": int(rng.integers(WEB_QUALITY[0], WEB_QUALITY[1] + 1)),
                "subsampling": _SAMPLING[_pick(rng, WEB_SUBSAMPLING)]}
        if rng.random() < WEB_PROGRESSIVE:
            save["progressive" if progressive else "optimize"] = True
        elif rng.random() < 0.5:
            save["optimize"] = True  # optimized Huffman tables, as many web encoders write
        if tagged:
            save["exif"] = _exif(orientation, rng)
        img.save(out / names[c] / f"{i:06d}.jpg", "JPEG", **save)
    return out


def _real_pixels(src: np.ndarray, w: int, h: int, rng: np.random.Generator) -> Image.Image:
    """A ``w``×``h`` image of ``src``'s own pixels: a random crop shrunk by :data:`WEB_DOWNSCALE`,
    mirrored where the photograph is smaller (every 8×8 block holds real detail), maybe flipped."""
    sh, sw = src.shape[:2]
    s = rng.uniform(*WEB_DOWNSCALE)
    cw, ch = min(sw, int(np.ceil(w / s))), min(sh, int(np.ceil(h / s)))
    x, y = rng.integers(0, sw - cw + 1), rng.integers(0, sh - ch + 1)
    img = Image.fromarray(src[y:y + ch, x:x + cw]).resize(
        (max(8, min(w, round(cw * s))), max(8, min(h, round(ch * s)))), Image.LANCZOS)
    arr = np.asarray(img)
    arr = np.pad(arr, ((0, h - arr.shape[0]), (0, w - arr.shape[1]), (0, 0)), mode="symmetric")
    if rng.random() < 0.5:
        arr = arr[:, ::-1]
    return Image.fromarray(np.ascontiguousarray(arr))


def jpeg_mix(files: list[Path]) -> dict[str, object]:
    """What a set of JPEG files holds (shares of progressive files, subsamplings, orientations;
    longer side; bits per pixel), recorded by a benchmark beside its figures."""
    sizes, prog, sampling, orient, sides, pixels = 0, 0, [], [], [], 0
    for p in files:
        data = p.read_bytes()
        frame = jpeg_frame(data)
        if frame is None:
            continue
        sizes += len(data)
        prog += frame[4] in JPEG_PROGRESSIVE
        sampling.append(simplejpeg.decode_jpeg_header(data)[3])
        orient.append(frame[3])
        sides.append(max(frame[:2]))
        pixels += frame[0] * frame[1]
    k = max(1, len(sides))

    def shares(values: list) -> dict[str, float]:
        return {str(v): round(values.count(v) / k, 3) for v in sorted(set(values))}

    return {"files": len(sides), "progressive": round(prog / k, 3),
            "subsampling": shares(sampling), "orientation": shares(orient),
            "longer_side_px": [min(sides, default=0), int(np.median(sides)) if sides else 0,
                               max(sides, default=0)],
            "bits_per_pixel": round(8 * sizes / max(1, pixels), 2)}


def blob_mask(h: int, w: int, classes: int, rng: np.random.Generator) -> np.ndarray:
    """An H×W uint8 mask of 1–4 smooth random blobs with indices 1..classes-1 (0 = background)."""
    from scipy import ndimage

    mask = np.zeros((h, w), np.uint8)
    for _ in range(int(rng.integers(1, 5))):
        noise = ndimage.gaussian_filter(rng.standard_normal((h // 4 + 1, w // 4 + 1)), 3)
        blob = np.kron(noise, np.ones((4, 4)))[:h, :w] > np.quantile(noise, 0.85)
        mask[blob] = int(rng.integers(1, max(2, classes)))
    return mask


def make_segmentation(out: str | Path, n: int, *, size: tuple[int, int] = (500, 375),
                      classes: int = 4, quality: int = 90, seed: int = 0) -> tuple[Path, Path]:
    """Write ``n`` photo/mask pairs, ``out/images/<i>.jpg`` and ``out/masks/<i>.png``: random
    blobs, the photo tinted inside them (a colour per class) so the objects are learnable."""
    out = Path(out)
    photos_dir = make_photos(out / "_photos", n, size=size, classes=1, quality=quality, seed=seed)
    images, masks = out / "images", out / "masks"
    images.mkdir(parents=True, exist_ok=True)
    masks.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed + 1)
    tint = rng.integers(0, 256, (max(2, classes), 3)).astype(np.float32)
    for i, p in enumerate(sorted(photos_dir.rglob("*.jpg"))):
        with Image.open(p) as im:
            rgb = np.asarray(im.convert("RGB"), dtype=np.float32)
        mask = blob_mask(rgb.shape[0], rgb.shape[1], classes, rng)
        inside = mask > 0
        rgb[inside] = 0.5 * rgb[inside] + 0.5 * tint[mask[inside]]
        Image.fromarray(rgb.astype(np.uint8)).save(images / f"{i:06d}.jpg", "JPEG",
                                                   quality=quality)
        Image.fromarray(mask, "L").save(masks / f"{i:06d}.png")
    shutil.rmtree(photos_dir)
    return images, masks
