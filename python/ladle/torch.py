"""ladle for PyTorch: fla's names and arguments, and any DSL variant, as torch custom ops.

    import ladle.torch as lt
    o, final_state = lt.chunk_gla(q, k, v, g, output_final_state=True)      # as fla.ops.gla.chunk_gla
    o, _ = lt.run_variant(my_variant, q, k, v, {"x": x, "tau": tau})         # a DSL variant, with autograd

Every op is one torch custom op (torch.library.custom_op: ladle::recurrent and its backward
ladle::recurrent_backward) with a fake implementation and a registered autograd formula, so it
traces under torch.compile(fullgraph=True) and runs inside CUDA graph capture. CUDA tensors run on
the GPU on the current stream, read and written in place (DLPack, no copies); CPU tensors run on
the CPU path. Gradients are formed in fp32 by ladle's backward and returned in each input's dtype.
Misuse raises ValueError naming the argument, as the C++ ops do.
"""

from __future__ import annotations

from typing import Mapping, Optional

import torch
import torch.utils.dlpack as _dlpack

from . import _ladle, dsl, output_shapes
from ._variant import AttentionVariant, Variant, named_variant

__all__ = [
    "run_variant",
    "register_variant",
    "chunk_gla",
    "fused_recurrent_gla",
    "chunk_simple_gla",
    "chunk_delta_rule",
    "chunk_gated_delta_rule",
    "chunk_rwkv6",
    "chunk_kda",
    "fused_recurrent_simple_gla",
    "fused_recurrent_delta_rule",
    "fused_recurrent_gated_delta_rule",
    "fused_recurrent_rwkv6",
    "fused_recurrent_kda",
    "attention",
    "run_attention",
]

def register_variant(variant: Variant) -> str:
    """The string the custom ops name a variant by (its hash); every Variant is known by it already."""
    if not isinstance(variant, Variant):
        raise TypeError(f"variant: expected a ladle.Variant (ladle.dsl.lower or ladle.named_variant), got {type(variant).__name__}")
    return variant.hash


def _variant(key: str):
    return Variant.by_hash(key).native


_to_dlpack = _dlpack.to_dlpack
_current_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)  # absent from CPU-only builds


def _where(q: torch.Tensor):
    """backend, stream handle, whether a stream was given: the current stream of q's device."""
    if q.is_cuda:
        return "gpu", _current_stream(q.get_device()), True
    return "cpu", 0, False


def _names(joined: str) -> list[str]:
    """The op schemas carry lists of names as one comma-separated string (no list[str] in a schema)."""
    return joined.split(",") if joined else []


def _cap(t: torch.Tensor):
    return _dlpack.to_dlpack(t)


def _opt(t: Optional[torch.Tensor]):
    return None if t is None else _dlpack.to_dlpack(t)


def _forward(native, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, tensor_inputs: Mapping, scalar_inputs: Mapping,
             initial_state: Optional[torch.Tensor], cu_seqlens: Optional[torch.Tensor], reverse: bool, algorithm: str,
             output_final_state: bool, final_placeholder: bool = False, group=None):
    """The forward call itself, in the fewest Python steps (a cached call's host cost: bench/torch_overhead.py):
    o, and the final state (None where not asked for, or an empty placeholder where a custom op's schema
    needs a tensor)."""
    qs, vs = q.shape, v.shape
    if cu_seqlens is None and len(qs) == 4 and len(vs) == 4:
        heads = qs[2] if qs[2] >= vs[2] else vs[2]
        o_shape, state_shape = (qs[0], qs[1], heads, vs[3]), (qs[0], heads, qs[3], vs[3])
    else:
        o_shape, state_shape = output_shapes(q, v, cu_seqlens)
    o = q.new_empty(o_shape)
    final = q.new_empty(state_shape, dtype=torch.float32) if output_final_state else None
    backend, stream, has_stream = _where(q)
    _ladle.run(native, _to_dlpack(q), _to_dlpack(k), _to_dlpack(v), {n: _to_dlpack(t) for n, t in tensor_inputs.items()},
               scalar_inputs, _to_dlpack(o), None if final is None else _to_dlpack(final),
               None if initial_state is None else _to_dlpack(initial_state), None if cu_seqlens is None else _to_dlpack(cu_seqlens),
               reverse, backend, algorithm, stream, has_stream, False, group)
    if final is None and final_placeholder:
        final = q.new_empty((0,), dtype=torch.float32)
    return o, final


def _run(variant: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, tensors: list[torch.Tensor], names: str,
         scalars: list[float], scalar_names: str, initial_state: Optional[torch.Tensor], cu_seqlens: Optional[torch.Tensor],
         reverse: bool, output_final_state: bool, algorithm: str) -> tuple[torch.Tensor, torch.Tensor]:
    """The body of the custom op ladle::recurrent and of the eager autograd function (run_variant calls
    _forward directly where no gradient is needed)."""
    return _forward(_variant(variant), q, k, v, dict(zip(_names(names), tensors)), dict(zip(_names(scalar_names), scalars)),
                    initial_state, cu_seqlens, reverse, algorithm, output_final_state, final_placeholder=True)


@torch.library.custom_op("ladle::recurrent", mutates_args=())
def _recurrent(variant: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, tensors: list[torch.Tensor],
               names: str, scalars: list[float], scalar_names: str, initial_state: Optional[torch.Tensor],
               cu_seqlens: Optional[torch.Tensor], reverse: bool, output_final_state: bool,
               algorithm: str, update_backward: str) -> tuple[torch.Tensor, torch.Tensor]:
    return _run(variant, q, k, v, tensors, names, scalars, scalar_names, initial_state, cu_seqlens, reverse,
                output_final_state, algorithm)


@_recurrent.register_fake
def _(variant, q, k, v, tensors, names, scalars, scalar_names, initial_state, cu_seqlens, reverse, output_final_state, algorithm,
      update_backward):
    o_shape, state_shape = output_shapes(q, v, cu_seqlens)
    return (q.new_empty(o_shape), q.new_empty(state_shape if output_final_state else (0,), dtype=torch.float32))


