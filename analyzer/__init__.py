"""snapana: offline analyzer for GPU memory incidents in PyTorch jobs."""
