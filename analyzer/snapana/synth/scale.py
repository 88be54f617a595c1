"""Large synthetic snapshots (10^5 .. 10^7 trace entries) for scale tests and benchmarks.

`CachingAllocatorSim` models the allocator exactly but searches every segment on each
malloc, which is far too slow for millions of entries. This writer uses a simpler allocator
that is still consistent by construction: every segment is carved into blocks once (a block
keeps its address and size for its whole life), a freed block goes back to a free list of its
rounded size (the best fit of PyTorch's allocator in a training loop's steady state, where
every step asks for the same sizes), and `empty_cache` releases segments whose blocks are all
free. So the final segments are exactly what replaying the trace gives.

The workload is a transformer training loop: parameters and optimizer state allocated before
recording began, then steps of forward (activations saved per layer, temporaries freed at
once), loss, backward on the autograd thread (gradient temporaries, saved activations freed
layer by layer), a gradient all-reduce buffer freed through a stream (``free_requested`` now,
``free_completed`` later) and the optimizer. The sequence length changes now and then, so new
sizes make segments grow, and every so often ``empty_cache`` gives idle segments back.

Stacks look like ``_record_memory_history(stacks="all")``: allocator and ATen C++ frames
innermost, Python frames interleaved with interpreter frames, the process entry point
outermost; 30-100 frames each, a few hundred distinct frames. As in PyTorch's own pickle, each
distinct frame is one dict object, so pickle's memo writes it once. PyTorch also writes a new
frame list per captured traceback (`py_symbolize` shares a list only between the entries of one
traceback): a list per trace entry or so, which `list_per_entry` reproduces. By default each
distinct stack is one list object, a file a quarter the size that loads five times faster.
"""

from __future__ import annotations

import pickle
import random
from pathlib import Path
from typing import Any

from snapana.allocator_model.frames import FrameDict
from snapana.allocator_model.rules import MiB, allocation_size, is_small, round_size
from snapana.io.output import atomic_path

from .stacks import (
    ATTN,
    BACKWARD_STEP,
    FORWARD_STEP,
    LOSS,
    MLP,
    OPTIMIZER_BUILD,
    OUTPUT_LAYER,
    SLIME_TRAIN,
    SWIGLU,
    TE_ATTN,
    TE_LINEAR,
    TE_LN_LINEAR,
    TORCH,
    Chain,
    ddp_buffer_chain,
    layer_chain,
)

TIME_ORIGIN_US = 1_767_225_600_000_000
ADDRESS_ORIGIN = 0x7F2A_0000_0000
MAX_FRAMES = 100