def _run_backward(variant: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, tensors: list[torch.Tensor], names: str,
                  scalars: list[float], scalar_names: str, initial_state: Optional[torch.Tensor],
                  cu_seqlens: Optional[torch.Tensor], reverse: bool, d_o: torch.Tensor,
                  d_final_state: Optional[torch.Tensor], update_backward: str = "auto", group=None) -> list[torch.Tensor]:
    """The backward itself (fp32 gradients): the body of ladle::recurrent_backward, and what an eager
    backward runs directly."""
    f32 = dict(dtype=torch.float32, device=q.device)
    dq, dk, dv = torch.empty(q.shape, **f32), torch.empty(k.shape, **f32), torch.empty(v.shape, **f32)
    d_tensors = [torch.empty(t.shape, **f32) for t in tensors]
    d_h0 = torch.empty(initial_state.shape if initial_state is not None else (0,), **f32)
    backend, stream, has_stream = _where(q)
    _ladle.backward(_variant(variant), _cap(q), _cap(k), _cap(v), {n: _cap(t) for n, t in zip(_names(names), tensors)},
                    dict(zip(_names(scalar_names), scalars)), _opt(initial_state), _opt(cu_seqlens), reverse, backend, stream,
                    has_stream, False, _cap(d_o.contiguous()), _opt(d_final_state), _cap(dq), _cap(dk), _cap(dv),
                    {n: _cap(t) for n, t in zip(_names(names), d_tensors)}, _cap(d_h0) if initial_state is not None else None,
                    update_backward, group)
    return [dq, dk, dv, *d_tensors, d_h0]


@torch.library.custom_op("ladle::recurrent_backward", mutates_args=())
def _recurrent_backward(variant: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, tensors: list[torch.Tensor],
                        names: str, scalars: list[float], scalar_names: str,
                        initial_state: Optional[torch.Tensor], cu_seqlens: Optional[torch.Tensor], reverse: bool,
                        d_o: torch.Tensor, d_final_state: Optional[torch.Tensor], update_backward: str) -> list[torch.Tensor]:
    return _run_backward(variant, q, k, v, tensors, names, scalars, scalar_names, initial_state, cu_seqlens, reverse, d_o,
                         d_final_state, update_backward)


@_recurrent_backward.register_fake
def _(variant, q, k, v, tensors, names, scalars, scalar_names, initial_state, cu_seqlens, reverse, d_o, d_final_state,
      update_backward):
    f32 = dict(dtype=torch.float32)
    return [q.new_empty(q.shape, **f32), k.new_empty(k.shape, **f32), v.new_empty(v.shape, **f32),
            *[t.new_empty(t.shape, **f32) for t in tensors],
            q.new_empty(initial_state.shape if initial_state is not None else (0,), **f32)]


def _setup_context(ctx, inputs, output):
    (variant, q, k, v, tensors, names, scalars, scalar_names, initial_state, cu_seqlens, reverse, _, _, update_backward) = inputs
    ctx.save_for_backward(q, k, v, initial_state, cu_seqlens, *tensors)
    ctx.args = (variant, names, scalars, scalar_names, reverse, update_backward)


def _gradients(backward, ctx, d_o, d_final):
    """dq, dk, dv, the tensor inputs' (a list) and d initial_state, each in its input's dtype."""
    q, k, v, initial_state, cu_seqlens, *tensors = ctx.saved_tensors
    variant, names, scalars, scalar_names, reverse, update_backward = ctx.args
    if d_o is None:
        d_o = torch.zeros(output_shapes(q, v, cu_seqlens)[0], dtype=q.dtype, device=q.device)
    if d_final is not None and d_final.numel() == 0:
        d_final = None
    dq, dk, dv, *rest = backward(variant, q, k, v, tensors, names, scalars, scalar_names, initial_state, cu_seqlens, reverse,
                                 d_o, d_final, update_backward)
    d_tensors, d_h0 = rest[:-1], rest[-1]
    return (dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), [g.to(t.dtype) for g, t in zip(d_tensors, tensors)],
            None if initial_state is None else d_h0.to(initial_state.dtype))


def _backward(ctx, d_o, d_final):
    dq, dk, dv, d_tensors, d_h0 = _gradients(_recurrent_backward, ctx, d_o, d_final)
    return (None, dq, dk, dv, d_tensors, None, None, None, d_h0, None, None, None, None, None)


_recurrent.register_autograd(_backward, setup_context=_setup_context)


class _Recurrent(torch.autograd.Function):
    """The eager form of ladle::recurrent with its autograd: the same forward and backward, without the
    custom op's layers (about 100 us a call of pytree and schema work: bench/torch_overhead.py).
    torch.compile sees the custom op instead."""

    @staticmethod
    def forward(ctx, variant, names, scalars, scalar_names, reverse, output_final_state, algorithm, update_backward, cu_seqlens,
                initial_state, q, k, v, *tensors):
        o, final = _run(variant, q, k, v, list(tensors), names, scalars, scalar_names, initial_state, cu_seqlens, reverse,
                        output_final_state, algorithm)
        ctx.save_for_backward(q, k, v, initial_state, cu_seqlens, *tensors)
        ctx.args = (variant, names, scalars, scalar_names, reverse, update_backward)
        return o, final

    @staticmethod
    def backward(ctx, d_o, d_final):
        dq, dk, dv, d_tensors, d_h0 = _gradients(_run_backward, ctx, d_o, d_final)
        return (None, None, None, None, None, None, None, None, None, d_h0, dq, dk, dv, *d_tensors)


class _ContextParallel(torch.autograd.Function):
    """_Recurrent over a group of ranks (ladle.ThreadGroup, ladle.NcclCommunicator): this rank's slice of
    one call, forward and backward (ops/context_parallel.h), eagerly (a group is no tensor a custom op
    could take)."""

    @staticmethod
    def forward(ctx, group, variant, names, scalars, scalar_names, reverse, output_final_state, algorithm, update_backward, cu_seqlens,
                initial_state, q, k, v, *tensors):
        o, final = _forward(_variant(variant), q, k, v, dict(zip(_names(names), tensors)), dict(zip(_names(scalar_names), scalars)),
                            initial_state, cu_seqlens, reverse, algorithm, output_final_state, final_placeholder=True, group=group)
        ctx.save_for_backward(q, k, v, initial_state, cu_seqlens, *tensors)
        ctx.args = (variant, names, scalars, scalar_names, reverse, update_backward)
        ctx.group = group
        return o, final

    @staticmethod
    def backward(ctx, d_o, d_final):
        def over_group(*args):
            return _run_backward(*args, group=ctx.group)

        dq, dk, dv, d_tensors, d_h0 = _gradients(over_group, ctx, d_o, d_final)
        return (None, None, None, None, None, None, None, None, None, None, d_h0, dq, dk, dv, *d_tensors)


def _check_tensor(x, name: str) -> torch.Tensor:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(x).__name__}")
    return x


