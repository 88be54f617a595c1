"""Synthetic snapshots: an allocator simulator and incident scenarios with ground truth."""

from snapana.allocator_model.simulator import CachingAllocatorSim, SimulatedOOM

__all__ = ["CachingAllocatorSim", "SimulatedOOM"]