_CPP_ALLOC = [
    ("torch::unwind::unwind()", "??"),
    ("torch::CapturedTraceback::gather(bool, bool, bool)", "??"),
    ("torch::cuda::(anonymous namespace)::gather_with_cpp()", "memory_snapshot.cpp"),
    ("c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::malloc(signed char, "
     "unsigned long, CUstream_st*)", "CUDACachingAllocator.cpp"),
    ("c10::cuda::CUDACachingAllocator::Native::NativeCachingAllocator::malloc(void**, signed "
     "char, unsigned long, CUstream_st*)", ""),
    ("c10::cuda::CUDACachingAllocator::Native::NativeCachingAllocator::allocate(unsigned "
     "long)", ""),
    ("at::TensorBase at::detail::_empty_generic<long>(c10::ArrayRef<long>, c10::Allocator*, "
     "c10::DispatchKeySet, c10::ScalarType, std::optional<c10::MemoryFormat>)", ""),
    ("at::detail::empty_generic(c10::ArrayRef<long>, c10::Allocator*, c10::DispatchKeySet, "
     "c10::ScalarType, std::optional<c10::MemoryFormat>)", "??"),
    ("at::detail::empty_cuda(c10::ArrayRef<long>, c10::ScalarType, "
     "std::optional<c10::Device>, std::optional<c10::MemoryFormat>)", "??"),
    ("at::native::empty_cuda(c10::ArrayRef<long>, std::optional<c10::ScalarType>, "
     "std::optional<c10::Layout>, std::optional<c10::Device>, std::optional<bool>, "
     "std::optional<c10::MemoryFormat>)", "??"),
]
_CPP_FREE = [
    ("torch::unwind::unwind()", "??"),
    ("torch::CapturedTraceback::gather(bool, bool, bool)", "??"),
    ("torch::cuda::(anonymous namespace)::gather_with_cpp()", "memory_snapshot.cpp"),
    ("c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::free(c10::cuda::"
     "CUDACachingAllocator::Native::Block*)", "CUDACachingAllocator.cpp"),
    ("c10::cuda::CUDACachingAllocator::Native::local_raw_delete(void*)", ""),
    ("c10::StorageImpl::~StorageImpl()", "??"),
    ("c10::TensorImpl::~TensorImpl()", "??"),
    ("c10::intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl>::reset_()", "??"),
]
_INTERP = [
    ("_PyEval_EvalFrameDefault", "??"),
    ("_PyFunction_Vectorcall", "??"),
    ("PyObject_Call", "??"),
    ("method_vectorcall", "??"),
    ("_PyObject_MakeTpCall", "??"),
    ("slot_tp_call", "??"),
]
_DISPATCH = [  # the dispatcher's unboxing frames, between an autograd node and its kernel
    ("c10::impl::wrap_kernel_functor_unboxed_<c10::impl::detail::WrapFunctionIntoFunctor_<"
     "c10::CompileTimeFunctionPointer<at::Tensor (c10::DispatchKeySet, at::Tensor const&)>>"
     ">::call(c10::OperatorKernel*, c10::DispatchKeySet, at::Tensor const&)", "??"),
    ("c10::Dispatcher::redispatch(c10::OperatorHandle const&, c10::DispatchKeySet)",
     "Dispatcher.h"),
    ("torch::autograd::VariableType::(anonymous namespace)::redispatch(c10::DispatchKeySet)",
     "VariableType_3.cpp"),
    ("c10::impl::BoxedKernelWrapper::call(c10::BoxedKernel const&)", "boxing.h"),
    ("c10::Dispatcher::call(c10::TypedOperatorHandle const&)", "Dispatcher.h"),
    ("torch::autograd::impl::run_backward_hooks(torch::autograd::Node&)", "function.cpp"),
]
_ENTRY = [
    ("pymain_run_python", "??"), ("Py_RunMain", "??"), ("Py_BytesMain", "??"),
    ("__libc_start_call_main", "??"), ("__libc_start_main_alias_2", ""), ("_start", "??"),
]
_ENGINE = [
    ("torch::autograd::Node::operator()(std::vector<at::Tensor, "
     "std::allocator<at::Tensor> >&&)", "function.h"),
    ("torch::autograd::call_function(std::shared_ptr<torch::autograd::GraphTask>&, "
     "torch::autograd::Node*, torch::autograd::InputBuffer&)", "engine.cpp"),
    ("torch::autograd::Engine::evaluate_function(std::shared_ptr<torch::autograd::"
     "GraphTask>&, torch::autograd::Node*, torch::autograd::InputBuffer&, std::shared_ptr"
     "<torch::autograd::ReadyQueue> const&)", "engine.cpp"),
    ("torch::autograd::Engine::thread_main(std::shared_ptr<torch::autograd::GraphTask> "
     "const&)", "engine.cpp"),
    ("torch::autograd::Engine::thread_init(int, std::shared_ptr<torch::autograd::ReadyQueue> "
     "const&, bool)", "engine.cpp"),
    ("torch::autograd::python::PythonEngine::thread_init(int, std::shared_ptr<torch::"
     "autograd::ReadyQueue> const&, bool)", "python_engine.cpp"),
    ("std::thread::_State_impl<std::thread::_Invoker<std::tuple<void (torch::autograd::"
     "Engine::*)(int, std::shared_ptr<torch::autograd::ReadyQueue> const&, bool), "
     "torch::autograd::Engine*, signed char, std::shared_ptr<torch::autograd::ReadyQueue>, "
     "bool> > >::_M_run()", "??"),
    ("execute_native_thread_routine", "thread.cc"), ("start_thread", "??"), ("clone", "??"),
]


