"""The DSL from Python: the same primitives as the C++ DSL (dsl/dsl.h), building the same IR.

    from ladle import dsl
    x, tau = dsl.token_key("x"), dsl.head_param("tau")
    state = dsl.scan(dsl.k, dsl.v).decay_k(dsl.logsigmoid(x) / tau)
    variant = dsl.lower(dsl.read(state, dsl.q, dsl.scalar("scale")), "custom_gate")

An expression knows what it varies over (tokens, heads, key or value features), as the C++
templates do at compile time; what C++ refuses with a static_assert, Python refuses with a
ValueError naming the argument when the expression is built. lower() hands the expression to the
C++ library, which validates it again (ir::validate) and hashes it: the same variant written in
C++ and in Python has the same hash, so both share compiled kernels and tuned tiles.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass, replace
from typing import Optional

from . import _ladle
from ._variant import AttentionVariant, Variant

NONE, KEY, VALUE = "none", "key", "value"

_KIND_EXTENT = {
    "token_key": (True, True, KEY),
    "token_value": (True, True, VALUE),
    "token_head": (True, True, NONE),
    "head": (False, True, NONE),
    "head_key": (False, True, KEY),
    "scalar": (False, False, NONE),
    "pair": (True, True, NONE),
}


def _join(a: str, b: str) -> Optional[str]:
    if a == NONE:
        return b
    if b == NONE or a == b:
        return a
    return None


class Expr:
    """An elementwise expression: a node of nested tuples plus what it varies over."""

    __slots__ = ("node", "token", "head", "feature")

    def __init__(self, node: tuple, token: bool, head: bool, feature: str):
        self.node, self.token, self.head, self.feature = node, token, head, feature

    def __repr__(self) -> str:
        return f"<ladle.dsl.Expr {_text(self.node)} over {self.feature} features>"

    def _binary(self, op: str, other, swap: bool = False) -> "Expr":
        o = as_expression(other, f"the other operand of {op}")
        a, b = (o, self) if swap else (self, o)
        feature = _join(a.feature, b.feature)
        if feature is None:
            raise ValueError(
                f"{op}: cannot combine an expression over the key features [..,K] with one over the value "
                f"features [..,V] ({_text(a.node)} and {_text(b.node)})"
            )
        return Expr((op, a.node, b.node), a.token or b.token, a.head or b.head, feature)

    def __add__(self, o): return self._binary("add", o)
    def __radd__(self, o): return self._binary("add", o, True)
    def __sub__(self, o): return self._binary("sub", o)
    def __rsub__(self, o): return self._binary("sub", o, True)
    def __mul__(self, o): return self._binary("mul", o)
    def __rmul__(self, o): return self._binary("mul", o, True)
    def __truediv__(self, o): return self._binary("div", o)
    def __rtruediv__(self, o): return self._binary("div", o, True)
    def __pow__(self, o): return self._binary("pow", o)
    def __rpow__(self, o): return self._binary("pow", o, True)
    # Comparisons and logic, for softmax-attention masks: 1 for true, 0 for false. == and != stay
    # Python's (use eq, ne); &, | and ~ are and, or and not.
    def __lt__(self, o): return self._binary("less", o)
    def __le__(self, o): return self._binary("less_equal", o)
    def __gt__(self, o): return self._binary("less", o, True)
    def __ge__(self, o): return self._binary("less_equal", o, True)
    def __and__(self, o): return self._binary("and", o)
    def __rand__(self, o): return self._binary("and", o, True)
    def __or__(self, o): return self._binary("or", o)
    def __ror__(self, o): return self._binary("or", o, True)
    def __invert__(self): return _unary("not", self)
    def __neg__(self): return _unary("neg", self)
    def __abs__(self): return _unary("abs", self)

    def __bool__(self):
        raise TypeError("a ladle.dsl expression has no truth value (it is evaluated inside the kernel)")


def as_expression(x, what: str = "operand") -> Expr:
    if isinstance(x, Expr):
        return x
    if isinstance(x, numbers.Real) and not isinstance(x, bool):
        return Expr(("constant", float(x)), False, False, NONE)
    raise TypeError(f"{what}: expected a ladle.dsl expression or a number, got {type(x).__name__}")


def _text(node: tuple) -> str:
    head = node[0]
    if head == "input":
        return node[1]
    if head == "constant":
        return repr(node[1])
    if head == "leaf":
        return node[1]
    if len(node) == 2:
        return f"{head}({_text(node[1])})"
    return f"{head}({_text(node[1])}, {_text(node[2])})"


def _symbol(name: str, kind: str, role: str = "other") -> Expr:
    if not isinstance(name, str) or not name.isidentifier():
        raise ValueError(f"input name: expected an identifier, got {name!r}")
    token, head, feature = _KIND_EXTENT[kind]
    return Expr(("input", name, kind, role), token, head, feature)


# The three inputs every variant has: q [B,T,H,K], k [B,T,H_kv,K], v [B,T,H_kv,V].
q = _symbol("q", "token_key", "query")
k = _symbol("k", "token_key", "key")
v = _symbol("v", "token_value", "value")


def token_key(name: str) -> Expr:
    """[B,T,H,K]: per token, per head, over the key features."""
    return _symbol(name, "token_key")


def token_value(name: str) -> Expr:
    """[B,T,H,V]: per token, per head, over the value features."""
    return _symbol(name, "token_value")


def token_head(name: str) -> Expr:
    """[B,T,H]: per token and head."""
    return _symbol(name, "token_head")


def head_param(name: str) -> Expr:
    """[H] or [B,H]: a per-head parameter."""
    return _symbol(name, "head")


def head_key(name: str) -> Expr:
    """[H,K] or [B,H,K]: a per-head parameter over the key features (RWKV6's bonus u)."""
    return _symbol(name, "head_key")


def scalar(name: str) -> Expr:
    """One float, passed by value."""
    return _symbol(name, "scalar")


def _unary(op: str, x) -> Expr:
    e = as_expression(x, f"{op}(x)")
    return Expr((op, e.node), e.token, e.head, e.feature)


def exp(x): return _unary("exp", x)
def log(x): return _unary("log", x)
def sqrt(x): return _unary("sqrt", x)
def sigmoid(x): return _unary("sigmoid", x)
def logsigmoid(x): return _unary("logsigmoid", x)  # log(sigmoid(x)), without overflow
def softplus(x): return _unary("softplus", x)      # log(1 + exp(x)), without overflow
def tanh(x): return _unary("tanh", x)
def elu(x): return _unary("elu", x)
def relu(x): return _unary("relu", x)
def silu(x): return _unary("silu", x)


def eq(a, b): return as_expression(a, "eq(a, b)")._binary("equal", b)
def ne(a, b): return as_expression(a, "ne(a, b)")._binary("not_equal", b)


def minimum(a, b): return as_expression(a, "minimum(a, b)")._binary("min", b)
def maximum(a, b): return as_expression(a, "maximum(a, b)")._binary("max", b)


# Softmax attention (dsl/softmax.h): the leaves a score expression reads besides its inputs.
score = Expr(("leaf", "score"), True, True, NONE)              # q_i . k_j, the raw dot product
query_index = Expr(("leaf", "i"), True, False, NONE)  # i, from the start of the query's sequence
key_index = Expr(("leaf", "j"), True, False, NONE)      # j, from the start of the key's sequence
head_index = Expr(("leaf", "h"), False, True, NONE)    # h, the query head
batch_index = Expr(("leaf", "b"), False, False, NONE)  # b (the sequence under cu_seqlens)


def pair(name: str) -> Expr:
    """[B,H,Tq,Tk], B and H broadcastable: per (query, key) pair (a bias, a mask)."""
    return _symbol(name, "pair")


def soft_cap(x, cap) -> Expr:
    """cap * tanh(x / cap)."""
    c = as_expression(cap, "soft_cap(x, cap): cap")
    return c * tanh(as_expression(x, "soft_cap(x, cap): x") / c)


@dataclass(frozen=True, eq=False)
class Softmax:
    """softmax(logit): p_i = softmax_j(logit_ij) over the attended keys, o_i = sum_j p_ij v_j."""

    logit: Expr
    keep: Optional[Expr] = None
    is_causal: bool = False
    has_window: bool = False
    has_segment_ids: bool = False
    has_sinks: bool = False
    has_dropout: bool = False

    def causal(self) -> "Softmax": return replace(self, is_causal=True)
    def sliding_window(self) -> "Softmax": return replace(self, has_window=True)
    def segment_ids(self) -> "Softmax": return replace(self, has_segment_ids=True)
    def sinks(self) -> "Softmax": return replace(self, has_sinks=True)
    def dropout(self) -> "Softmax": return replace(self, has_dropout=True)

    def mask(self, predicate) -> "Softmax":
        """Attend where the predicate is nonzero (and where earlier masks allow)."""
        p = as_expression(predicate, "mask(predicate)")
        if p.feature != NONE:
            raise ValueError("mask(predicate): the predicate is one number per (query, key) pair")
        return replace(self, keep=p if self.keep is None else self.keep & p)


def softmax(logit) -> Softmax:
    e = as_expression(logit, "softmax(logit)")
    if e.feature != NONE:
        raise ValueError("softmax(logit): the logit is one number per (query, key) pair; it must not vary over features "
                         "(q_i . k_j is dsl.score)")
    return Softmax(e)


def _add_log(old: Optional[Expr], g: Expr) -> Expr:
    return g if old is None else old + g


@dataclass(frozen=True, eq=False)
class Scan:
    """scan(k, v): the state S_t = (decays) S_{t-1} + k v^T, or the delta rule's update."""

    key: Expr
    value: Expr
    gk: Optional[Expr] = None
    gv: Optional[Expr] = None
    gh: Optional[Expr] = None
    beta: Optional[Expr] = None

    def delta(self, beta) -> "Scan":
        """The delta rule: S <- (I - beta k k^T) S + beta k v^T, beta per token and head."""
        b = as_expression(beta, "delta(beta)")
        if b.feature != NONE:
            raise ValueError("delta(beta): the write strength beta is one value per token and head [B,T,H] (or per head); "
                             "it must not vary over features")
        if self.beta is not None:
            raise ValueError("delta(beta): the scan already has the delta rule's write strength")
        if self.gv is not None:
            raise ValueError("delta(beta): the delta rule takes a per-head or key-side decay (decay_head: the gated delta "
                             "rule; decay_k: KDA), not a value-side decay (decay_v)")
        return replace(self, beta=b)

    def decay_k(self, g) -> "Scan":
        """A key-side decay (log space), over the key features or broadcast over them."""
        e = as_expression(g, "decay_k(g)")
        if e.feature == VALUE:
            raise ValueError("decay_k: a key-side decay varies over the key features [..,K] (or is broadcast over them); "
                             "this gate varies over the value features, use decay_v")
        return replace(self, gk=_add_log(self.gk, e))

    def decay_v(self, g) -> "Scan":
        """A value-side decay (log space), over the value features or broadcast over them."""
        e = as_expression(g, "decay_v(g)")
        if e.feature == KEY:
            raise ValueError("decay_v: a value-side decay varies over the value features [..,V] (or is broadcast over "
                             "them); this gate varies over the key features, use decay_k")
        if self.beta is not None:
            raise ValueError("decay_v: the delta rule takes a per-head or key-side decay, not a value-side decay")
        return replace(self, gv=_add_log(self.gv, e))

    def decay_head(self, g) -> "Scan":
        """A per-head decay (log space), possibly per token; never over features."""
        e = as_expression(g, "decay_head(g)")
        if e.feature != NONE:
            raise ValueError("decay_head: a per-head decay must not vary over features; use decay_k or decay_v")
        return replace(self, gh=_add_log(self.gh, e))


def scan(key, value) -> Scan:
    kk, vv = as_expression(key, "scan(k, v): k"), as_expression(value, "scan(k, v): v")
    if kk.feature != KEY:
        raise ValueError("scan(k, v): the key must vary over the key features [..,K] (k, or an expression of k)")
    if vv.feature != VALUE:
        raise ValueError("scan(k, v): the value must vary over the value features [..,V] (v, or an expression of v)")
    return Scan(kk, vv)


@dataclass(frozen=True, eq=False)
class Read:
    """read(state, q[, scale]): o_t = (scale q)^T S_t; read_before: o_t = (scale q)^T S_{t-1}."""

    state: Scan
    query: Expr
    scale: Optional[Expr] = None
    normalize: bool = False
    eps: float = 1e-10
    before: bool = False
    bonus_weight: Optional[Expr] = None
    l2: bool = False

    def scaled(self, s) -> "Read":
        e = as_expression(s, "scaled(s)")
        if e.feature != NONE:
            raise ValueError("scaled(s): the scale must not vary over features")
        return replace(self, scale=e if self.scale is None else self.scale * e)

    def normalized(self, eps: float = 1e-10) -> "Read":
        if self.state.gv is not None:
            raise ValueError("normalized(): normalisation of the read is defined only without a value-side decay")
        if self.state.beta is not None:
            raise ValueError("normalized(): the delta rule has no normaliser")
        if self.before:
            raise ValueError("normalized(): a read before the update (read_before) has no normaliser")
        return replace(self, normalize=True, eps=float(eps))

    def l2_normalized(self) -> "Read":
        """q and k divided by sqrt(sum over K of x^2 + 1e-6) inside the kernel (the delta rule's option)."""
        if self.state.beta is None:
            raise ValueError("l2_normalized(): L2 normalisation of q and k belongs to the delta rule (scan(k, v).delta(beta))")
        return replace(self, l2=True)

    def bonus(self, u) -> "Read":
        """o_t = (scale q)^T (S_{t-1} + diag(u) k v^T): the current token read through the bonus u."""
        if not self.before:
            raise ValueError("bonus(u): only a read before the update (read_before(state, q)) adds a bonus on the current token")
        if self.bonus_weight is not None:
            raise ValueError("bonus(u): the read already has a bonus")
        e = as_expression(u, "bonus(u)")
        if e.feature == VALUE:
            raise ValueError("bonus(u): the bonus weighs the key features [..,K] (u is [H,K], dsl.head_key); this one varies "
                             "over the value features")
        return replace(self, bonus_weight=e)


def _read(state, query, scale, before: bool) -> Read:
    what = "read_before" if before else "read"
    if not isinstance(state, Scan):
        raise TypeError(f"{what}(state, q): the state must be a scan(k, v), possibly decayed; got {type(state).__name__}")
    qq = as_expression(query, f"{what}(state, q): q")
    if qq.feature != KEY:
        raise ValueError(f"{what}(state, q): the query must vary over the key features [..,K] (q, or an expression of q)")
    s = None
    if scale is not None:
        s = as_expression(scale, f"{what}(state, q, scale): scale")
        if s.feature != NONE:
            raise ValueError(f"{what}(state, q, scale): the scale must not vary over features")
    if before and state.beta is not None:
        raise ValueError("read_before(state, q): the delta rule is read after its update; use read(state, q)")
    if before and state.gv is not None:
        raise ValueError("read_before(state, q): a read before the update takes no value-side decay (decay_v)")
    return Read(state, qq, s, before=before)


def read(state: Scan, query, scale=None) -> Read:
    return _read(state, query, scale, False)


def read_before(state: Scan, query, scale=None) -> Read:
    return _read(state, query, scale, True)


def lower(r, name: str = ""):
    """The variant of a read (a ladle.Variant: what ladle.run_variant and ladle.torch.run_variant run) or
    of a softmax (a ladle.AttentionVariant: what ladle.torch.run_attention runs)."""
    if isinstance(r, Softmax):
        return AttentionVariant(_ladle.make_attention_variant(
            name, r.logit.node, None if r.keep is None else r.keep.node, r.is_causal, r.has_window, r.has_segment_ids,
            r.has_sinks, r.has_dropout))
    if not isinstance(r, Read):
        raise TypeError(f"lower(read): expected a read(...) of a scan or a softmax(...), got {type(r).__name__}")
    slots = {"q_feature": r.query.node, "k_feature": r.state.key.node, "v": r.state.value.node}
    for slot, e in (("log_decay_k", r.state.gk), ("log_decay_v", r.state.gv), ("log_decay_head", r.state.gh),
                    ("scale", r.scale), ("write_strength", r.state.beta), ("bonus", r.bonus_weight)):
        if e is not None:
            slots[slot] = e.node
    return Variant(_ladle.make_variant(name, slots, delta=r.state.beta is not None, read_before=r.before, l2=r.l2,
                               normalize=r.normalize, eps=r.eps))