def run_variant(variant: Variant, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, inputs: Optional[Mapping] = None, *,
                scale: Optional[float] = None, initial_state: Optional[torch.Tensor] = None, output_final_state: bool = False,
                cu_seqlens: Optional[torch.Tensor] = None, reverse: bool = False, algorithm: str = "auto",
                update_backward: str = "auto", group=None):
    """Runs a variant (ladle.dsl.lower, ladle.named_variant) with autograd: returns (o, final_state or None).

    update_backward: the backward's form for the update forms (the delta rule, gated delta rule, KDA,
    RWKV6 and DSL variants of those forms) on the GPU: "auto" (the chunked WY form for 16-bit inputs
    past one chunk, else the fp32 recurrence), "recurrent" (the fp32 recurrence: about twice as
    precise, slower) or "chunked" (the chunked form wherever it runs). Other variants and the CPU
    ignore it.

    inputs: the variant's other inputs by name (tensors, or floats for its scalars). A scalar named
    "scale" defaults to 1/sqrt(K). Shapes follow fla: q [B,T,H,K], k [B,T,H_kv,K], v [B,T,H_kv,V] or
    grouped value heads v [B,T,HV,V]; with cu_seqlens [N+1] the batch is 1.

    group: context parallelism (ladle.ThreadGroup(P).rank(r), ladle.NcclCommunicator): q, k, v and the
    per-token inputs are this rank's slice of one call's tokens; initial_state, cu_seqlens and the final
    state are the whole call's. The gradients are those of the sum of every rank's loss: each rank's
    per-token gradients for its slice, per-head inputs' and initial_state's summed over the ranks, and the
    final state's gradient must be the same on every rank. Eager only (not under torch.compile)."""
    if not isinstance(variant, Variant):
        raise TypeError(f"variant: expected a ladle.Variant (ladle.dsl.lower or ladle.named_variant), got {type(variant).__name__}")
    if update_backward not in ("auto", "recurrent", "chunked"):
        raise ValueError(f"update_backward is {update_backward!r}, expected 'auto', 'recurrent' or 'chunked'")
    key = variant.hash
    for name, x in (("q", q), ("k", k), ("v", v)):
        _check_tensor(x, name)
    tensor_inputs, scalar_inputs = {}, {}
    declared = variant.kinds
    for name, value in (inputs or {}).items():
        if name not in declared:
            raise ValueError(f"inputs['{name}']: the variant has no input of that name (its inputs: {', '.join(declared)})")
        if declared[name] == "scalar":
            if isinstance(value, torch.Tensor):
                raise ValueError(f"inputs['{name}']: a scalar input takes a float, got a tensor")
            scalar_inputs[name] = float(value)
        else:
            tensor_inputs[name] = _check_tensor(value, f"inputs['{name}']")
    if declared.get("scale") == "scalar" and "scale" not in scalar_inputs:
        scalar_inputs["scale"] = float(scale) if scale is not None else float(q.shape[-1]) ** -0.5
    elif scale is not None and declared.get("scale") != "scalar":
        raise ValueError("scale: the variant reads no scalar named 'scale'")
    compiling = torch.compiler.is_compiling()
    if group is not None and compiling:
        raise ValueError("group: context parallelism runs eagerly; call run_variant outside torch.compile")
    needs_grad = torch.is_grad_enabled() and (
        q.requires_grad or k.requires_grad or v.requires_grad or any(t.requires_grad for t in tensor_inputs.values())
        or (initial_state is not None and initial_state.requires_grad))
    if not compiling and not needs_grad:
        # No gradient and no compiler: the forward at once, the fewest Python steps (bench/torch_overhead.py).
        return _forward(variant.native, q, k, v, tensor_inputs, scalar_inputs, initial_state, cu_seqlens, reverse, algorithm,
                        output_final_state, group=group)
    names = list(tensor_inputs)
    tensors, joined, scalars, scalar_names = [tensor_inputs[n] for n in names], ",".join(names), list(scalar_inputs.values()), \
        ",".join(scalar_inputs)
    if group is not None:
        o, final = _ContextParallel.apply(group, key, joined, scalars, scalar_names, reverse, output_final_state, algorithm,
                                          update_backward, cu_seqlens, initial_state, q, k, v, *tensors)
    elif compiling:
        # The custom op, which the compiler traces (its fake kernel) and differentiates (its autograd).
        o, final = _recurrent(key, q, k, v, tensors, joined, scalars, scalar_names, initial_state, cu_seqlens, reverse,
                              output_final_state, algorithm, update_backward)
    else:
        o, final = _Recurrent.apply(key, joined, scalars, scalar_names, reverse, output_final_state, algorithm, update_backward,
                                    cu_seqlens, initial_state, q, k, v, *tensors)
    return o, (final if output_final_state else None)


# Every variant the fla-named functions run, made at import: under torch.compile the functions only
# read them (a call into the extension while tracing would break the graph).
_GLA = named_variant("gla")
_RECURRENT = {gates: named_variant("recurrent", gates) for gates in ("", "gk", "gv", "gk,gv")}
_DELTA = {l2: named_variant("delta_rule", "l2norm" if l2 else "") for l2 in (False, True)}
_RWKV6 = named_variant("rwkv6")
_KDA = {gates: named_variant("kda", gates) for gates in
        (",".join(g for g, on in (("l2norm", l2), ("gate", gate), ("dt_bias", dt), ("sigmoid", sig)) if on)
         for l2 in (False, True) for gate in (False, True) for dt in (False, True) for sig in (False, True) if gate or not dt)}


def _refuse(op: str, kwargs: Mapping, **unsupported):
    """fla's keyword arguments that ladle does not take: refused by name unless left at their default."""
    for name, (value, default) in unsupported.items():
        if value != default:
            raise ValueError(f"{op}: {name}={value!r} is not supported by ladle (only {default!r})")
    for name in kwargs:
        if name not in ("cu_seqlens_cpu", "chunk_indices"):
            raise ValueError(f"{op}: unexpected keyword argument '{name}'")


def chunk_gla(q, k, v, g, scale=None, initial_state=None, output_final_state=False, state_v_first=False, cu_seqlens=None,
              **kwargs):
    """fla.ops.gla.chunk_gla: g [B,T,H,K] the key-side log decay."""
    _refuse("chunk_gla", kwargs, state_v_first=(state_v_first, False))
    return run_variant(_GLA, q, k, v, {"g": g}, scale=scale, initial_state=initial_state,
                       output_final_state=output_final_state, cu_seqlens=cu_seqlens, algorithm="chunked")