def _op_frames(op: str) -> list[tuple[str, str]]:
    """The dispatcher frames of one ATen op (innermost first)."""
    return [
        (f"at::native::{op}_out_cuda(at::Tensor const&, at::Tensor&)", f"{op}.cu"),
        (f"at::native::{op}_cuda(at::Tensor const&)", f"{op}.cpp"),
        (f"at::(anonymous namespace)::wrapper_CUDA_{op}(at::Tensor const&)",
         "RegisterCUDA.cpp"),
        (f"at::_ops::{op}::redispatch(c10::DispatchKeySet, at::Tensor const&)",
         "Operators_2.cpp"),
        (f"torch::autograd::VariableType::(anonymous namespace)::{op}(c10::DispatchKeySet, "
         "at::Tensor const&)", "VariableType_1.cpp"),
        (f"at::_ops::{op}::call(at::Tensor const&)", "Operators_2.cpp"),
        (f"torch::autograd::THPVariable_{op}(_object*, _object*, _object*)",
         "python_torch_functions_0.cpp"),
    ]


def _backward_frames(op: str) -> list[tuple[str, str]]:
    node = "".join(p.capitalize() for p in op.split("_")) + "Backward0"
    return [
        (f"at::native::{op}_backward_cuda(at::Tensor const&, at::Tensor const&)",
         f"{op}_backward.cu"),
        (f"at::_ops::{op}_backward::call(at::Tensor const&, at::Tensor const&)",
         "Operators_0.cpp"),
        (f"torch::autograd::generated::details::{op}_backward(at::Tensor, at::Tensor)",
         "FunctionsManual.cpp"),
        (f"torch::autograd::generated::{node}::apply(std::vector<at::Tensor, "
         "std::allocator<at::Tensor> >&&)", "Functions.cpp"),
    ]


class _Stacks:
    """Shared frame dicts and stack lists, exactly one object per distinct frame / stack."""

    def __init__(self) -> None:
        self._frames: dict[tuple[str, int, str], FrameDict] = {}
        self._stacks: dict[tuple[tuple[str, int, str], ...], list[FrameDict]] = {}
        self.empty: list[FrameDict] = []

    def _f(self, filename: str, line: int, name: str) -> FrameDict:
        key = (filename, line, name)
        d = self._frames.get(key)
        if d is None:
            d = self._frames[key] = {"name": name, "filename": filename, "line": line}
        return d

    def _list(self, frames: list[tuple[str, int, str]]) -> list[FrameDict]:
        key = tuple(frames)
        lst = self._stacks.get(key)
        if lst is None:
            lst = self._stacks[key] = [self._f(*f) for f in key]
        return lst

    def python(self, cpp_top: list[tuple[str, str]], chain: Chain, depth_pad: int) -> list[
            FrameDict]:
        """C++ frames, then the Python chain (innermost first) with interpreter frames
        between Python frames, then the entry point: at most `MAX_FRAMES` in all."""
        out = [(fn, 0, name) for name, fn in cpp_top]
        spare = MAX_FRAMES - len(cpp_top) - len(chain) - len(_ENTRY)
        for i, (filename, line, name) in enumerate(reversed(chain)):
            out.append((filename, line, name))
            n = min(spare, 1 + ((i + depth_pad) % 3 == 0))
            spare -= max(n, 0)
            for name2, fn2 in _INTERP[: max(n, 0)]:
                out.append((fn2, 0, name2))
        out.extend((fn, 0, name) for name, fn in _ENTRY)
        return self._list(out)

    def autograd(self, cpp_top: list[tuple[str, str]]) -> list[FrameDict]:
        """An allocation (or free) on the autograd engine thread: C++ frames only."""
        return self._list([(fn, 0, name) for name, fn in [*cpp_top, *_DISPATCH, *_ENGINE]])

    def site(self, chain: Chain, filename: str, line: int, name: str) -> Chain:
        """``chain`` called from one more Python line (one call site of an op)."""
        return [*chain, (filename, line, name)]

    @property
    def n_frames(self) -> int:
        return len(self._frames)


