"""Performance models of operators from their recorded shapes: FLOPs and bytes.

One small pure function per op family, each taking the op's recorded arguments (Kineto's
``Input Dims``, ``Input type`` and ``Concrete Inputs``, profiled with ``record_shapes=True``)
and returning an :class:`OpModel`, or None where the arguments do not say enough. Bytes are
the *ideal* traffic: every input tensor read once and every output written once, at their
element sizes (what an op must move at the least; a cache or a fused neighbour can do better,
a tiled kernel that re-reads does worse). The formulas, with worked examples, are in
``docs/metrics.md``, section "Operators against the roofline"; GEMM, SDPA and convolution
agree with TraceLens's published perf models (AMD-AGI/TraceLens, ``PerfModel/perf_model.py``)
except where that section says why not.

>>> m = model("aten::mm", [[64, 128], [128, 256]], ["float", "float"], ["", ""])
>>> (m.category, m.flops, m.bytes, m.dtype)
('gemm', 4194304, 229376, 'fp32')
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

#: Bytes per element of the tensor types Kineto writes in ``Input type``.
DTYPE_BYTES: dict[str, int] = {
    "double": 8, "float": 4, "c10::BFloat16": 2, "c10::Half": 2, "long int": 8, "int": 4,
    "short int": 2, "signed char": 1, "unsigned char": 1, "bool": 1,
    "c10::Float8_e4m3fn": 1, "c10::Float8_e5m2": 1, "c10::Float8_e4m3fnuz": 1,
    "c10::Float8_e5m2fnuz": 1, "c10::complex<float>": 8, "c10::complex<double>": 16,
}

#: The peak table's name (``analyses.flops.PEAK_TABLE``) of each floating type.
PEAK_DTYPES: dict[str, str] = {
    "double": "fp64", "float": "fp32", "c10::BFloat16": "bf16", "c10::Half": "fp16",
    "c10::Float8_e4m3fn": "fp8", "c10::Float8_e5m2": "fp8", "c10::Float8_e4m3fnuz": "fp8",
    "c10::Float8_e5m2fnuz": "fp8",
}

CATEGORIES: tuple[str, ...] = ("gemm", "sdpa", "conv", "elementwise", "reduce")


@dataclass(frozen=True)
class OpModel:
    """An op instance's model: its family, FLOPs, ideal bytes moved and compute dtype (the
    peak table's name, None when not a floating type)."""

    category: str
    flops: int
    bytes: int
    dtype: str | None


@dataclass(frozen=True)
class Tensor:
    """One recorded tensor argument: its shape and element type."""

    dims: tuple[int, ...]
    type: str

    @property
    def numel(self) -> int:
        return math.prod(self.dims)

    @property
    def size(self) -> int:
        """Bytes of the tensor (``KeyError``: an element type of unknown size)."""
        return self.numel * DTYPE_BYTES[self.type]


def tensor(dims: Sequence[Any], types: Sequence[str], i: int) -> Tensor | None:
    """Argument ``i`` as a tensor, or None (absent, an optional left out, a scalar or a
    list: Kineto writes ``""``, ``Scalar``, ``ScalarList``, ``TensorList`` for them)."""
    if i >= len(dims) or i >= len(types) or types[i] not in DTYPE_BYTES:
        return None
    d = dims[i]
    if not isinstance(d, list) or any(not isinstance(x, int) for x in d):
        return None
    return Tensor(tuple(d), types[i])


def _peak_dtype(t: Tensor) -> str | None:
    return PEAK_DTYPES.get(t.type)


def _concrete(concrete: Sequence[str], i: int) -> Any:
    """Concrete input ``i`` as a value (``"[1, 1]"`` a list, ``"True"`` a bool, ``"2"`` an
    int), or None when not recorded."""
    if i >= len(concrete) or concrete[i] in ("", None):
        return None
    text = concrete[i]
    if text in ("True", "False"):
        return text == "True"
    try:
        return json.loads(text)
    except ValueError:
        try:
            return float(text)
        except ValueError:
            return None


# --- GEMM ------------------------------------------------------------------------------------

