"""What a device's kernels cost: its profile (measured kernel facts, one file per device) and the cost functions that
read it."""
