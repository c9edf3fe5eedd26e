"""Where a run executes: device and precision, data-parallel ranks, CPU threads, memory."""