def _gemm(a: Tensor, b_rows: int, m: int, n: int, k: int, reads: Sequence[Tensor],
          bias: Tensor | None) -> OpModel:
    """``b_rows`` independent (m x k) @ (k x n) products, their inputs read once, the output
    (b_rows x m x n, at A's type) written once; a bias adds one FLOP per output element."""
    flops = 2 * b_rows * m * n * k + (b_rows * m * n if bias is not None else 0)
    out = b_rows * m * n * DTYPE_BYTES[a.type]
    moved = sum(t.size for t in reads) + (bias.size if bias is not None else 0) + out
    return OpModel("gemm", flops, moved, _peak_dtype(a))


def gemm(name: str, dims: Sequence[Any], types: Sequence[str],
         concrete: Sequence[str]) -> OpModel | None:
    """aten::mm (A, B), addmm (bias, A, B), bmm (A, B), baddbmm (C, A, B), matmul (A, B,
    broadcast batch), linear (input, weight[N, K], bias?): FLOPs ``2·B·M·N·K`` (+ ``B·M·N``
    with a bias); bytes A + B + C (+ bias) at their types."""
    op = name.removeprefix("aten::")
    first = 1 if op in ("addmm", "baddbmm") else 0
    a, b = tensor(dims, types, first), tensor(dims, types, first + 1)
    if a is None or b is None:
        return None
    bias = tensor(dims, types, 0) if first else (tensor(dims, types, 2) if op == "linear"
                                                  else None)
    if op in ("mm", "addmm") and len(a.dims) == 2 and len(b.dims) == 2:
        return _gemm(a, 1, a.dims[0], b.dims[1], a.dims[1], (a, b), bias)
    if op in ("bmm", "baddbmm") and len(a.dims) == 3 and len(b.dims) == 3:
        return _gemm(a, a.dims[0], a.dims[1], b.dims[2], a.dims[2], (a, b), bias)
    if op == "linear" and a.dims and len(b.dims) == 2:
        m = math.prod(a.dims[:-1])
        return _gemm(a, 1, m, b.dims[0], b.dims[1], (a, b), bias)
    if op == "matmul" and a.dims and b.dims:
        # 1-D operands are a row (A) or a column (B); the batch dims broadcast
        ad = (1, *a.dims) if len(a.dims) == 1 else a.dims
        bd = (*b.dims, 1) if len(b.dims) == 1 else b.dims
        batch = math.prod(_broadcast(ad[:-2], bd[:-2]))
        return _gemm(a, batch, ad[-2], bd[-1], ad[-1], (a, b), None)
    return None


def _broadcast(x: Sequence[int], y: Sequence[int]) -> tuple[int, ...]:
    """The broadcast shape of two shapes (NumPy rules)."""
    n = max(len(x), len(y))
    x, y = (1,) * (n - len(x)) + tuple(x), (1,) * (n - len(y)) + tuple(y)
    return tuple(max(p, q) for p, q in zip(x, y))


# --- attention -------------------------------------------------------------------------------

#: Where each SDPA op records ``is_causal`` (its position in the op's schema).
SDPA_CAUSAL: dict[str, int] = {
    "aten::scaled_dot_product_attention": 5,
    "aten::_scaled_dot_product_flash_attention": 4,
    "aten::_scaled_dot_product_efficient_attention": 6,
    "aten::_scaled_dot_product_cudnn_attention": 6,
    "aten::_scaled_dot_product_flash_attention_backward": 11,
    "aten::_scaled_dot_product_efficient_attention_backward": 11,
    "aten::_scaled_dot_product_cudnn_attention_backward": 14,
}


def causal_fraction(l: int, s: int) -> float:  # noqa: E741 - the query length, as in PyTorch
    """The share of the L x S score matrix a causal mask keeps: 1/2 for a square one (as
    TraceLens and FlashAttention's benchmarks count it), else PyTorch's top-left mask: row i
    keeps min(i + 1, S) of its S columns."""
    if l == s:
        return 0.5
    # sum over rows i < L of min(i + 1, S), in closed form: rows up to S keep 1..i+1 (a
    # triangle), the L - S rows past it keep all S (a Python loop over rows took ~0.2 s an
    # op for long sequences)
    kept = l * (l + 1) // 2 if l <= s else s * (s + 1) // 2 + (l - s) * s
    return kept / (l * s)