class _Full(Exception):
    """The trace holds the entries asked for: stop the workload where it stands."""


class _Block:
    __slots__ = ("address", "size", "segment", "requested", "state", "frames")

    def __init__(self, address: int, size: int, segment: _Segment) -> None:
        self.address = address
        self.size = size
        self.segment = segment
        self.requested = 0
        self.state = "inactive"
        self.frames: list[FrameDict] = []


class _Segment:
    __slots__ = ("address", "size", "small", "blocks", "tail", "frames", "busy")

    def __init__(self, address: int, size: int, small: bool, frames: list[FrameDict]) -> None:
        self.address = address
        self.size = size
        self.small = small
        self.blocks: list[_Block] = []
        self.tail = address  # carving point: blocks tile [address, tail)
        self.frames = frames
        self.busy = 0  # blocks not on a free list


class _ScaleAllocator:
    """Carve-once caching allocator: consistent by construction, O(1) per event."""

    def __init__(self, limit: int, list_per_entry: bool = False) -> None:
        self.limit = limit
        self.list_per_entry = list_per_entry
        self.trace: list[dict[str, Any]] = []
        self.recording = False
        self.now_us = TIME_ORIGIN_US
        self.segments: list[_Segment] = []
        self._free: dict[tuple[bool, int], list[_Block]] = {}
        self._open: dict[bool, _Segment | None] = {True: None, False: None}
        self._next_addr = ADDRESS_ORIGIN
        self._n = 0

    def _record(self, action: str, addr: int, size: int, frames: list[FrameDict]) -> None:
        self._n += 1
        self.now_us += 2 + (self._n * 7919) % 37
        if not self.recording:
            return
        if len(self.trace) >= self.limit:
            raise _Full
        self.trace.append({"action": action, "addr": addr, "size": size, "stream": 0,
                           "time_us": self.now_us,
                           "frames": list(frames) if self.list_per_entry else frames})

    def malloc(self, size: int, frames: list[FrameDict]) -> _Block:
        rounded = round_size(size)
        small = is_small(rounded)
        free = self._free.get((small, rounded))
        if free:
            block = free[-1]
        else:
            seg = self._open[small]
            if seg is None or seg.address + seg.size - seg.tail < rounded:
                seg_size = allocation_size(rounded)
                self._record("segment_alloc", self._next_addr, seg_size, frames)
                seg = _Segment(self._next_addr, seg_size, small, frames)
                self._next_addr += seg_size + (2 * MiB)  # leave a gap, like cudaMalloc
                self.segments.append(seg)
                self._open[small] = seg
            block = _Block(seg.tail, rounded, seg)
            self._record("alloc", block.address, size, frames)
            seg.tail += rounded
            seg.blocks.append(block)
            seg.busy += 1
            self._take(block, size, frames)
            return block
        self._record("alloc", block.address, size, frames)
        free.pop()
        block.segment.busy += 1
        self._take(block, size, frames)
        return block

    @staticmethod
    def _take(block: _Block, size: int, frames: list[FrameDict]) -> None:
        block.requested = size
        block.state = "active_allocated"
        block.frames = frames

    def free(self, block: _Block, frames: list[FrameDict], deferred: bool = False) -> None:
        """Free a block; ``deferred`` (record_stream) leaves it pending until `complete`."""
        self._record("free_requested", block.address, block.requested, frames)
        block.state = "active_pending_free"
        if not deferred:
            self.complete(block, frames)

    def complete(self, block: _Block, frames: list[FrameDict]) -> None:
        self._record("free_completed", block.address, block.requested, frames)
        block.state = "inactive"
        block.frames = []
        block.segment.busy -= 1
        self._free.setdefault((block.segment.small, block.size), []).append(block)

    def empty_cache(self, frames: list[FrameDict]) -> None:
        """Release every segment with no live block (its blocks leave the free lists)."""
        idle = [s for s in self.segments if s.busy == 0 and s.blocks]
        for seg in idle:
            self._record("segment_free", seg.address, seg.size, frames)
            self.segments.remove(seg)
            if self._open[seg.small] is seg:
                self._open[seg.small] = None
            for b in seg.blocks:
                self._free[(seg.small, b.size)].remove(b)

    def snapshot(self) -> dict[str, Any]:
        segments = []
        for seg in sorted(self.segments, key=lambda s: s.address):
            blocks = [{"address": b.address, "size": b.size, "requested_size": b.requested
                       if b.state != "inactive" else 0, "state": b.state, "frames": b.frames}
                      for b in seg.blocks]
            end = seg.address + seg.size
            if seg.tail < end:
                blocks.append({"address": seg.tail, "size": end - seg.tail, "requested_size": 0,
                               "state": "inactive", "frames": []})
            live = [b for b in seg.blocks if b.state != "inactive"]
            segments.append({
                "device": 0, "address": seg.address, "total_size": seg.size,
                "allocated_size": sum(b.size for b in live if b.state == "active_allocated"),
                "active_size": sum(b.size for b in live),
                "requested_size": sum(b.requested for b in live), "stream": 0,
                "segment_type": "small" if seg.small else "large", "segment_pool_id": (0, 0),
                "is_expandable": False, "frames": seg.frames, "blocks": blocks,
            })
        return {
            "segments": segments,
            "device_traces": [self.trace],
            "allocator_settings": {
                "PYTORCH_CUDA_ALLOC_CONF": "", "max_split_size": -1,
                "garbage_collection_threshold": 0.0, "expandable_segments": False,
                "pinned_num_register_threads": 1, "release_lock_on_cudamalloc": False,
                "pinned_use_cuda_host_register": False,
                "roundup_power2_divisions": {str(1 << i): 0 for i in range(16)},
            },
            "external_annotations": [],
        }


