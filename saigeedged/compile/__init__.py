"""Compiling one job: input checks, calibration, the backends' steps, the bundle, the compile cache."""