def fused_recurrent_gla(q, k, v, gk=None, gv=None, scale=None, initial_state=None, output_final_state=False, reverse=False,
                        state_v_first=False, cu_seqlens=None, **kwargs):
    """fla.ops.gla.fused_recurrent_gla: gk [B,T,H,K] and gv [B,T,H,V], each optional."""
    _refuse("fused_recurrent_gla", kwargs, state_v_first=(state_v_first, False))
    gates = ",".join(name for name, x in (("gk", gk), ("gv", gv)) if x is not None)
    inputs = {name: x for name, x in (("gk", gk), ("gv", gv)) if x is not None}
    return run_variant(_RECURRENT[gates], q, k, v, inputs, scale=scale, initial_state=initial_state,
                       output_final_state=output_final_state, cu_seqlens=cu_seqlens, reverse=reverse, algorithm="recurrent")


def _simple_gla_variant(g: bool, g_gamma: bool) -> Variant:
    state = dsl.scan(dsl.k, dsl.v)
    if g:
        state = state.decay_head(dsl.token_head("g"))
    if g_gamma:
        state = state.decay_head(dsl.head_param("g_gamma"))
    return dsl.lower(dsl.read(state, dsl.q, dsl.scalar("scale")), "simple_gla")


_SIMPLE_GLA = {(g, gg): _simple_gla_variant(g, gg) for g in (False, True) for gg in (False, True)}


def chunk_simple_gla(q, k, v, g=None, g_gamma=None, scale=None, initial_state=None, output_final_state=False,
                     state_v_first=False, cu_seqlens=None, **kwargs):
    """fla.ops.simple_gla.chunk_simple_gla: g [B,T,H] a per-token head decay, g_gamma [H] a constant one."""
    _refuse("chunk_simple_gla", kwargs, state_v_first=(state_v_first, False))
    inputs = {name: x for name, x in (("g", g), ("g_gamma", g_gamma)) if x is not None}
    return run_variant(_SIMPLE_GLA[(g is not None, g_gamma is not None)], q, k, v, inputs, scale=scale,
                       initial_state=initial_state, output_final_state=output_final_state, cu_seqlens=cu_seqlens,
                       algorithm="chunked")


def chunk_delta_rule(q, k, v, beta, scale=None, initial_state=None, output_final_state=False, use_qk_l2norm_in_kernel=False,
                     cu_seqlens=None, update_backward="auto", **kwargs):
    """fla.ops.delta_rule.chunk_delta_rule: beta [B,T,H]. update_backward: as run_variant's (ladle's own)."""
    _refuse("chunk_delta_rule", kwargs)
    return run_variant(_DELTA[bool(use_qk_l2norm_in_kernel)], q, k, v,
                       {"beta": beta}, scale=scale, initial_state=initial_state, output_final_state=output_final_state,
                       cu_seqlens=cu_seqlens, update_backward=update_backward)


def _gated_delta_variant(beta_sigmoid: bool, l2: bool) -> Variant:
    beta = dsl.token_head("beta")
    state = dsl.scan(dsl.k, dsl.v).decay_head(dsl.token_head("g")).delta(dsl.sigmoid(beta) if beta_sigmoid else beta)
    r = dsl.read(state, dsl.q, dsl.scalar("scale"))
    return dsl.lower(r.l2_normalized() if l2 else r, "gated_delta_rule")


_GATED_DELTA = {(sig, l2): _gated_delta_variant(sig, l2) for sig in (False, True) for l2 in (False, True)}


def chunk_gated_delta_rule(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False,
                           use_qk_l2norm_in_kernel=False, use_beta_sigmoid_in_kernel=False, allow_neg_eigval=False,
                           state_v_first=False, cu_seqlens=None, update_backward="auto", **kwargs):
    """fla.ops.gated_delta_rule.chunk_gated_delta_rule: g [B,T,H] the log decay, beta [B,T,H]. update_backward: as
    run_variant's (ladle's own)."""
    _refuse("chunk_gated_delta_rule", {k_: v_ for k_, v_ in kwargs.items() if k_ != "cp_context" or v_ is not None},
            allow_neg_eigval=(allow_neg_eigval, False), state_v_first=(state_v_first, False))
    return run_variant(_GATED_DELTA[(bool(use_beta_sigmoid_in_kernel), bool(use_qk_l2norm_in_kernel))], q, k, v,
                       {"g": g, "beta": beta}, scale=scale, initial_state=initial_state,
                       output_final_state=output_final_state, cu_seqlens=cu_seqlens, update_backward=update_backward)


def chunk_rwkv6(r, k, v, w, u, scale=None, initial_state=None, output_final_state=False, cu_seqlens=None, **kwargs):
    """fla.ops.rwkv6.chunk_rwkv6: w [B,T,H,K] the log decay, u [H,K] the bonus."""
    _refuse("chunk_rwkv6", kwargs)
    return run_variant(_RWKV6, r, k, v, {"w": w, "u": u}, scale=scale, initial_state=initial_state,
                       output_final_state=output_final_state, cu_seqlens=cu_seqlens)


def chunk_kda(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False, use_qk_l2norm_in_kernel=False,
              use_gate_in_kernel=False, use_beta_sigmoid_in_kernel=False, allow_neg_eigval=False, safe_gate=False,
              lower_bound=None, disable_recompute=False, return_intermediate_states=False, state_v_first=False,
              cu_seqlens=None, A_log=None, dt_bias=None, update_backward="auto", **kwargs):
    """fla.ops.kda.chunk_kda: g [B,T,H,K] (the log decay, or with use_gate_in_kernel the raw gate: the decay is
    -exp(A_log) softplus(g + dt_bias), A_log [H], dt_bias [H*K] or [H,K]), beta [B,T,H]. update_backward: as
    run_variant's (ladle's own)."""
    _refuse("chunk_kda", {k_: v_ for k_, v_ in kwargs.items() if k_ not in ("cp_context", "use_graph", "max_num_seqs")
                          or (k_ == "cp_context" and v_ is not None)},
            allow_neg_eigval=(allow_neg_eigval, False), safe_gate=(safe_gate, False), lower_bound=(lower_bound, None),
            return_intermediate_states=(return_intermediate_states, False), state_v_first=(state_v_first, False))
    return _kda("chunk_kda", "auto", q, k, v, g, beta, scale, initial_state, output_final_state, use_qk_l2norm_in_kernel,
                use_gate_in_kernel, use_beta_sigmoid_in_kernel, cu_seqlens, A_log, dt_bias, update_backward)