# (op, Python chain tail inside the layer, bytes per token per hidden unit numerator, saved)
_LAYER_OPS: list[tuple[str, Chain, int, bool]] = [
    ("layer_norm", TE_LN_LINEAR, 1, True),
    ("mm", TE_LN_LINEAR, 3, True),  # fused qkv
    ("scaled_dot_product_attention", TE_ATTN, 1, True),
    ("softmax", TE_ATTN, 1, False),
    ("mm", TE_LINEAR, 1, True),  # attention projection
    ("add", [], 1, False),  # residual
    ("layer_norm", [], 1, True),
    ("mm", TE_LINEAR, 8, True),  # fc1 (swiglu: 2 x 4h)
    ("silu", SWIGLU, 4, True),
    ("mm", TE_LINEAR, 1, False),  # fc2
    ("dropout", [], 1, False),
]
_RELEASE = [
    ("std::_Sp_counted_base<(__gnu_cxx::_Lock_policy)2>::_M_release()", "??"),
    ("torch::autograd::SavedVariable::reset_data()", "saved_variable.cpp"),
    ("torch::autograd::SavedVariable::~SavedVariable()", "saved_variable.h"),
    ("std::vector<torch::autograd::SavedVariable>::~vector()", "??"),
]
_BACKWARD_OPS = ["mm", "mm", "silu", "mm", "softmax", "scaled_dot_product_attention",
                 "layer_norm", "add"]
_SMALL_OPS = ["sum", "mean", "bias_grad", "amax", "clamp"]