def sdpa(name: str, dims: Sequence[Any], types: Sequence[str],
         concrete: Sequence[str]) -> OpModel | None:
    """Scaled dot-product attention, q [B, H, L, E], k [B, Hkv, S, E], v [B, Hkv, S, Ev]:
    forward FLOPs ``2·B·H·L·S·E + 2·B·H·L·S·Ev`` (QKᵀ and PV; softmax left out), times the
    causal fraction; bytes q + k + v + out. Backward (the ``_backward`` ops: grad_out, q, k,
    v first): 2.5x the forward FLOPs (QKᵀ recomputed, dV, dP, dQ, dK: five products of the
    forward's size, over its two); bytes q, k, v, grad_out read and dq, dk, dv written."""
    backward = name.endswith("_backward")
    q, k, v = (tensor(dims, types, i + backward) for i in range(3))
    if q is None or k is None or v is None or len(q.dims) != 4 or len(k.dims) != 4 \
            or len(v.dims) != 4:
        return None
    b, h, l, e = q.dims  # noqa: E741
    s, ev = k.dims[2], v.dims[3]
    causal = _concrete(concrete, SDPA_CAUSAL.get(name, -1)) is True
    fraction = causal_fraction(l, s) if causal else 1.0
    forward = 2 * b * h * l * s * e + 2 * b * h * l * s * ev
    out = b * h * l * ev * DTYPE_BYTES[q.type]
    if backward:
        flops = round(2.5 * forward * fraction)
        moved = 2 * (q.size + k.size + v.size) + out  # read q k v grad_out; write dq dk dv
    else:
        flops = round(forward * fraction)
        moved = q.size + k.size + v.size + out
    return OpModel("sdpa", flops, moved, _peak_dtype(q))


# --- convolution -----------------------------------------------------------------------------

#: ``transposed`` position of an op that is always a transposed convolution.
TRANSPOSED = -2

#: Argument positions per convolution op: input, weight, bias (-1: none), stride, padding,
#: dilation, transposed (-1: never; ``TRANSPOSED``: always), output_padding (-1: none),
#: groups.
CONV_ARGS: dict[str, tuple[int, ...]] = {
    "aten::convolution": (0, 1, 2, 3, 4, 5, 6, 7, 8),
    "aten::_convolution": (0, 1, 2, 3, 4, 5, 6, 7, 8),
    "aten::cudnn_convolution": (0, 1, -1, 3, 2, 4, -1, -1, 5),
    "aten::convolution_backward": (1, 2, -1, 4, 5, 6, 7, 8, 9),
    # ROCm (self, weight, bias, padding, stride, dilation, groups, benchmark, deterministic);
    # the transpose has output_padding after padding and is always transposed (TRANSPOSED)
    "aten::miopen_convolution": (0, 1, 2, 4, 3, 5, -1, -1, 6),
    "aten::miopen_depthwise_convolution": (0, 1, 2, 4, 3, 5, -1, -1, 6),
    "aten::miopen_convolution_transpose": (0, 1, 2, 5, 3, 6, TRANSPOSED, 4, 7),
}


def _conv_geometry(name: str, dims: Sequence[Any], types: Sequence[str],
                   concrete: Sequence[str]) -> tuple[Tensor, Tensor, tuple[int, ...],
                                                      bool] | None:
    """Input, weight, output shape and whether transposed, from the op's arguments."""
    at = CONV_ARGS[name]
    x, w = tensor(dims, types, at[0]), tensor(dims, types, at[1])
    if x is None or w is None or len(x.dims) < 3 or len(w.dims) != len(x.dims):
        return None
    nd = len(x.dims) - 2

    def spatial(i: int, default: int) -> list[int]:
        v = _concrete(concrete, i) if i >= 0 else None
        v = [default] if v is None else ([int(v)] if isinstance(v, (int, float)) else v)
        return list(v) * nd if len(v) == 1 else list(v)

    stride, padding, dilation = spatial(at[3], 1), spatial(at[4], 0), spatial(at[5], 1)
    out_pad = spatial(at[7], 0)
    transposed = at[6] == TRANSPOSED or (at[6] >= 0 and _concrete(concrete, at[6]) is True)
    groups = int(_concrete(concrete, at[8]) or 1)
    k = w.dims[2:]
    if transposed:
        sp = [(x.dims[2 + i] - 1) * stride[i] - 2 * padding[i] + dilation[i] * (k[i] - 1)
              + out_pad[i] + 1 for i in range(nd)]
        channels = w.dims[1] * groups
    else:
        sp = [(x.dims[2 + i] + 2 * padding[i] - dilation[i] * (k[i] - 1) - 1) // stride[i] + 1
              for i in range(nd)]
        channels = w.dims[0]
    return x, w, (x.dims[0], channels, *sp), transposed


