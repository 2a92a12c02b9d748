"""BaSiCPy 2.0 on the tiles hcsflow-basic's bench_fit example wrote (BASIC_WRITE_NPY):
median of 3 fits (after a warm-up) and of 3 transforms, peak RSS. Run it in a
separate virtualenv with basicpy (it needs torch; never add it to the CI oracle
requirements).

  python bench-basicpy.py TILES.npy [--darkfield]
"""
import resource
import sys
import time

import numpy as np
import torch
from basicpy import BaSiC


def median_time(f, repeats=3):
    f()
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        f()
        times.append(time.perf_counter() - t)
    return sorted(times)[len(times) // 2]


def main():
    torch.set_num_threads(torch.get_num_threads())
    tiles = np.load(sys.argv[1])
    dark = "--darkfield" in sys.argv
    state = {}

    def fit():
        b = BaSiC(get_darkfield=dark, device="cpu")
        b.fit(tiles)
        state["b"] = b

    t_fit = median_time(fit)
    rss_fit = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    t_tr = median_time(lambda: state["b"].transform(tiles))
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"basicpy fit{'_dark' if dark else ''} {tiles.shape}: median {t_fit:.3f} s, peak RSS {rss_fit:.0f} MiB; "
          f"transform median {t_tr:.3f} s, peak RSS {rss:.0f} MiB")


if __name__ == "__main__":
    main()