def fused_recurrent_kda(q, k, v, g, beta, A_log=None, dt_bias=None, scale=None, initial_state=None, output_final_state=False,
                        use_qk_l2norm_in_kernel=False, use_gate_in_kernel=False, use_beta_sigmoid_in_kernel=False,
                        allow_neg_eigval=False, lower_bound=None, state_v_first=False, cu_seqlens=None, **kwargs):
    """fla.ops.kda.fused_recurrent_kda (decode): chunk_kda's arguments, on the fused-recurrent kernel."""
    _refuse("fused_recurrent_kda", kwargs, allow_neg_eigval=(allow_neg_eigval, False), lower_bound=(lower_bound, None),
            state_v_first=(state_v_first, False))
    return _kda("fused_recurrent_kda", "recurrent", q, k, v, g, beta, scale, initial_state, output_final_state,
                use_qk_l2norm_in_kernel, use_gate_in_kernel, use_beta_sigmoid_in_kernel, cu_seqlens, A_log, dt_bias)


def _kda(op, algorithm, q, k, v, g, beta, scale, initial_state, output_final_state, l2, gate, sigmoid, cu_seqlens, A_log, dt_bias,
         update_backward="auto"):
    gates = []
    inputs = {"g": g, "beta": beta}
    if l2:
        gates.append("l2norm")
    if gate:
        if A_log is None:
            raise ValueError(f"{op}: use_gate_in_kernel computes the decay as -exp(A_log) softplus(g + dt_bias): A_log [H] is required")
        gates.append("gate")
        inputs["A_log"] = A_log
        if dt_bias is not None:
            gates.append("dt_bias")
            heads, key_dim = int(g.shape[-2]), int(g.shape[-1])
            inputs["dt_bias"] = dt_bias.view(heads, key_dim) if dt_bias.dim() == 1 and dt_bias.numel() == heads * key_dim else dt_bias
    elif A_log is not None or dt_bias is not None:
        raise ValueError(f"{op}: {'A_log' if A_log is not None else 'dt_bias'} is given but use_gate_in_kernel is off "
                         "(g is then the log decay itself)")
    if sigmoid:
        gates.append("sigmoid")
    return run_variant(_KDA[",".join(gates)], q, k, v, inputs, scale=scale, initial_state=initial_state,
                       output_final_state=output_final_state, cu_seqlens=cu_seqlens, algorithm=algorithm,
                       update_backward=update_backward)


def fused_recurrent_simple_gla(q, k, v, g=None, g_gamma=None, scale=None, initial_state=None, output_final_state=False,
                               reverse=False, state_v_first=False, cu_seqlens=None, **kwargs):
    """fla.ops.simple_gla.fused_recurrent_simple_gla (decode): chunk_simple_gla's gates, reverse too."""
    _refuse("fused_recurrent_simple_gla", kwargs, state_v_first=(state_v_first, False))
    inputs = {name: x for name, x in (("g", g), ("g_gamma", g_gamma)) if x is not None}
    return run_variant(_SIMPLE_GLA[(g is not None, g_gamma is not None)], q, k, v, inputs, scale=scale,
                       initial_state=initial_state, output_final_state=output_final_state, cu_seqlens=cu_seqlens,
                       reverse=reverse, algorithm="recurrent")


def fused_recurrent_delta_rule(q, k, v, beta=None, scale=None, initial_state=None, output_final_state=False,
                               use_qk_l2norm_in_kernel=False, cu_seqlens=None, **kwargs):
    """fla.ops.delta_rule.fused_recurrent_delta_rule (decode)."""
    _refuse("fused_recurrent_delta_rule", kwargs)
    if beta is None:
        raise ValueError("fused_recurrent_delta_rule: beta [B,T,H] is required (ladle takes no default write strength)")
    return run_variant(_DELTA[bool(use_qk_l2norm_in_kernel)], q, k, v, {"beta": beta}, scale=scale, initial_state=initial_state,
                       output_final_state=output_final_state, cu_seqlens=cu_seqlens, algorithm="recurrent")


def fused_recurrent_gated_delta_rule(q, k, v, g=None, gk=None, gv=None, beta=None, scale=None, initial_state=None,
                                     output_final_state=False, use_qk_l2norm_in_kernel=False, use_gate_in_kernel=False,
                                     A_log=None, dt_bias=None, use_beta_sigmoid_in_kernel=False, allow_neg_eigval=False,
                                     state_v_first=False, cu_seqlens=None, **kwargs):
    """fla.ops.gated_delta_rule.fused_recurrent_gated_delta_rule (decode): g [B,T,H] the log decay, beta [B,T,H].
    A key-side gate gk is KDA's form (fused_recurrent_kda); a value-side gate gv is not a delta-rule form ladle has."""
    _refuse("fused_recurrent_gated_delta_rule", kwargs, allow_neg_eigval=(allow_neg_eigval, False),
            state_v_first=(state_v_first, False), use_gate_in_kernel=(use_gate_in_kernel, False))
    if A_log is not None or dt_bias is not None:
        raise ValueError(f"fused_recurrent_gated_delta_rule: {'A_log' if A_log is not None else 'dt_bias'} is not supported by "
                         "ladle here (the gate formed in the kernel is KDA's: ladle.torch.fused_recurrent_kda)")
    if gk is not None or gv is not None:
        raise ValueError(f"fused_recurrent_gated_delta_rule: {'gk' if gk is not None else 'gv'} is not supported by ladle "
                         "(a key-side gate with the delta rule is KDA: ladle.torch.fused_recurrent_kda)")
    if g is None or beta is None:
        raise ValueError(f"fused_recurrent_gated_delta_rule: {'g' if g is None else 'beta'} [B,T,H] is required")
    return run_variant(_GATED_DELTA[(bool(use_beta_sigmoid_in_kernel), bool(use_qk_l2norm_in_kernel))], q, k, v,
                       {"g": g, "beta": beta}, scale=scale, initial_state=initial_state, output_final_state=output_final_state,
                       cu_seqlens=cu_seqlens, algorithm="recurrent")


def fused_recurrent_rwkv6(r, k, v, w, u, scale=None, initial_state=None, output_final_state=False, reverse=False,
                          cu_seqlens=None, **kwargs):
    """fla.ops.rwkv6.fused_recurrent_rwkv6 (decode)."""
    _refuse("fused_recurrent_rwkv6", kwargs)
    return run_variant(_RWKV6, r, k, v, {"w": w, "u": u}, scale=scale, initial_state=initial_state,
                       output_final_state=output_final_state, cu_seqlens=cu_seqlens, reverse=reverse, algorithm="recurrent")