def conv(name: str, dims: Sequence[Any], types: Sequence[str],
         concrete: Sequence[str]) -> OpModel | None:
    """Convolution, N-d, grouped and transposed: forward FLOPs ``2·numel(out)·prod(w[1:])``
    (``numel(in)`` for a transposed one) + ``numel(out)`` with a bias; bytes in + w (+ bias)
    + out. Backward (aten::convolution_backward, ``output_mask`` picking the gradients):
    the forward's product FLOPs once per input and weight gradient, ``numel(grad_out)`` for
    the bias gradient; bytes grad_out, in and w read, each asked gradient written."""
    found = _conv_geometry(name, dims, types, concrete)
    if found is None:
        return None
    x, w, out_dims, transposed = found
    per = 2 * math.prod(w.dims[1:]) * (x.numel if transposed else math.prod(out_dims))
    size = DTYPE_BYTES[x.type]
    out_bytes = math.prod(out_dims) * size
    if name == "aten::convolution_backward":
        mask = _concrete(concrete, 10)
        mask = mask if isinstance(mask, list) and len(mask) == 3 else [True, True, False]
        flops = per * (bool(mask[0]) + bool(mask[1])) + (math.prod(out_dims) if mask[2] else 0)
        written = (x.size if mask[0] else 0) + (w.size if mask[1] else 0) \
            + (out_dims[1] * size if mask[2] else 0)
        return OpModel("conv", flops, out_bytes + x.size + w.size + written, _peak_dtype(x))
    bias_at = CONV_ARGS[name][2]
    bias = tensor(dims, types, bias_at) if bias_at >= 0 else None
    flops = per + (math.prod(out_dims) if bias is not None else 0)
    moved = x.size + w.size + (bias.size if bias is not None else 0) + out_bytes
    return OpModel("conv", flops, moved, _peak_dtype(x))


# --- elementwise and reductions --------------------------------------------------------------

#: FLOPs per output element of the elementwise ops modelled (a transcendental function counts
#: one, as TraceLens's softmax model counts exp; copies and casts none). In-place variants
#: (``add_``) take their op's count.
ELEMENTWISE_FLOPS: dict[str, int] = {
    **dict.fromkeys(("add", "sub", "mul", "div", "neg", "abs", "relu", "sigmoid", "tanh",
                     "exp", "log", "sqrt", "rsqrt", "reciprocal", "pow", "maximum",
                     "minimum", "clamp", "threshold_backward", "sin", "cos", "gelu", "silu",
                     "erf", "where", "eq", "ne", "lt", "gt", "le", "ge", "clamp_min",
                     "clamp_max", "sigmoid_backward", "tanh_backward"), 1),
    "addcmul": 2, "addcdiv": 2, "lerp": 2, "gelu_backward": 2, "silu_backward": 2,
    "copy": 0, "fill": 0, "clone": 0,
}

#: How many leading arguments of an elementwise op are its inputs (tensors, scalars and
#: options of its functional schema); a tensor recorded after them is the ``out=`` tensor,
#: written and not read (``mul.out(self, other, *, out)``: ``[[512], [], [512]]``). Default 2.
ELEMENTWISE_INPUTS: dict[str, int] = {
    **dict.fromkeys(("neg", "abs", "relu", "sigmoid", "tanh", "exp", "log", "sqrt", "rsqrt",
                     "reciprocal", "sin", "cos", "silu", "erf"), 1),
    **dict.fromkeys(("add", "sub", "where", "lerp", "clamp", "threshold_backward",
                     "gelu_backward", "copy"), 3),
    **dict.fromkeys(("addcmul", "addcdiv"), 4),
}

