"""Is data read from a file shaped as its reader needs? One sentence when it is not.

Child et al., 2019, section 6 resumes week-long runs from checkpoints, and section 7's
results are drawn from cached JSON: both are files, which can be damaged, come from
another version, or be crafted. A reader states what it needs as a *shape* and calls
``check(value, shape, where)`` before it uses anything; the first thing that does not
fit raises ``ShapeError`` (a ValueError) naming the place (``['runs']['text/full']['0']
['test_bits']``), what was found and what was expected. Nothing is built from a value
before its shape passed.

Shapes, written as plain Python where they can be:

* ``int``, ``float``, ``str``, ``bool``, ``None`` -- a value of that kind (a bool is
  never a number; an int is a float; ``float`` may be NaN, ``Number`` says more);
* ``{"key": shape, ...}`` -- a dict holding at least these keys (``Optional(shape)``:
  the key may be absent); ``Exact({...})``: these keys and no others;
* ``[shape]`` -- a list (or tuple) of any length, each item of the shape;
  ``List(shape, length)``: of that length; ``Tuple(a, b, ...)``: item by item;
* ``Map(shape, key=str)`` -- a dict of any keys of type ``key``, each value of the shape;
* ``Int(lo, hi)``, ``Number(lo, hi)`` (finite), ``Tensor(shape, dtype)``, ``OneOf(a, b)``.
"""

from __future__ import annotations

import math
import numbers

import torch


class ShapeError(ValueError):
    """A value that is not shaped as its reader needs (says where, what, what was expected)."""


def _found(value) -> str:
    if isinstance(value, torch.Tensor):
        return f"a {value.dtype} tensor of shape {tuple(value.shape)}"
    if isinstance(value, (bool, int, float)) or value is None:
        return repr(value)
    if isinstance(value, str):
        return repr(value) if len(value) <= 40 else "a text"
    return f"a {type(value).__name__}"


class Shape:
    """A shape that is not plain Python: ``fits(value, where)`` raises ShapeError."""

    def fits(self, value, where: str) -> None:
        raise NotImplementedError

    def __str__(self) -> str:
        return "a value"


class Optional(Shape):
    def __init__(self, shape):
        self.shape = shape

    def fits(self, value, where):
        check(value, self.shape, where)

    def __str__(self):
        return describe(self.shape)


class Int(Shape):
    def __init__(self, lo=None, hi=None):
        self.lo, self.hi = lo, hi

    def fits(self, value, where):
        ok = isinstance(value, int) and not isinstance(value, bool)
        if not ok or (self.lo is not None and value < self.lo) or (
                self.hi is not None and value > self.hi):
            _fail(where, value, self)

    def __str__(self):
        if self.lo is not None and self.lo == self.hi:
            return f"the integer {self.lo}"
        return (f"an integer in [{'-inf' if self.lo is None else self.lo}, "
                f"{'inf' if self.hi is None else self.hi}]")


class Number(Shape):
    def __init__(self, lo=None, hi=None):
        self.lo, self.hi = lo, hi

    def fits(self, value, where):
        ok = (isinstance(value, numbers.Real) and not isinstance(value, bool)
              and math.isfinite(value))
        if not ok or (self.lo is not None and value < self.lo) or (
                self.hi is not None and value > self.hi):
            _fail(where, value, self)

    def __str__(self):
        bounds = [f">= {self.lo}" if self.lo is not None else "",
                  f"<= {self.hi}" if self.hi is not None else ""]
        return " ".join(["a finite number", " and ".join(b for b in bounds if b)]).strip()


class Exact(Shape):
    def __init__(self, fields: dict):
        self.fields = fields

    def fits(self, value, where):
        check(value, self.fields, where)
        extra = sorted(map(str, set(value) - set(self.fields)))
        if extra:
            raise ShapeError(f"{where or 'the value'} holds {extra}, which is unknown here; "
                             f"allowed: the keys {sorted(self.fields)}")

    def __str__(self):
        return f"a dict of exactly the keys {sorted(self.fields)}"


