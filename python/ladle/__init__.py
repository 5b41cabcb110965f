"""ladle from Python: attention variants as expressions, run on the GPU or the CPU.

    import ladle
    from ladle import dsl
    x = dsl.token_key("x")
    variant = dsl.lower(dsl.read(dsl.scan(dsl.k, dsl.v).decay_k(dsl.logsigmoid(x) / 16), dsl.q), "my_gate")
    o, _ = ladle.run_variant(variant, q, k, v, {"x": x_values})       # numpy arrays: the CPU path
    print(ladle.generated_kernels(variant)[0]["source"])               # the CUDA it generates

Tensors are anything with __dlpack__ (numpy arrays, torch tensors), read in place. For autograd,
torch.compile and fla's names, use ladle.torch.
"""

from __future__ import annotations

from typing import Mapping, Optional

from . import _ladle
from ._ladle import driver_available, finish_background_compiles, Communicator, NcclCommunicator, ThreadGroup, nccl_unique_id
from ._variant import AttentionVariant, Variant, named_variant
from . import dsl  # noqa: E402 (after Variant: dsl.lower makes one)

__version__ = _ladle.version
__all__ = ["Variant", "AttentionVariant", "dsl", "named_variant", "run_variant", "run_variant_backward", "generated_kernels", "driver_available", "finish_background_compiles",
           "output_shapes", "Communicator", "ThreadGroup", "NcclCommunicator", "nccl_unique_id"]


def _is_torch(x) -> bool:
    return type(x).__module__.startswith("torch")


def capsule(x, name: str):
    """A DLPack capsule of x, read in place; a torch tensor's without a stream handshake (the
    call runs on the caller's current stream)."""
    if _is_torch(x):
        import torch.utils.dlpack

        return torch.utils.dlpack.to_dlpack(x)
    if hasattr(x, "__dlpack__"):
        return x.__dlpack__()
    raise TypeError(f"{name}: expected a tensor with __dlpack__ (a numpy array or a torch tensor), got {type(x).__name__}")


def output_shapes(q, v, cu_seqlens=None, batch: Optional[int] = None):
    """o's shape and the final state's for q, v: o [B,T,max(H,HV),V] (packed: [T,..]), state [N,H,K,V]."""
    if len(q.shape) not in (3, 4):
        raise ValueError(f"q has shape {list(q.shape)}, expected [B,T,H,K] or packed [T,H,K]")
    if len(v.shape) != len(q.shape):
        raise ValueError(f"v has shape {list(v.shape)}, expected the rank of q ({len(q.shape)})")
    heads = max(int(q.shape[-2]), int(v.shape[-2]))
    o = tuple(q.shape[:-2]) + (heads, int(v.shape[-1]))
    n = (int(cu_seqlens.shape[0]) - 1) if cu_seqlens is not None else (int(q.shape[0]) if len(q.shape) == 4 else 1)
    return o, (n, heads, int(q.shape[-1]), int(v.shape[-1]))


def _split_inputs(inputs: Optional[Mapping]):
    tensors, scalars = {}, {}
    for name, value in (inputs or {}).items():
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            scalars[name] = float(value)
        elif value is not None:
            tensors[name] = value
    return tensors, scalars


def _prepare(variant, q_, inputs, scale, **arrays):
    for name, x in arrays.items():
        if not hasattr(x, "shape") or not (hasattr(x, "__dlpack__") or _is_torch(x)):
            raise TypeError(f"{name}: expected a tensor with __dlpack__ (a numpy array or a torch tensor), got {type(x).__name__}")
    if not isinstance(variant, Variant):
        raise TypeError(f"variant: expected a ladle.Variant (ladle.dsl.lower or ladle.named_variant), got {type(variant).__name__}")
    tensors, scalars = _split_inputs(inputs)
    if variant.kinds.get("scale") == "scalar" and "scale" not in scalars:
        scalars["scale"] = float(scale) if scale is not None else float(q_.shape[-1]) ** -0.5
    return tensors, scalars


def _empty(like, shape, f32: bool = False):
    """An uninitialised array where `like` lives: numpy on the host, torch on its device."""
    if _is_torch(like):
        import torch

        return torch.empty(shape, dtype=torch.float32 if f32 else like.dtype, device=like.device)
    import numpy as np

    return np.empty(shape, dtype=np.float32 if f32 else like.dtype)