#: FLOPs per input element of the reductions modelled: a sum or max is one; softmax exp,
#: sum, divide (three, as TraceLens); a norm: mean (1), centre (1), square and accumulate
#: (2), scale by 1/std (1), weight and bias (2) = 7; RMS norm: square and accumulate (2),
#: scale (1), weight (1) = 4.
REDUCE_FLOPS: dict[str, int] = {
    **dict.fromkeys(("sum", "mean", "amax", "amin", "max", "min", "prod", "argmax", "argmin",
                     "any", "all", "cumsum", "norm", "linalg_vector_norm", "linalg_norm"),
                    1),
    **dict.fromkeys(("var", "std", "var_mean", "std_mean"), 3),
    **dict.fromkeys(("softmax", "_softmax", "log_softmax", "_log_softmax",
                     "_softmax_backward_data", "_log_softmax_backward_data"), 3),
    **dict.fromkeys(("layer_norm", "native_layer_norm", "group_norm", "native_group_norm",
                     "batch_norm", "native_batch_norm", "_batch_norm_impl_index",
                     "cudnn_batch_norm", "miopen_batch_norm", "instance_norm"), 7),
    # dx = w·rstd·(dy − mean(dy) − x̂·mean(dy·x̂)): x̂ (2), dy·x̂ (1), two channel sums (2),
    # dx (4); the weight and bias gradients are the sums
    **dict.fromkeys(("native_batch_norm_backward", "cudnn_batch_norm_backward",
                     "miopen_batch_norm_backward"), 9),
    **dict.fromkeys(("rms_norm", "_fused_rms_norm"), 4),
}

#: Reductions whose output has the input's shape (a normalisation, a softmax, a scan).
_SAME_SHAPE = {"softmax", "_softmax", "log_softmax", "_log_softmax", "_softmax_backward_data",
               "_log_softmax_backward_data", "cumsum", "layer_norm", "native_layer_norm",
               "group_norm", "native_group_norm", "batch_norm", "native_batch_norm",
               "_batch_norm_impl_index", "cudnn_batch_norm", "miopen_batch_norm", "instance_norm",
               "rms_norm", "_fused_rms_norm", "native_batch_norm_backward",
               "cudnn_batch_norm_backward", "miopen_batch_norm_backward"}

#: Where a reduction records its ``dim`` (default 1: ``sum(self, dim, ...)``); the norms
#: take ``ord``/``p`` first (``linalg_vector_norm(self, ord, dim, keepdim)``).
REDUCE_DIM_ARG: dict[str, int] = {"norm": 2, "linalg_vector_norm": 2, "linalg_norm": 2}


def _base(name: str) -> str:
    """``aten::add_`` -> ``add``, ``aten::copy_`` -> ``copy``."""
    op = name.removeprefix("aten::")
    return op[:-1] if op.endswith("_") and not op.startswith("_") else op


def elementwise(name: str, dims: Sequence[Any], types: Sequence[str],
                concrete: Sequence[str]) -> OpModel | None:
    """Unary and binary elementwise ops: the output has the broadcast shape of the tensor
    inputs and the first one's type; FLOPs = output elements x ``ELEMENTWISE_FLOPS``; bytes
    = tensor inputs read + output written. ``copy_`` (self, src) reads only src; an ``out=``
    tensor (recorded after the op's ``ELEMENTWISE_INPUTS``) is the output, counted once, as
    written."""
    op = _base(name)
    inputs = min(len(dims), ELEMENTWISE_INPUTS.get(op, 2))
    tensors = [t for t in (tensor(dims, types, i) for i in range(inputs)) if t is not None]
    if op not in ELEMENTWISE_FLOPS or not tensors:
        return None
    shape: tuple[int, ...] = ()
    for t in tensors:
        shape = _broadcast(shape, t.dims)
    out = math.prod(shape)
    reads = tensors[1:] if op == "copy" else tensors
    moved = sum(t.size for t in reads) + out * DTYPE_BYTES[tensors[0].type]
    return OpModel("elementwise", out * ELEMENTWISE_FLOPS[op], moved,
                   _peak_dtype(tensors[0]))