class List(Shape):
    def __init__(self, shape, length: int | None = None):
        self.shape, self.length = shape, length

    def fits(self, value, where):
        if not isinstance(value, (list, tuple)) or (
                self.length is not None and len(value) != self.length):
            _fail(where, value, self)
        for i, item in enumerate(value):
            check(item, self.shape, f"{where}[{i}]")

    def __str__(self):
        n = f" of {self.length} items" if self.length is not None else ""
        return f"a list{n}, each {describe(self.shape)}"


class Tuple(Shape):
    def __init__(self, *shapes):
        self.shapes = shapes

    def fits(self, value, where):
        if not isinstance(value, (list, tuple)) or len(value) != len(self.shapes):
            _fail(where, value, self)
        for i, (item, shape) in enumerate(zip(value, self.shapes)):
            check(item, shape, f"{where}[{i}]")

    def __str__(self):
        return f"a sequence of {len(self.shapes)}: " + ", ".join(map(describe, self.shapes))


class Map(Shape):
    def __init__(self, shape, key=str):
        self.shape, self.key = shape, key

    def fits(self, value, where):
        if not isinstance(value, dict):
            _fail(where, value, self)
        for k, item in value.items():
            if not isinstance(k, self.key) or isinstance(k, bool):
                raise ShapeError(f"{where or 'the value'} has the key {k!r}; allowed: keys "
                                 f"of type {self.key.__name__}")
            check(item, self.shape, f"{where}[{k!r}]")

    def __str__(self):
        return f"a dict of {describe(self.shape)}"


class Tensor(Shape):
    def __init__(self, shape: tuple | None = None, dtype=None):
        self.shape, self.dtype = shape, dtype

    def fits(self, value, where):
        if (not isinstance(value, torch.Tensor)
                or (self.shape is not None and tuple(value.shape) != tuple(self.shape))
                or (self.dtype is not None and value.dtype != self.dtype)):
            _fail(where, value, self)

    def __str__(self):
        return " ".join(["a", str(self.dtype or ""), "tensor",
                         f"of shape {tuple(self.shape)}" if self.shape is not None else ""]
                        ).replace("  ", " ").strip()


class OneOf(Shape):
    def __init__(self, *shapes):
        self.shapes = shapes

    def fits(self, value, where):
        for shape in self.shapes:
            try:
                check(value, shape, where)
                return
            except ShapeError:
                continue
        _fail(where, value, self)

    def __str__(self):
        return " or ".join(map(describe, self.shapes))


PLAIN = {int: "an integer", float: "a number", str: "a text", bool: "true or false",
         None: "nothing (None)"}


def describe(shape) -> str:
    """A shape in words."""
    if isinstance(shape, Shape):
        return str(shape)
    if isinstance(shape, dict):
        return f"a dict with the keys {sorted(map(str, shape))}"
    if isinstance(shape, list):
        return str(List(shape[0]))
    return PLAIN.get(shape, f"a {getattr(shape, '__name__', shape)}")


def _fail(where: str, value, shape) -> None:
    raise ShapeError(f"{where or 'the value'} is {_found(value)}; expected {describe(shape)}")


def check(value, shape, where: str = "") -> None:
    """Raise ShapeError unless ``value`` has ``shape`` (the module docstring's forms)."""
    if isinstance(shape, Shape):
        shape.fits(value, where)
    elif isinstance(shape, dict):
        if not isinstance(value, dict):
            _fail(where, value, shape)
        for key, inner in shape.items():
            if key not in value:
                if isinstance(inner, Optional):
                    continue
                raise ShapeError(f"{where or 'the value'} has no {key!r}; expected "
                                 f"{describe(shape)}")
            check(value[key], inner, f"{where}[{key!r}]")
    elif isinstance(shape, list):
        List(shape[0]).fits(value, where)
    elif shape is None:
        if value is not None:
            _fail(where, value, shape)
    elif shape is float:
        if not isinstance(value, numbers.Real) or isinstance(value, bool):
            _fail(where, value, shape)
    elif shape is int:
        if not isinstance(value, int) or isinstance(value, bool):
            _fail(where, value, shape)
    elif not isinstance(value, shape):
        _fail(where, value, shape)
