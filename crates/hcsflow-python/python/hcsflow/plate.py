"""Plates from Python: :func:`open_plate` reads a plate folder's metadata as
the engine does (ImageXpress, Opera Phenix, OME-Zarr, OME-TIFF or an hcsflow
run's output; nothing is ever written),
and :meth:`Plate.stack` reads any stack of its images into a numpy array."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any

from . import _hcsflow
from ._hcsflow import CompileError, PlateError

#: The components of an image, in the order of the stack key.
COMPONENTS = ("site", "channel", "z_index", "timepoint")


@dataclass(frozen=True)
class Image:
    """One image (one plane) and its components (all 1-based). ``path`` is its
    file (an OME-Zarr array's folder); ``at`` where the plane is in it when it
    holds several (``{"kind": "tiff-page", "page": 3}``, ``{"kind": "zarr",
    "index": [0, 1, 2, 0, 0]}``), else ``None``."""
    well: str
    site: int
    channel: int
    z_index: int
    timepoint: int
    path: str
    at: dict[str, Any] | None = None


class Plate:
    """A plate as the engine reads it. ``metadata`` is the full metadata dict
    (pixel size, grid, stage positions, channel names, image size, ...);
    ``missing`` the images the metadata promises but that are absent;
    ``warnings`` everything odd that did not stop reading."""

    def __init__(self, data: dict[str, Any]) -> None:
        self.format: str = data["format"]
        self.root: str = data["root"]
        self.descriptor: str = data["descriptor"]
        self.metadata: dict[str, Any] = data["metadata"]
        self.images = [Image(**{k: i[k] for k in ("well", "site", "channel", "z_index", "timepoint", "path")},
                             at=i.get("at")) for i in data["images"]]
        self.missing: list[dict[str, Any]] = data["missing"]
        self.warnings: list[str] = data["warnings"]

    def __repr__(self) -> str:
        return (f"Plate({self.root!r}, {self.format}, {len(self.wells)} wells × {len(self.sites)} sites × "
                f"{len(self.channels)} channels × {len(self.z_indices)} z × {len(self.timepoints)} t)")

    def _values(self, component: str) -> list[int]:
        return sorted({getattr(i, component) for i in self.images})

    @property
    def wells(self) -> list[str]:
        """Wells with at least one image, in plate order."""
        seen: dict[str, None] = {}
        for i in self.images:  # the engine lists images in plate order
            seen.setdefault(i.well)
        return list(seen)

    @property
    def sites(self) -> list[int]:
        return self._values("site")

    @property
    def channels(self) -> dict[int, str | None]:
        """Channel number → name (``None`` where the metadata names none)."""
        names = {int(k): v for k, v in self.metadata.get("channel_names", {}).items()}
        return {c: names.get(c) for c in self._values("channel")}

    @property
    def z_indices(self) -> list[int]:
        return self._values("z_index")

    @property
    def timepoints(self) -> list[int]:
        return self._values("timepoint")

    @property
    def pixel_size_um(self) -> float | None:
        return self.metadata.get("pixel_size_um")

    @property
    def grid(self) -> tuple[int, int]:
        """Site grid (rows, columns)."""
        return self.metadata["grid_rows"], self.metadata["grid_cols"]

    def stack(self, well: str, *, site: int | None = 1, channel: int | None = 1, z_index: int | None = None,
              timepoint: int | None = 1) -> Any:
        """The images of ``well`` along the one component left ``None`` (by
        default ``z_index``: the z planes of site 1, channel 1, timepoint 1),
        in order, as one ``[Z, Y, X]`` numpy array. An image that is missing
        is an error naming it."""
        fixed = {"site": site, "channel": channel, "z_index": z_index, "timepoint": timepoint}
        free = [c for c, v in fixed.items() if v is None]
        if len(free) != 1:
            raise CompileError(f"stack: leave exactly one of {', '.join(COMPONENTS)} as None (the stack axis); "
                               f"got {free or 'none'}")
        axis = free[0]
        if well not in self.wells:
            raise PlateError(f"{self.root}: no well '{well}' (the plate has {', '.join(self.wells)})")
        chosen = sorted((i for i in self.images if i.well == well
                         and all(getattr(i, c) == v for c, v in fixed.items() if v is not None)),
                        key=lambda i: getattr(i, axis))
        expected = getattr(self, {"site": "sites", "channel": "channels", "z_index": "z_indices",
                                  "timepoint": "timepoints"}[axis])
        have = [getattr(i, axis) for i in chosen]
        absent = [v for v in expected if v not in have]
        if absent or not chosen:
            where = ", ".join(f"{c} {v}" for c, v in fixed.items() if v is not None)
            raise PlateError(f"{self.root}: well {well}, {where}: no image for {axis} {absent or list(expected)}")
        return _hcsflow.read_stack([i.path for i in chosen],
                                   [json.dumps(i.at) if i.at is not None else None for i in chosen])


def open_plate(path: str | os.PathLike[str], format: str | None = None) -> Plate:
    """Reads the plate at ``path`` (``format``: ``"imagexpress"``,
    ``"opera-phenix"``, ``"ome-zarr"``, ``"ome-tiff"``, ``"hcsflow"``, or
    ``None`` to detect it)."""
    return Plate(json.loads(_hcsflow.plate_json(os.fspath(path), format)))
