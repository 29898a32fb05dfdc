"""torchvision's ``RandomAffine`` in the crop's own resampling step: what ``Compose([crop +
resize, flip, RandomAffine(...)])`` gives, but as one matrix, each output pixel sampled once,
bilinearly, in the decoded crop (first reduced, antialiased, where it shrinks by more than
:data:`AA_ABOVE`). The matrix rides in the sample's ``Geometry`` for keypoints and boxes.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np
import torch
import torch.nn.functional as F

from .geometry import Matrix

#: region pixels per output pixel above which the region is first reduced (antialiased) to this
#: density: the least error of 1, 1.25, 1.5, 2 and none (benchmarks/affine_fidelity.py)
AA_ABOVE = 1.25


def _inverse(m: Matrix) -> np.ndarray:
    """The 2×3 inverse of a forward matrix (float64)."""
    a, b, c, d, e, f = m
    det = a * e - b * d
    ia, ib, id_, ie = e / det, -b / det, -d / det, a / det
    return np.array([[ia, ib, -ia * c - ib * f], [id_, ie, -id_ * c - ie * f]])


def footprint(m: Matrix) -> tuple[float, float]:
    """Canvas pixels (before the affine) one output pixel spans along x and along y: the row
    norms of the inverse's linear part (1, 1 for a pure rotation; 1/s for a zoom by s)."""
    inv = _inverse(m)
    return float(np.hypot(*inv[0, :2])), float(np.hypot(*inv[1, :2]))


@lru_cache(maxsize=64)
def _centres(oh: int, ow: int) -> tuple[np.ndarray, torch.Tensor]:
    """(x, y, 1) of every output pixel centre, row-major, in float64 and float32 (cached)."""
    ys, xs = np.mgrid[0:oh, 0:ow]
    out = np.stack([xs + 0.5, ys + 0.5, np.ones((oh, ow))], -1).reshape(-1, 3)
    out.flags.writeable = False
    return out, torch.from_numpy(out.astype(np.float32))


def _to_region(m: Matrix, flip: bool, oh: int, ow: int, rh: float, rw: float) -> np.ndarray:
    """2×3 map from output pixels to region pixels: undo the affine, the flip, the resize."""
    inv = _inverse(m)
    if flip:  # x → ow - x on the canvas
        inv[0] = -inv[0]
        inv[0, 2] += ow
    return inv * np.array([[rw / ow], [rh / oh]])


def sampling_grid(m: Matrix, flip: bool, oh: int, ow: int) -> torch.Tensor:
    """``grid_sample``'s 1×oh×ow×2 grid of the region's normalized coordinates (float32)."""
    t = _to_region(m, flip, oh, ow, 2.0, 2.0)
    t[:, 2] -= 1.0
    return (_centres(oh, ow)[1] @ torch.from_numpy(t.T.astype(np.float32))).view(1, oh, ow, 2)


def _coverage(grid: torch.Tensor, oh: int, ow: int) -> torch.Tensor | None:
    """Share of each output pixel inside the crop (fading over one pixel); None if all are."""
    half = torch.tensor([ow / 2, oh / 2], dtype=grid.dtype)
    corners = grid[[0, 0, -1, -1], [0, -1, 0, -1]]
    if bool((half * (1 - corners.abs()) >= 0.4999).all()):  # (float32 at the edge pixels)
        return None
    inside = grid.abs().mul_(-half).add_(half + 0.5).clamp_(0, 1)  # per axis
    return inside[..., 0] * inside[..., 1]


def warp_image(region: np.ndarray, out: np.ndarray, m: Matrix, flip: bool,
               fill: tuple[int, ...] = (0, 0, 0), aa_above: float | None = None) -> None:
    """Sample the H×W×3 uint8 crop ``region`` into ``out`` through ``m`` once, bilinearly; first
    reduced (antialiased) to ``aa_above`` (default :data:`AA_ABOVE`) pixels per output pixel."""
    aa_above = AA_ABOVE if aa_above is None else aa_above
    oh, ow = out.shape[:2]
    rh, rw = region.shape[:2]
    fx, fy = footprint(m)
    # region pixels per output pixel along each axis: where above aa_above, reduced to it
    th = max(1, round(aa_above * oh / fy)) if rh / oh * fy > aa_above else rh
    tw = max(1, round(aa_above * ow / fx)) if rw / ow * fx > aa_above else rw
    if not region.flags.writeable:  # a zero-copy view of a read buffer: torch wants writable
        region = np.array(region)
    # (channels-last, the layout of the H×W×3 pixels: torch's fast uint8 kernels and copies)
    x = torch.from_numpy(region).permute(2, 0, 1)[None].contiguous(
        memory_format=torch.channels_last)
    if (th, tw) != (rh, rw):  # the antialiased (triangle) pre-reduction, on uint8
        x = F.interpolate(x, size=(th, tw), mode="bilinear", antialias=True, align_corners=False)
    grid = sampling_grid(m, flip, oh, ow)
    y = F.grid_sample(x.float(), grid, mode="bilinear", padding_mode="border",
                      align_corners=False)
    cover = _coverage(grid[0], oh, ow)
    if cover is not None:  # fill + (value - fill) × share inside
        level = torch.tensor(fill, dtype=y.dtype)[:, None, None]
        y.sub_(level).mul_(cover).add_(level) if any(fill) else y.mul_(cover)
    torch.from_numpy(out).permute(2, 0, 1)[None].copy_(y.add_(0.5).clamp_(0, 255))


def nearest_points(m: Matrix, flip: bool, oh: int, ow: int, rh: int,
                   rw: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(rows, cols, inside) of the region pixel under each output pixel centre (float64)."""
    p = (_centres(oh, ow)[0] @ _to_region(m, flip, oh, ow, rh, rw).T).reshape(oh, ow, 2)
    col, row = np.floor(p[..., 0]), np.floor(p[..., 1])
    inside = (col >= 0) & (col < rw) & (row >= 0) & (row < rh)
    return (np.clip(row, 0, rh - 1).astype(np.intp), np.clip(col, 0, rw - 1).astype(np.intp),
            inside)