class _Attention(torch.autograd.Function):
    """Softmax attention with its backward, for the named op and DSL variants alike: call(q, k, v,
    sinks, tensors, for_backward) runs the forward and returns o, lse and ladle's saved value (the GPU
    forward's o and lse, the caller's tensors behind its views), which the backward consumes."""

    @staticmethod
    def forward(ctx, call, names, q, k, v, sinks, *tensors):
        o, lse, saved = call(q, k, v, sinks, tensors, True)
        # ladle's saved value reads these tensors again at the backward; autograd's version counters
        # refuse a backward after an in-place change to any of them (ladle keeps no fingerprint here).
        ctx.save_for_backward(q, k, v, sinks, *tensors)
        ctx.saved, ctx.names = saved, names
        ctx.dtypes = [None if x is None else x.dtype for x in (q, k, v, sinks, *tensors)]
        o = _dlpack.from_dlpack(o)
        lse = _dlpack.from_dlpack(lse) if lse is not None else o.new_empty(0, dtype=torch.float32)
        ctx.mark_non_differentiable(lse)
        return o, lse

    @staticmethod
    def backward(ctx, d_o, d_lse):
        ctx.saved_tensors  # autograd's check: none of them was changed in place since the forward
        _, stream, has_stream = _where(d_o)
        grads = _ladle.attention_backward(ctx.saved, _cap(d_o.contiguous()), stream, has_stream)
        ctx.saved = None  # one backward: the saved forward's memory goes now
        got = {name: _dlpack.from_dlpack(c) for name, c in grads.items()}
        keys = ["q", "k", "v", "sinks", *ctx.names]
        out = [got[n].to(t) if n in got and t is not None else None for n, t in zip(keys, ctx.dtypes)]
        return (None, None, *out)


def _attend(call, names, q, k, v, sinks, tensors, return_lse):
    """The forward at once when no gradient is needed, else through _Attention."""
    if torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (q, k, v, sinks, *tensors)):
        o, lse = _Attention.apply(call, names, q, k, v, sinks, *tensors)
    else:
        o, lse, _ = call(q, k, v, sinks, tensors, False)
        o = _dlpack.from_dlpack(o)
        lse = _dlpack.from_dlpack(lse) if lse is not None else None
    return (o, lse) if return_lse else o


def _sinks(sinks):
    return sinks.view(-1, 1) if sinks is not None and sinks.dim() == 1 else sinks


def _window(window):
    if window is None:
        return None
    if len(window) != 2:
        raise ValueError(f"window: expected (left, right), got {window!r}")
    return int(window[0]), int(window[1])


def _named_attention(q, k, v, bias, sinks, attn_mask, q_segment_ids, kv_segment_ids, cu_seqlens_q, cu_seqlens_k, scale, softcap,
                     causal, has_window, window_left, window_right, dropout_p, seed, return_lse, for_backward):
    backend, stream, has_stream = _where(q)
    return _ladle.attention(_cap(q), _cap(k), _cap(v), scale, _opt(bias), softcap, causal,
                            (window_left, window_right) if has_window else None, _opt(attn_mask), _opt(q_segment_ids),
                            _opt(kv_segment_ids), _opt(sinks), _opt(cu_seqlens_q), _opt(cu_seqlens_k), dropout_p, seed, return_lse,
                            for_backward, backend, stream, has_stream)


@torch.library.custom_op("ladle::attention", mutates_args=())
def _attention_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: Optional[torch.Tensor], sinks: Optional[torch.Tensor],
                  attn_mask: Optional[torch.Tensor], q_segment_ids: Optional[torch.Tensor],
                  kv_segment_ids: Optional[torch.Tensor], cu_seqlens_q: Optional[torch.Tensor],
                  cu_seqlens_k: Optional[torch.Tensor], scale: Optional[float], softcap: Optional[float], causal: bool,
                  has_window: bool, window_left: int, window_right: int, dropout_p: float, seed: int,
                  return_lse: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """What torch.compile sees of attention(): o and lse (empty unless return_lse)."""
    o, lse, _ = _named_attention(q, k, v, bias, sinks, attn_mask, q_segment_ids, kv_segment_ids, cu_seqlens_q, cu_seqlens_k, scale,
                                 softcap, causal, has_window, window_left, window_right, dropout_p, seed, return_lse, False)
    o = _dlpack.from_dlpack(o)
    return o, (_dlpack.from_dlpack(lse) if lse is not None else o.new_empty(0, dtype=torch.float32))


def _attention_fake(q, v, cu_seqlens_q, return_lse):
    """o [..,Tq,H,Dv] and lse ([B,H,Tq]; packed [H,total_q]; empty unless return_lse), as the fake kernels give them."""
    o = q.new_empty(tuple(q.shape[:-1]) + (v.shape[-1],))
    if not return_lse:
        return o, q.new_empty(0, dtype=torch.float32)
    if cu_seqlens_q is not None:
        return o, q.new_empty((q.shape[-2], q.shape[-3]), dtype=torch.float32)
    return o, q.new_empty((q.shape[0], q.shape[2], q.shape[1]), dtype=torch.float32)


@_attention_op.register_fake
def _(q, k, v, bias, sinks, attn_mask, q_segment_ids, kv_segment_ids, cu_seqlens_q, cu_seqlens_k, scale, softcap, causal,
      has_window, window_left, window_right, dropout_p, seed, return_lse):
    return _attention_fake(q, v, cu_seqlens_q, return_lse)


@torch.library.custom_op("ladle::attention_backward", mutates_args=())
def _attention_backward_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: Optional[torch.Tensor],
                           sinks: Optional[torch.Tensor], attn_mask: Optional[torch.Tensor],
                           q_segment_ids: Optional[torch.Tensor], kv_segment_ids: Optional[torch.Tensor],
                           cu_seqlens_q: Optional[torch.Tensor], cu_seqlens_k: Optional[torch.Tensor], scale: Optional[float],
                           softcap: Optional[float], causal: bool, has_window: bool, window_left: int, window_right: int,
                           dropout_p: float, seed: int, d_o: torch.Tensor) -> list[torch.Tensor]:
    """dq, dk, dv, d bias, d sinks (fp32; empty where absent). Functional, as a compiled graph needs:
    the forward runs again for the saved value its backward reads (the eager path keeps it instead)."""
    _, _, saved = _named_attention(q, k, v, bias, sinks, attn_mask, q_segment_ids, kv_segment_ids, cu_seqlens_q, cu_seqlens_k,
                                   scale, softcap, causal, has_window, window_left, window_right, dropout_p, seed, False, True)
    _, stream, has_stream = _where(q)
    got = {n: _dlpack.from_dlpack(c) for n, c in _ladle.attention_backward(saved, _cap(d_o.contiguous()), stream, has_stream).items()}
    absent = lambda: q.new_empty(0, dtype=torch.float32)  # noqa: E731 (a fresh one each: outputs may not alias)
    return [got["q"], got["k"], got["v"], got["bias"] if "bias" in got else absent(), got["sinks"] if "sinks" in got else absent()]


