"""The querygate service: HTTP surface, settings, metrics and the request pipeline."""

import os
import signal
import sys

# One BLAS thread per process, set before numpy loads: the embedder's matrix products share the
# cores with the event loop, and BLAS threads contending for them make each query slower, not
# faster (docs/benchmarks.md).
for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

# `querygate serve` reloads on SIGHUP once it is up. One that arrives while the process is still
# importing (~0.5 s: pydantic, the backends' clients) must not end it by the default action, so
# it is ignored from here until the server (or the workers' supervisor) installs its handler.
if "serve" in sys.argv[1:]:
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
