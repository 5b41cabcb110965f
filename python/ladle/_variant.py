"""ladle.Variant: a lowered variant (the C++ ir::Variant) with its facts as plain attributes, so that
torch.compile reads them while tracing without calling into the extension. Every Variant made in a
process is kept by its hash: the torch custom ops name a variant by that string."""

from __future__ import annotations

from . import _ladle


class _Lowered:
    """What both kinds of variant keep: the C++ object, its name, hash (16 hex digits, the same as the
    C++ library's for the same expression), inputs ((name, kind, role) in order of first use), kinds
    (name -> kind) and printout; each kind keeps a registry by hash, which the custom ops read."""

    _registry: dict = {}
    _native_type = None
    _what = "variant"

    def __init__(self, native):
        if not isinstance(native, self._native_type):
            raise TypeError(f"{type(self).__name__}: expected a lowered {self._what}, got {type(native).__name__}")
        self.native = native
        self.name = native.name
        self.hash = native.hash
        self.inputs = tuple(native.inputs)
        self.kinds = {name: kind for name, kind, _ in self.inputs}
        self._text = str(native)
        type(self)._registry.setdefault(self.hash, self)

    def __str__(self) -> str:
        return self._text

    def __repr__(self) -> str:
        return f"<ladle.{type(self).__name__} {self.name or self._what} {self.hash}>"

    @classmethod
    def by_hash(cls, key: str):
        try:
            return cls._registry[key]
        except KeyError:
            raise ValueError(f"{cls._what} {key}: no {cls._what} of that hash was made in this process") from None


class Variant(_Lowered):
    """What ladle.dsl.lower of a read and ladle.named_variant return; also form (the update form in
    words) and plain_form. str() prints the recurrence."""

    _registry: dict = {}
    _native_type = _ladle.Variant
    _what = "variant"

    def __init__(self, native: "_ladle.Variant"):
        super().__init__(native)
        self.form = native.form
        self.plain_form = native.plain_form


class AttentionVariant(_Lowered):
    """What ladle.dsl.lower of a softmax(...) returns (q, k, v are its first inputs); str() prints it
    as the dump tool does."""

    _registry: dict = {}
    _native_type = _ladle.AttentionVariant
    _what = "attention variant"


_named: dict = {}


def named_variant(op: str, gates: str = "") -> Variant:
    """The variant of a named op, with gates named as ladle-dump's --gates flag: "gla" (with an
    optional g_gamma), "recurrent" with any of g, gk, gv, g_gamma, "delta_rule" and "gated_delta_rule"
    with an optional l2norm, "rwkv6", "kda" with l2norm, gate, dt_bias, sigmoid."""
    key = (op, gates)
    if key not in _named:
        _named[key] = Variant(_ladle.named_variant(op, gates))
    return _named[key]