def _layer_forward(alloc: _ScaleAllocator, act: int, hidden: int, fwd_stacks: list,
                   small_fwd: list, fwd_free: list[FrameDict], rng: random.Random
                   ) -> list[_Block]:
    """One layer's forward ops (a small temporary beside half of them): what it keeps for
    backward."""
    keep: list[_Block] = []
    for i, ((_op, _tail, mult, is_saved), stack) in enumerate(
            zip(_LAYER_OPS, fwd_stacks, strict=True)):
        b = alloc.malloc(act * mult, stack)
        if rng.random() < 0.5:
            s = alloc.malloc(rng.choice((512, 2048, 4 * hidden, 8192)),
                             small_fwd[i][rng.randrange(len(_SMALL_OPS))])
            alloc.free(s, fwd_free)
        if is_saved:
            keep.append(b)
        else:
            alloc.free(b, fwd_free)
    return keep


def _layer_backward(alloc: _ScaleAllocator, act: int, hidden: int, keep: list[_Block],
                    loss: _Block | None, bwd_stacks: list, small_bwd: list,
                    bwd_free: list, rng: random.Random) -> None:
    """One layer's backward: its gradients made, the loss (first layer back) and what the
    forward kept freed, then the gradients."""
    grads = []
    for j, stack in enumerate(bwd_stacks):
        g = alloc.malloc(act * (1 + j % 4), stack)
        grads.append(g)
        if j % 2:
            s = alloc.malloc(rng.choice((512, 1024, 2 * hidden)),
                             small_bwd[j][rng.randrange(len(_SMALL_OPS))])
            alloc.free(s, bwd_free[j])
    if loss is not None:
        alloc.free(loss, bwd_free[-1])
    for k, b in enumerate(reversed(keep)):
        alloc.free(b, bwd_free[k % len(bwd_free)])
    for j, g in enumerate(grads):
        alloc.free(g, bwd_free[j])


