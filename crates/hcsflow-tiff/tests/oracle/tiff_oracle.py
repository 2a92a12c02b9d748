"""tifffile as an independent oracle for hcsflow-tiff's tests.

Usage:
  tiff_oracle.py write OUT.tif OUT.raw key=value...
      Writes a TIFF with tifffile, one page per plane, from data made by
      numpy with a fixed seed, and the same pixels as raw C-order bytes in
      native byte order. Keys: dtype (uint8|uint16|float32), shape (Z,Y,X),
      seed, compression (TIFF code: 1, 5, 8, 32773, 32946), predictor (0|1),
      tile (H,W or empty), rowsperstrip, byteorder (<|>), bigtiff (0|1),
      photometric (minisblack|miniswhite), description.
  tiff_oracle.py read IN.tif OUT.raw
      Reads every page with tifffile, writes the stacked pixels as raw
      C-order native bytes and prints key=value lines describing the file.
  tiff_oracle.py batch COMMANDS.txt
      Runs one command per line (arguments separated by tabs) in this one
      process, framing the output of command i by "### begin i" and
      "### end i" lines. Saves the interpreter start-up per file.
"""

import sys

import numpy as np
import tifffile


def make_data(dtype, shape, seed):
    rng = np.random.default_rng(seed)
    if dtype == "float32":
        data = (rng.standard_normal(shape) * 1000).astype(np.float32)
        flat = data.reshape(-1)
        special = [np.inf, -np.inf, -0.0, np.float32(1e-40)]
        flat[: len(special)] = special[: flat.size]
        return data
    info = np.iinfo(dtype)
    data = rng.integers(0, int(info.max) + 1, size=shape, dtype=dtype)
    flat = data.reshape(-1)
    flat[0], flat[-1] = 0, info.max
    return data


def write(out_tif, out_raw, args):
    opts = dict(a.split("=", 1) for a in args)
    dtype = opts.get("dtype", "uint16")
    shape = tuple(int(v) for v in opts.get("shape", "2,37,53").split(","))
    data = make_data(dtype, shape, int(opts.get("seed", "1")))
    tile = opts.get("tile", "")
    kwargs = dict(
        photometric=opts.get("photometric", "minisblack"),
        compression=int(opts.get("compression", "1")),
        metadata=None,
    )
    if int(opts.get("predictor", "0")):
        kwargs["predictor"] = True
    if tile:
        kwargs["tile"] = tuple(int(v) for v in tile.split(","))
    elif "rowsperstrip" in opts:
        kwargs["rowsperstrip"] = int(opts["rowsperstrip"])
    with tifffile.TiffWriter(
        out_tif,
        bigtiff=bool(int(opts.get("bigtiff", "0"))),
        byteorder=opts.get("byteorder", "<"),
    ) as tw:
        for z, plane in enumerate(data):
            desc = opts.get("description") if z == 0 else None
            tw.write(plane, description=desc, **kwargs)
    with open(out_raw, "wb") as f:
        f.write(np.ascontiguousarray(data).astype(data.dtype.newbyteorder("="), copy=False).tobytes())
    print("ok")


def hexstr(value):
    if value is None:
        return ""
    if isinstance(value, str):
        value = value.encode("utf-8")
    return bytes(value).hex()


def read(in_tif, out_raw):
    with tifffile.TiffFile(in_tif) as tf:
        pages = list(tf.pages)
        data = np.stack([p.asarray() for p in pages])
        p0 = pages[0]
        tags = p0.tags
        print(f"pages={len(pages)}")
        print(f"shape={','.join(str(s) for s in data.shape)}")
        print(f"dtype={data.dtype.name}")
        print(f"bigtiff={int(tf.is_bigtiff)}")
        print(f"byteorder={tf.byteorder}")
        print(f"compression={int(p0.compression)}")
        print(f"predictor={int(p0.predictor)}")
        print(f"description_hex={hexstr(p0.description if 270 in tags else None)}")
        for name in ("XResolution", "YResolution"):
            tag = tags.get(name)
            value = "" if tag is None else f"{tag.value[0]}/{tag.value[1]}"
            print(f"{name}={value}")
        unit = tags.get("ResolutionUnit")
        print(f"ResolutionUnit={'' if unit is None else int(unit.value)}")
        extra = tags.get(65500)
        print(f"tag65500_hex={hexstr(None if extra is None else extra.value)}")
        resolutions = [p.get_resolution("micrometer") if hasattr(p, "get_resolution") else None for p in pages]
        print(f"pixel_size_um={'' if resolutions[0] is None else 1.0 / resolutions[0][0]}")
    with open(out_raw, "wb") as f:
        f.write(np.ascontiguousarray(data).astype(data.dtype.newbyteorder("="), copy=False).tobytes())


def batch(path):
    with open(path, encoding="utf-8") as f:
        commands = [line.rstrip("\n").split("\t") for line in f if line.strip()]
    for i, command in enumerate(commands):
        print(f"### begin {i}")
        main(command)
        print(f"### end {i}")


def main(argv):
    if len(argv) == 2 and argv[0] == "batch":
        batch(argv[1])
    elif len(argv) >= 3 and argv[0] == "write":
        write(argv[1], argv[2], argv[3:])
    elif len(argv) == 3 and argv[0] == "read":
        read(argv[1], argv[2])
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main(sys.argv[1:])