def reduction(name: str, dims: Sequence[Any], types: Sequence[str],
              concrete: Sequence[str]) -> OpModel | None:
    """Reductions and normalisations over their first input x: FLOPs = ``numel(x)`` x
    ``REDUCE_FLOPS``; bytes = tensor inputs read (x, weights) + output written: x's shape
    for normalisations and softmax, else x less the reduced dims (``dim`` from the concrete
    inputs; none recorded: all of them)."""
    op = _base(name)
    x = tensor(dims, types, 0)
    if op not in REDUCE_FLOPS or x is None:
        return None
    reads = [t for t in (tensor(dims, types, i) for i in range(len(dims))) if t is not None]
    if op in _SAME_SHAPE:
        out = x.numel
    else:
        dim = _concrete(concrete, REDUCE_DIM_ARG.get(op, 1))
        dim = [dim] if isinstance(dim, int) and not isinstance(dim, bool) else dim
        if isinstance(dim, list) and dim and all(isinstance(d, int) for d in dim) and x.dims:
            kept = {d % len(x.dims) for d in dim}
            out = math.prod(n for i, n in enumerate(x.dims) if i not in kept)
        else:
            out = 1
    moved = sum(t.size for t in reads) + out * DTYPE_BYTES[x.type]
    return OpModel("reduce", x.numel * REDUCE_FLOPS[op], moved, _peak_dtype(x))


# --- which family --------------------------------------------------------------------------

Family = Callable[[str, Sequence[Any], Sequence[str], Sequence[str]], OpModel | None]

_FAMILIES: dict[str, Family] = {
    **dict.fromkeys(("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::matmul",
                     "aten::linear"), gemm),
    **dict.fromkeys(SDPA_CAUSAL, sdpa),
    **dict.fromkeys(CONV_ARGS, conv),
}


def register(names: str | Sequence[str], fn: Family) -> None:
    """Add a model for ops no family knows (a custom op: ``vllm::rms_norm``,
    ``aiter::fmha_v3_fwd``), or replace one: ``fn(name, dims, types, concrete)`` gets the
    op's recorded ``Input Dims``, ``Input type`` and ``Concrete Inputs`` and returns an
    :class:`OpModel` (its ``category`` one of ``CATEGORIES``), or None where they do not say
    enough. Registered before a run's ``ops`` is asked (``docs/metrics.md``, "A model for
    a custom op")."""
    for name in [names] if isinstance(names, str) else names:
        _FAMILIES[name] = fn


def family(name: str) -> Family | None:
    """The model function of an op name, or None when no family models it."""
    if name in _FAMILIES:
        return _FAMILIES[name]
    if not name.startswith("aten::"):
        return None
    op = _base(name)
    return elementwise if op in ELEMENTWISE_FLOPS else reduction if op in REDUCE_FLOPS \
        else None


#: The most FLOPs or bytes one op's model gives (docs/formats.md, *Bounds*): int64 with room
#: to spare (2^62, 4.6e18: a second of a 4 EFLOP/s machine). Shapes that give more are not
#: believable (and would not fit the answer's integer columns): not modelled, with a warning.
MAX_MODELLED = 1 << 62


def model(name: str, dims: Sequence[Any] | None, types: Sequence[str] | None,
          concrete: Sequence[str] | None) -> OpModel | None:
    """The op's model from its recorded arguments, or None (no family models it, or its
    arguments were not recorded, do not fit the family's schema, or are out of bounds:
    :func:`checked_model`)."""
    return checked_model(name, dims, types, concrete)[0]


def checked_model(name: str, dims: Sequence[Any] | None, types: Sequence[str] | None,
                  concrete: Sequence[str] | None) -> tuple[OpModel | None, str | None]:
    """(:func:`model`, why a family's op was not modelled when the reason is worth a
    warning: a negative dimension, FLOPs or bytes beyond ``MAX_MODELLED``)."""
    fn = family(name)
    if fn is None or not dims or not types:
        return None, None
    if any(isinstance(d, list) and any(isinstance(x, int) and x < 0 for x in d)
           for d in dims):
        return None, "a negative dimension"
    try:
        found = fn(name, dims, types, concrete or [])
    except (KeyError, IndexError, TypeError, ValueError, ZeroDivisionError, OverflowError):
        return None, None  # arguments that do not fit the schema the family assumes
    if found is not None and not (0 <= found.flops <= MAX_MODELLED
                                  and 0 <= found.bytes <= MAX_MODELLED):
        return None, "FLOPs or bytes beyond 2^62"
    return found, None