@_attention_backward_op.register_fake
def _(q, k, v, bias, sinks, attn_mask, q_segment_ids, kv_segment_ids, cu_seqlens_q, cu_seqlens_k, scale, softcap, causal,
      has_window, window_left, window_right, dropout_p, seed, d_o):
    f32 = dict(dtype=torch.float32)
    return [q.new_empty(q.shape, **f32), k.new_empty(k.shape, **f32), v.new_empty(v.shape, **f32),
            q.new_empty(bias.shape if bias is not None else (0,), **f32), q.new_empty(sinks.shape if sinks is not None else (0,), **f32)]


def _attention_setup(ctx, inputs, output):
    ctx.save_for_backward(*inputs[:10])
    ctx.args = inputs[10:18]


def _attention_grads(ctx, d_o, d_lse):
    tensors = ctx.saved_tensors
    dq, dk, dv, d_bias, d_sinks = _attention_backward_op(*tensors, *ctx.args, d_o)
    q, k, v, bias, sinks = tensors[:5]
    return (dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), None if bias is None else d_bias.to(bias.dtype),
            None if sinks is None else d_sinks.to(sinks.dtype), *([None] * 14))


_attention_op.register_autograd(_attention_grads, setup_context=_attention_setup)


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, scale: Optional[float] = None, causal: bool = False,
              window: Optional[tuple] = None, softcap: Optional[float] = None, sinks: Optional[torch.Tensor] = None,
              bias: Optional[torch.Tensor] = None, attn_mask: Optional[torch.Tensor] = None,
              q_segment_ids: Optional[torch.Tensor] = None, kv_segment_ids: Optional[torch.Tensor] = None,
              cu_seqlens_q: Optional[torch.Tensor] = None, cu_seqlens_k: Optional[torch.Tensor] = None,
              dropout_p: float = 0.0, seed: int = 0, return_lse: bool = False):
    """Softmax attention in FlashAttention's layout (docs/operations.md): q [B,Tq,H,D], k [B,Tk,H_kv,D],
    v [B,Tk,H_kv,Dv] (GQA: H_kv divides H), o [B,Tq,H,Dv] in q's dtype. causal aligns the diagonal to
    the last key (j <= i + Tk - Tq); window = (left, right) keys around it (-1: unbounded); softcap: s =
    cap tanh(s / cap); sinks [H] or [H,S]: logits in the denominator only; bias (float) and attn_mask
    (nonzero: attend) broadcastable to [B,H,Tq,Tk]; segment ids [B,T]; packed sequences with
    cu_seqlens_q and cu_seqlens_k; dropout_p with a seed. Returns o, or (o, lse) with return_lse.

    With autograd: dq, dk, dv, d bias and d sinks (on the GPU: sm_80 on, q, k, v of f16, bf16 or f32, head
    dims up to 256, f32 up to 144; else the CPU path, host tensors only). Under torch.compile it is the custom op
    ladle::attention, whose backward runs the forward again (the eager path keeps the forward's saved
    value instead)."""
    for name, x in (("q", q), ("k", k), ("v", v)):
        _check_tensor(x, name)
    win = _window(window)
    if torch.compiler.is_compiling():
        o, lse = _attention_op(q, k, v, bias, _sinks(sinks), attn_mask, q_segment_ids, kv_segment_ids, cu_seqlens_q, cu_seqlens_k,
                               scale, softcap, causal, win is not None, win[0] if win else -1, win[1] if win else -1,
                               float(dropout_p), int(seed), return_lse)
        return (o, lse) if return_lse else o

    def call(q_, k_, v_, sinks_, tensors, for_backward):
        backend, stream, has_stream = _where(q_)
        return _ladle.attention(_cap(q_), _cap(k_), _cap(v_), scale, _opt(tensors[0]), softcap, causal, win, _opt(attn_mask),
                                _opt(q_segment_ids), _opt(kv_segment_ids), _opt(sinks_), _opt(cu_seqlens_q), _opt(cu_seqlens_k),
                                float(dropout_p), int(seed), return_lse, for_backward, backend, stream, has_stream)

    return _attend(call, ("bias",), q, k, v, _sinks(sinks), (bias,), return_lse)


def _dsl_attention(variant, q, k, v, tensors, names, scalars, scalar_names, sinks, q_segment_ids, kv_segment_ids, cu_seqlens_q,
                   cu_seqlens_k, window_left, window_right, dropout_p, seed, return_lse, for_backward):
    backend, stream, has_stream = _where(q)
    return _ladle.run_attention(AttentionVariant.by_hash(variant).native, _cap(q), _cap(k), _cap(v),
                                {n: _cap(t) for n, t in zip(_names(names), tensors)}, dict(zip(_names(scalar_names), scalars)),
                                window_left, window_right, _opt(q_segment_ids), _opt(kv_segment_ids), _opt(sinks),
                                _opt(cu_seqlens_q), _opt(cu_seqlens_k), dropout_p, seed, return_lse, for_backward, backend, stream,
                                has_stream)


