"""One model of PyTorch's CUDA caching allocator (issue 45), shared by the simulator that
writes the samples (`synth`) and the analysis that re-runs a capture's recorded requests
(`analysis.allocator_replay`): its size rules (`rules`), the simulator (`simulator`) and the
frame table its trace entries carry (`frames`)."""
