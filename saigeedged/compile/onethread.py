"""Imported first by the fork server of the compile children (child.PRELOAD), before anything loads numpy: OpenBLAS
runs on the calling thread only, unless the service's environment says otherwise.

The children's work is onnxruntime's (its own thread pools, spinning off) and numpy math on a few vectors; OpenBLAS
would start a spinning thread per core in the fork server and again in each child, 0.14 s of CPU and 0.2 s before
the daemon's first compile on a 2-core host, taken from the container step and the daemon beside them.
"""

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