@torch.library.custom_op("ladle::run_attention", mutates_args=())
def _run_attention_op(variant: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, tensors: list[torch.Tensor], names: str,
                      scalars: list[float], scalar_names: str, sinks: Optional[torch.Tensor],
                      q_segment_ids: Optional[torch.Tensor], kv_segment_ids: Optional[torch.Tensor],
                      cu_seqlens_q: Optional[torch.Tensor], cu_seqlens_k: Optional[torch.Tensor], window_left: int,
                      window_right: int, dropout_p: float, seed: int, return_lse: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """What torch.compile sees of run_attention(): o and lse (empty unless return_lse)."""
    o, lse, _ = _dsl_attention(variant, q, k, v, tensors, names, scalars, scalar_names, sinks, q_segment_ids, kv_segment_ids,
                               cu_seqlens_q, cu_seqlens_k, window_left, window_right, dropout_p, seed, return_lse, False)
    o = _dlpack.from_dlpack(o)
    return o, (_dlpack.from_dlpack(lse) if lse is not None else o.new_empty(0, dtype=torch.float32))


@_run_attention_op.register_fake
def _(variant, q, k, v, tensors, names, scalars, scalar_names, sinks, q_segment_ids, kv_segment_ids, cu_seqlens_q, cu_seqlens_k,
      window_left, window_right, dropout_p, seed, return_lse):
    return _attention_fake(q, v, cu_seqlens_q, return_lse)


@torch.library.custom_op("ladle::run_attention_backward", mutates_args=())
def _run_attention_backward_op(variant: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, tensors: list[torch.Tensor],
                               names: str, scalars: list[float], scalar_names: str, sinks: Optional[torch.Tensor],
                               q_segment_ids: Optional[torch.Tensor], kv_segment_ids: Optional[torch.Tensor],
                               cu_seqlens_q: Optional[torch.Tensor], cu_seqlens_k: Optional[torch.Tensor], window_left: int,
                               window_right: int, dropout_p: float, seed: int, d_o: torch.Tensor) -> list[torch.Tensor]:
    """dq, dk, dv, d sinks, then each tensor input's (fp32; empty where there is none): the forward again
    for its saved value, then ladle's backward."""
    _, _, saved = _dsl_attention(variant, q, k, v, tensors, names, scalars, scalar_names, sinks, q_segment_ids, kv_segment_ids,
                                 cu_seqlens_q, cu_seqlens_k, window_left, window_right, dropout_p, seed, False, True)
    _, stream, has_stream = _where(q)
    got = {n: _dlpack.from_dlpack(c) for n, c in _ladle.attention_backward(saved, _cap(d_o.contiguous()), stream, has_stream).items()}
    absent = lambda: q.new_empty(0, dtype=torch.float32)  # noqa: E731
    return [got["q"], got["k"], got["v"], got["sinks"] if "sinks" in got else absent(),
            *[got[n] if n in got else absent() for n in _names(names)]]


@_run_attention_backward_op.register_fake
def _(variant, q, k, v, tensors, names, scalars, scalar_names, sinks, q_segment_ids, kv_segment_ids, cu_seqlens_q, cu_seqlens_k,
      window_left, window_right, dropout_p, seed, d_o):
    f32 = dict(dtype=torch.float32)
    return [q.new_empty(q.shape, **f32), k.new_empty(k.shape, **f32), v.new_empty(v.shape, **f32),
            q.new_empty(sinks.shape if sinks is not None else (0,), **f32),
            *[q.new_empty(t.shape if t.is_floating_point() else (0,), **f32) for t in tensors]]


def _run_attention_setup(ctx, inputs, output):
    ctx.save_for_backward(*inputs[1:4], inputs[8], *inputs[9:13], *inputs[4])
    ctx.args = (inputs[0], inputs[5], inputs[6], inputs[7], *inputs[13:17], len(inputs[4]))


def _run_attention_grads(ctx, d_o, d_lse):
    q, k, v, sinks, qs, ks, cq, ck, *tensors = ctx.saved_tensors
    variant, names, scalars, scalar_names, left, right, p, seed, _ = ctx.args
    dq, dk, dv, d_sinks, *d_tensors = _run_attention_backward_op(variant, q, k, v, tensors, names, scalars, scalar_names, sinks,
                                                                 qs, ks, cq, ck, left, right, p, seed, d_o)
    grads = [g.to(t.dtype) if t.is_floating_point() else None for g, t in zip(d_tensors, tensors)]
    return (None, dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), grads, None, None, None,
            None if sinks is None else d_sinks.to(sinks.dtype), *([None] * 9))


_run_attention_op.register_autograd(_run_attention_grads, setup_context=_run_attention_setup)


def run_attention(variant, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, inputs: Optional[Mapping] = None, *,
                  scale: Optional[float] = None, window: Optional[tuple] = None, sinks: Optional[torch.Tensor] = None,
                  q_segment_ids: Optional[torch.Tensor] = None, kv_segment_ids: Optional[torch.Tensor] = None,
                  cu_seqlens_q: Optional[torch.Tensor] = None, cu_seqlens_k: Optional[torch.Tensor] = None,
                  dropout_p: float = 0.0, seed: int = 0, return_lse: bool = False):
    """Runs a softmax-attention variant of the DSL (ladle.dsl.lower(ladle.dsl.softmax(...))) with
    autograd: inputs by name (pair tensors [B,H,Tq,Tk] broadcastable, per-head [H], floats for
    scalars; a scalar named "scale" defaults to 1/sqrt(D)); the run-time parts (window sizes, segment
    ids, sinks, packed sequences, dropout) as attention() takes them. Gradients reach q, k, v, every
    floating tensor input and the sinks. Under torch.compile it is the custom op ladle::run_attention,
    as attention() is ladle::attention."""
    if not isinstance(variant, AttentionVariant):
        raise TypeError(f"variant: expected a ladle.AttentionVariant (ladle.dsl.lower of a softmax), got {type(variant).__name__}")
    for name, x in (("q", q), ("k", k), ("v", v)):
        _check_tensor(x, name)
    tensors, scalars = {}, {}
    for name, value in (inputs or {}).items():
        if name not in variant.kinds or name in ("q", "k", "v"):
            raise ValueError(f"inputs['{name}']: the variant has no input of that name (its inputs: {', '.join(variant.kinds)})")
        if variant.kinds[name] == "scalar":
            scalars[name] = float(value)
        else:
            tensors[name] = _check_tensor(value, f"inputs['{name}']")
    if variant.kinds.get("scale") == "scalar" and "scale" not in scalars:
        scalars["scale"] = float(scale) if scale is not None else float(q.shape[-1]) ** -0.5
    left, right = _window(window) or (-1, -1)
    names = tuple(tensors)
    if torch.compiler.is_compiling():
        o, lse = _run_attention_op(variant.hash, q, k, v, [tensors[n] for n in names], ",".join(names), list(scalars.values()),
                                   ",".join(scalars), _sinks(sinks), q_segment_ids, kv_segment_ids, cu_seqlens_q, cu_seqlens_k,
                                   left, right, float(dropout_p), int(seed), return_lse)
        return (o, lse) if return_lse else o

    def call(q_, k_, v_, sinks_, given, for_backward):
        backend, stream, has_stream = _where(q_)
        return _ladle.run_attention(variant.native, _cap(q_), _cap(k_), _cap(v_), {n: _cap(t) for n, t in zip(names, given)},
                                    scalars, left, right, _opt(q_segment_ids), _opt(kv_segment_ids), _opt(sinks_),
                                    _opt(cu_seqlens_q), _opt(cu_seqlens_k), float(dropout_p), int(seed), return_lse,
                                    for_backward, backend, stream, has_stream)

    return _attend(call, names, q, k, v, _sinks(sinks), tuple(tensors[n] for n in names), return_lse)
