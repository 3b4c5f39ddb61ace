"""A correction to how dynamo traces indexing with symbolic ints, for dealias's compiles only.

Indexing with a symbolic int inside a tuple (`cache[:, :, pos] = k`, `x[..., pos]` with `pos` an int dynamo made
dynamic): dynamo runs the indexing on fake tensors, and torch's C++ indexing converts each tuple element with
`__index__`, which specializes the symbol (`pos == 7`). Every new position then compiles again, and past the
cache limit the decode loop runs eagerly. Dynamo rewrites only a lone symbol (`x[pos]`) into `select`. For
dealias's compiles, a tuple of slices, ints, None, one Ellipsis and symbolic ints is traced as the same
indexing with each symbol replaced by a full slice, followed by a `select` per symbol (the same view: select
takes negative positions and raises IndexError out of range, as indexing does); an assignment writes
`view[...] = value` into that view, so eager's assignment rules (a scalar fills, leading 1-dims of the value
are dropped, then it broadcasts) still apply.
"""

from __future__ import annotations

import functools
import inspect
import operator
from typing import Any

from .registry import correction, replace_method, require, require_module
from .settings import applies


def _symbolic_selects(tensor: Any, key: Any) -> tuple[list[Any], list[tuple[int, Any]]] | None:
    """For a tuple index holding symbolic ints (and otherwise only slices, ints, None and one Ellipsis): the
    index with each symbol replaced by a full slice, and per symbol the dim it stands at in that indexing's
    result. None for any other index (dynamo's own handling applies)."""
    from torch._dynamo.variables import ConstantVariable, SliceVariable, SymNodeVariable, TupleVariable

    if not isinstance(key, TupleVariable) or not any(isinstance(i, SymNodeVariable) for i in key.items):
        return None
    full = SliceVariable([ConstantVariable.create(None)] * 3)
    items, symbols, consumed, ellipses = [], [], 0, 0
    for item in key.items:
        if isinstance(item, SymNodeVariable) and item.python_type() is int:
            items.append(full)
            consumed += 1
        elif isinstance(item, SliceVariable):
            items.append(item)
            consumed += 1
        elif isinstance(item, ConstantVariable) and (item.value is None or item.value is Ellipsis):
            items.append(item)
            ellipses += item.value is Ellipsis
        elif isinstance(item, ConstantVariable) and type(item.value) is int:
            items.append(item)
            consumed += 1
        else:
            return None  # (a tensor, a list, a bool: advanced indexing, left to dynamo)
    rank = tensor.proxy.node.meta["example_value"].dim()
    if ellipses > 1 or consumed > rank:
        return None  # (eager raises: dynamo's own path raises the same error)
    dim = 0
    for item, original in zip(items, key.items):
        if isinstance(original, SymNodeVariable):
            symbols.append((dim, original))
        if isinstance(item, ConstantVariable) and item.value is Ellipsis:
            dim += rank - consumed
        elif not (isinstance(item, ConstantVariable) and type(item.value) is int):
            dim += 1  # (a slice, a symbol's full slice or a None each leave one dim in the result)
    return items, symbols


@correction(
    "symbolic_indexing",
    corrects="`cache[:, :, pos] = k` with a symbolic int pos specializes pos (a compile per position)",
    without="such indexing specializes the int, as with every backend (exact; a compile per value)",
)
def install() -> None:
    """Wrap the three places dynamo traces tensor indexing (`operator.getitem` inserted in the graph by
    `BuiltinVariable`, `TensorVariable.method___getitem__` and `method___setitem__`): indexing with symbolic ints
    in a tuple traces as full slices and `select`s, for dealias's compiles (module docstring)."""
    variables = require_module("torch._dynamo.variables")
    for name in ("BuiltinVariable", "ConstantVariable", "TupleVariable", "SliceVariable", "SymNodeVariable"):
        require(variables, name)
    BuiltinVariable, ConstantVariable, TupleVariable = (  # noqa: N806 - dynamo's class names
        variables.BuiltinVariable,
        variables.ConstantVariable,
        variables.TupleVariable,
    )
    TensorVariable = require(require_module("torch._dynamo.variables.tensor"), "TensorVariable")  # noqa: N806
    get = require(TensorVariable, "method___getitem__", "self", "tx")
    put = require(TensorVariable, "method___setitem__", "self", "tx", "key", "value")
    insert = require(BuiltinVariable, "_handle_insert_op_in_graph", "self", "tx", "args", "kwargs")
    sync = require(TensorVariable, "_sync_if_inplace_mutation", "self", "tx", "version_before")
    flag = "has_tensor_arg" in inspect.signature(sync).parameters  # (torch 2.13 has it; 2.14 always syncs)
    require(TensorVariable, "_get_fake_version", "self")

    def view(self: Any, tx: Any, key: Any) -> Any:
        """The view `self[key]` as full slices and selects, or None where dynamo's own indexing applies."""
        if type(self) is not TensorVariable or not applies("symbolic_indexing", tx):
            return None
        found = _symbolic_selects(self, key)
        if found is None:
            return None
        items, symbols = found
        result = get(self, tx, TupleVariable(items))
        for dim, symbol in reversed(symbols):  # (the last first: a select leaves the dims before it in place)
            result = result.call_method(tx, "select", [ConstantVariable.create(dim), symbol], {})
        return result

    @functools.wraps(get)
    def getitem(self: Any, tx: Any, *args: Any, **kwargs: Any) -> Any:
        result = view(self, tx, args[0]) if len(args) == 1 and not kwargs else None
        return get(self, tx, *args, **kwargs) if result is None else result

    @functools.wraps(put)
    def setitem(self: Any, tx: Any, key: Any, value: Any) -> Any:
        target = view(self, tx, key)
        if target is None:
            return put(self, tx, key, value)
        # Dynamo re-reads a written variable's attributes (requires_grad: `x[:, p] = v` with v requiring grad
        # makes x require grad) only on the variable it wrote, here the view: the tensor indexed is re-read too.
        version = self._get_fake_version()
        put(target, tx, ConstantVariable.create(Ellipsis), value)
        self._sync_if_inplace_mutation(tx, version, *((value.is_tensor(),) if flag else ()))
        return ConstantVariable.create(None)

    @functools.wraps(insert)
    def insert_op(self: Any, tx: Any, args: Any, kwargs: Any) -> Any:
        if self.fn is operator.getitem and len(args) == 2 and not kwargs:
            result = view(args[0], tx, args[1])
            if result is not None:
                return result
        return insert(self, tx, args, kwargs)

    replace_method(TensorVariable, "method___getitem__", get, getitem)
    replace_method(TensorVariable, "method___setitem__", put, setitem)
    BuiltinVariable._handle_insert_op_in_graph = insert_op
