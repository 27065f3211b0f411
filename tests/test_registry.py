"""The registries (ladbench.registry): the methods and the prompt variants refuse a name twice
and answer an unknown name with one line listing the names they know."""

import pytest

from ladbench.methods.registry import METHODS, method, register_method
from ladbench.registry import Registry
from ladbench.variants import VARIANTS, register_variant, variant


def test_a_registry_refuses_a_name_twice_and_lists_what_it_knows():
    shapes = Registry("shape", {"circle": 1})
    assert shapes.register("square", 2) == 2 and shapes.lookup("square") == 2
    with pytest.raises(ValueError, match=r"^shape 'square' is already registered$"):
        shapes.register("square", 3)
    assert shapes["square"] == 2                                         # the first entry stays
    with pytest.raises(ValueError, match=r"^unknown shape 'hexagon'; known: circle, square$"):
        shapes.lookup("hexagon")


def test_the_methods_and_the_variants_are_such_registries():
    with pytest.raises(ValueError, match=r"^method 'lad' is already registered$"):
        register_method("lad", METHODS["lad"])
    with pytest.raises(ValueError, match=r"^prompt variant 'vanilla' is already registered$"):
        register_variant(VARIANTS["vanilla"])
    with pytest.raises(ValueError, match=r"^unknown method 'nope'; known: vanilla, "):
        method("nope")
    with pytest.raises(ValueError, match=r"^unknown prompt variant 'nope'; known: vanilla, "):
        variant("nope")
