"""Synthetic snapshots: an allocator simulator and incident scenarios with ground truth."""

from .allocator import CachingAllocatorSim, SimulatedOOM

__all__ = ["CachingAllocatorSim", "SimulatedOOM"]
