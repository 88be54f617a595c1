"""The recorder's CUDA backend replaced by a CPU stand-in, as source text for a pytester
conftest or a notebook cell: it records which calls were made and returns a simulated training
step ("fsdp-train-step") as its snapshot, so budgets can be set around that step's ground truth
(the scenario's own sidecar). `OutOfMemoryError` is what torch's is called."""

STAND_IN = '''
from snapana.record import cuda
from snapana.synth.scenarios import run_scenario


class StandIn(cuda.CudaBackend):
    def __init__(self, available):
        self._available = available
        self.calls = []

    def available(self):
        return self._available

    def start_history(self, max_entries, stacks):
        self.calls.append("start")

    def stop_history(self):
        self.calls.append("stop")

    def snapshot(self):
        self.calls.append("snapshot")
        return dict(run_scenario("fsdp-train-step")[0])


class OutOfMemoryError(RuntimeError):
    """What torch.OutOfMemoryError is called."""
'''