def _workload(alloc: _ScaleAllocator, st: _Stacks, rng: random.Random) -> None:
    """Run training steps until the allocator's trace is full (raises _Full)."""
    layers = rng.choice([24, 28, 32])
    hidden = rng.choice([1024, 1536, 2048])
    vocab = 50304
    cpp_op = {op: [*_CPP_ALLOC, *_op_frames(op)] for op in
              {o[0] for o in _LAYER_OPS} | set(_SMALL_OPS) | {"cross_entropy", "empty",
                                                              "zeros", "add_", "mul"}}
    free_py = [*_CPP_FREE, *_INTERP[:2]]

    def py(op: str, chain: Chain, pad: int = 0) -> list[FrameDict]:
        return st.python(cpp_op[op], chain, pad)

    # model state, before recording began (init stacks only in the final segments)
    params_stack = py("empty", ddp_buffer_chain() + [
        (f"{TORCH}/nn/parameter.py", 44, "__new__")])
    grads_stack = py("zeros", ddp_buffer_chain())
    optim_stack = py("zeros", OPTIMIZER_BUILD)
    per_layer = 12 * hidden * hidden * 2
    for _ in range(layers):
        alloc.malloc(per_layer, params_stack)
        alloc.malloc(per_layer, grads_stack)
        alloc.malloc(per_layer * 2, optim_stack)
        alloc.malloc(per_layer * 2, optim_stack)
    alloc.recording = True

    fwd_chains = [
        [*SLIME_TRAIN, *FORWARD_STEP, *layer_chain(0), *(ATTN if i < 5 else MLP), *tail]
        for i, (_op, tail, _, _) in enumerate(_LAYER_OPS)
    ]
    fwd_stacks = [
        py(op, st.site(chain, f"{TORCH}/nn/functional.py", 2900 + 37 * i, op), pad=i)
        for i, ((op, _, _, _), chain) in enumerate(zip(_LAYER_OPS, fwd_chains, strict=True))
    ]
    small_fwd = [  # small temporaries next to each forward op
        [py(op, st.site(chain, f"{TORCH}/_tensor.py", 40 + 11 * j, op), pad=j)
         for j, op in enumerate(_SMALL_OPS)]
        for chain in fwd_chains
    ]
    bwd_stacks = [st.autograd([*_CPP_ALLOC, *_backward_frames(op)]) for op in _BACKWARD_OPS]
    small_bwd = [[st.autograd([*_CPP_ALLOC, *_op_frames(op)[:3], *_backward_frames(b)])
                  for op in _SMALL_OPS] for b in _BACKWARD_OPS]
    bwd_free = [st.autograd([*_CPP_FREE, *_RELEASE, *_backward_frames(op)])
                for op in _BACKWARD_OPS]
    fwd_free = st.python(free_py, [*SLIME_TRAIN, *FORWARD_STEP, *layer_chain(0)], 0)
    logits_stack = py("mm", [*SLIME_TRAIN, *FORWARD_STEP, *OUTPUT_LAYER])
    loss_stack = py("cross_entropy", [*SLIME_TRAIN, *LOSS])
    backward_call = st.python(free_py, [*SLIME_TRAIN, *BACKWARD_STEP], 1)
    allreduce_stack = py("empty", [*SLIME_TRAIN, (
        "/usr/local/lib/python3.10/dist-packages/megatron/core/distributed/"
        "param_and_grad_buffer.py", 420, "start_grad_sync")])
    opt_stack = py("mul", [*SLIME_TRAIN, (
        "/usr/local/lib/python3.10/dist-packages/megatron/core/optimizer/optimizer.py", 485,
        "step"), (
        "/usr/local/lib/python3.10/dist-packages/transformer_engine/pytorch/optimizers/"
        "fused_adam.py", 610, "step")])
    cache_stack = py("empty", [*SLIME_TRAIN, (f"{TORCH}/cuda/memory.py", 224, "empty_cache")])

    seq_choices = [1024, 2048, 3072, 4096]
    tokens = 2048
    pending: list[_Block] = []
    step = 0
    while True:
        step += 1
        if step % 37 == 1:  # a new sequence-length bucket: new sizes, segments grow
            tokens = rng.choice(seq_choices)
        if step % 150 == 0:
            alloc.empty_cache(cache_stack)
        act = tokens * hidden * 2
        saved = [_layer_forward(alloc, act, hidden, fwd_stacks, small_fwd, fwd_free, rng)
                 for _ in range(layers)]
        logits = alloc.malloc(tokens * vocab * 2, logits_stack)
        loss: _Block | None = alloc.malloc(tokens * vocab * 4, loss_stack)
        alloc.free(logits, backward_call)
        for keep in reversed(saved):
            _layer_backward(alloc, act, hidden, keep, loss, bwd_stacks, small_bwd, bwd_free,
                            rng)
            loss = None
        for b in pending:
            alloc.complete(b, bwd_free[0])
        pending = [alloc.malloc(per_layer * 2, allreduce_stack) for _ in range(2)]
        for b in pending:
            alloc.free(b, allreduce_stack, deferred=True)
        for _ in range(layers // 4):
            tmp = alloc.malloc(per_layer * 2, opt_stack)
            alloc.free(tmp, opt_stack)


def scale_snapshot(entries: int, seed: int = 0, list_per_entry: bool = False
                   ) -> dict[str, Any]:
    """The snapshot dict of a training job whose trace holds exactly ``entries`` entries
    (with ``list_per_entry``, each entry's frame list a new list, as PyTorch writes)."""
    rng = random.Random(seed)
    alloc = _ScaleAllocator(entries, list_per_entry)
    st = _Stacks()
    try:
        _workload(alloc, st, rng)
    except _Full:
        pass
    return alloc.snapshot()


def write_scale_snapshot(entries: int, out: Path, seed: int = 0,
                         list_per_entry: bool = False) -> Path:
    """Write a snapshot pickle with ``entries`` trace entries to ``out`` (atomically)."""
    out = Path(out)
    data = scale_snapshot(entries, seed, list_per_entry)
    with atomic_path(out) as tmp, tmp.open("wb") as fh:
        pickle.dump(data, fh, protocol=pickle.DEFAULT_PROTOCOL)
    return out


__all__ = ["scale_snapshot", "write_scale_snapshot"]
