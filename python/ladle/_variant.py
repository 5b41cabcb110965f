"""ladle.Variant: a lowered variant (the C++ ir::Variant) with its facts as plain attributes, so that
torch.compile reads them while tracing without calling into the extension. Every Variant made in a
process is kept by its hash: the torch custom ops name a variant by that string."""

from __future__ import annotations

from . import _ladle


class Variant:
    """What ladle.dsl.lower and ladle.named_variant return: name, hash (16 hex digits, the same as
    the C++ library's for the same expression), form (the update form in words), plain_form, inputs
    ((name, kind, role) in order of first use) and kinds (name -> kind); str() prints the recurrence."""

    _registry: dict = {}

    def __init__(self, native: "_ladle.Variant"):
        if not isinstance(native, _ladle.Variant):
            raise TypeError(f"Variant: expected a lowered variant, got {type(native).__name__}")
        self.native = native
        self.name = native.name
        self.hash = native.hash
        self.form = native.form
        self.plain_form = native.plain_form
        self.inputs = tuple(native.inputs)
        self.kinds = {name: kind for name, kind, _ in self.inputs}
        self._text = str(native)
        Variant._registry.setdefault(self.hash, self)

    def __str__(self) -> str:
        return self._text

    def __repr__(self) -> str:
        return f"<ladle.Variant {self.name or 'variant'} {self.hash}>"

    @staticmethod
    def by_hash(key: str) -> "Variant":
        try:
            return Variant._registry[key]
        except KeyError:
            raise ValueError(f"variant {key}: no variant of that hash was made in this process") from None


class AttentionVariant:
    """What ladle.dsl.lower returns for a softmax(...): name, hash, inputs ((name, kind, role), q, k, v
    first), kinds; str() prints it as the dump tool does."""

    _registry: dict = {}

    def __init__(self, native: "_ladle.AttentionVariant"):
        self.native = native
        self.name = native.name
        self.hash = native.hash
        self.inputs = tuple(native.inputs)
        self.kinds = {name: kind for name, kind, _ in self.inputs}
        self._text = str(native)
        AttentionVariant._registry.setdefault(self.hash, self)

    @staticmethod
    def by_hash(key: str) -> "AttentionVariant":
        try:
            return AttentionVariant._registry[key]
        except KeyError:
            raise ValueError(f"attention variant {key}: no variant of that hash was made in this process") from None

    def __str__(self) -> str:
        return self._text

    def __repr__(self) -> str:
        return f"<ladle.AttentionVariant {self.name or 'attention'} {self.hash}>"


_named: dict = {}


def named_variant(op: str, gates: str = "") -> Variant:
    """The variant of a named op, with gates named as ladle-dump's --gates flag: "gla" (with an
    optional g_gamma), "recurrent" with any of g, gk, gv, g_gamma, "delta_rule" and "gated_delta_rule"
    with an optional l2norm, "rwkv6", "kda" with l2norm, gate, dt_bias, sigmoid."""
    key = (op, gates)
    if key not in _named:
        _named[key] = Variant(_ladle.named_variant(op, gates))
    return _named[key]