def run_variant(variant: Variant, q, k, v, inputs: Optional[Mapping] = None, *, scale: Optional[float] = None,
                initial_state=None, output_final_state: bool = False, cu_seqlens=None, reverse: bool = False,
                backend: str = "auto", algorithm: str = "auto", group: Optional[Communicator] = None):
    """Runs a variant on numpy arrays (the CPU path) or any DLPack tensors, without autograd.

    inputs: the variant's other inputs by name (tensors, or floats for its scalars); scale, when the
    variant reads a scalar named "scale", defaults to 1/sqrt(K). Returns (o, final_state or None),
    o in q's dtype, the state f32. For torch tensors with autograd use ladle.torch.run_variant.

    group: context parallelism (docs/operations.md): this rank's slice of the tokens of one call whose
    other slices the group's other ranks pass (ladle.ThreadGroup(P).rank(r) for threads, or
    ladle.NcclCommunicator(P, id, r) with id = ladle.nccl_unique_id() from rank 0, one process per GPU);
    initial_state and cu_seqlens are the whole call's, the final state too. o (and the state) are made
    where q lives (numpy, or torch on q's device)."""
    import numpy as np

    tensors, scalars = _prepare(variant, q, inputs, scale, q=q, k=k, v=v)
    o_shape, state_shape = output_shapes(q, v, cu_seqlens)
    # Without a group the outputs are numpy arrays (the GPU path copies host outputs back); with one
    # they live where q does, as the group's buffers must.
    make = _empty if group is not None else (lambda like, shape, f32=False: np.empty(shape, np.float32 if f32 else like.dtype))
    o = make(q, o_shape)
    final = make(q, state_shape, True) if output_final_state else None
    _ladle.run(variant.native, capsule(q, "q"), capsule(k, "k"), capsule(v, "v"),
               {name: capsule(t, name) for name, t in tensors.items()}, scalars, capsule(o, "o"),
               None if final is None else capsule(final, "final_state"),
               None if initial_state is None else capsule(initial_state, "initial_state"),
               None if cu_seqlens is None else capsule(cu_seqlens, "cu_seqlens"), reverse, backend, algorithm, 0, False, True, group)
    return o, final


def run_variant_backward(variant: Variant, q, k, v, inputs: Optional[Mapping], d_output, *, d_final_state=None,
                         scale: Optional[float] = None, initial_state=None, cu_seqlens=None, reverse: bool = False,
                         backend: str = "auto", update_backward: str = "auto", group: Optional[Communicator] = None):
    """The gradients of sum(o * d_output) [+ sum(final_state * d_final_state)] through run_variant with
    the same arguments, on numpy arrays (or any DLPack tensors), without autograd: a dict of fp32
    arrays, "q", "k", "v", every tensor input by its name, and "initial_state" when one was given.
    group: as run_variant's; the per-token gradients are this slice's, the per-head inputs' and
    initial_state's the whole call's (summed over the ranks). update_backward: the update forms' backward
    on the GPU, "auto", "recurrent" or "chunked" (ladle.torch.run_variant says what each is)."""
    import numpy as np

    tensors, scalars = _prepare(variant, q, inputs, scale, q=q, k=k, v=v)
    make = _empty if group is not None else (lambda like, shape, f32=True: np.empty(shape, np.float32))
    grads = {"q": make(q, tuple(q.shape), True), "k": make(q, tuple(k.shape), True), "v": make(q, tuple(v.shape), True)}
    d_tensors = {name: make(q, tuple(t.shape), True) for name, t in tensors.items()}
    d_h0 = None if initial_state is None else make(q, tuple(initial_state.shape), True)
    _ladle.backward(variant.native, capsule(q, "q"), capsule(k, "k"), capsule(v, "v"),
                    {name: capsule(t, name) for name, t in tensors.items()}, scalars,
                    None if initial_state is None else capsule(initial_state, "initial_state"),
                    None if cu_seqlens is None else capsule(cu_seqlens, "cu_seqlens"), reverse, backend, 0, False, True,
                    capsule(d_output, "d_output"), None if d_final_state is None else capsule(d_final_state, "d_final_state"),
                    capsule(grads["q"], "dq"), capsule(grads["k"], "dk"), capsule(grads["v"], "dv"),
                    {name: capsule(t, "d" + name) for name, t in d_tensors.items()},
                    None if d_h0 is None else capsule(d_h0, "d_initial_state"), update_backward, group)
    grads.update(d_tensors)
    if d_h0 is not None:
        grads["initial_state"] = d_h0
    return grads


def generated_kernels(variant: Variant, *, batch: int = 8, tokens: int = 1024, heads: int = 16, key_dim: int = 128,
                      value_dim: int = 128, dtype: str = "bf16", arch: str = "sm_90a", algorithm: str = "auto",
                      compile: bool = False):
    """The kernels a call of this shape launches on `arch`, as the launcher plans them (no GPU
    needed; what ladle-dump shows): a list of dicts with "name", "source", "role", "tile", "threads"
    and "dynamic_shared_bytes"; with compile=True each is compiled by NVRTC through the disk cache (the
    launcher's cache: a later run finds it there) and also holds "ptx", "registers",
    "spill_store_bytes", "spill_load_bytes", "static_shared_bytes" and "from_cache"."""
    if not isinstance(variant, Variant):
        raise TypeError(f"variant: expected a ladle.Variant, got {type(variant).__name__}")
    return _ladle.generated_kernels(variant.native, batch, tokens, heads, key_dim, value_dim, dtype, arch, algorithm, compile)
