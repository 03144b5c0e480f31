"""passes/class_names.py reads a test of a module's class name (``classname.find("Conv") != -1``
and its other spellings) as a predicate on the class name: the predicate must agree with what
Python computes for the test itself, on any name and any searched text."""

from __future__ import annotations

import libcst as cst
import pytest
from hypothesis import given
from hypothesis import strategies as st

from torch2jax.passes.class_names import class_name_test

FORMS = [
    'classname.find("{x}") != -1',
    'classname.find("{x}") == -1',
    'classname.find("{x}") >= 0',
    'classname.find("{x}") > -1',
    '"{x}" in classname',
    '"{x}" not in classname',
    'classname == "{x}"',
    '"{x}" != classname',
    'classname.startswith("{x}")',
    'classname.endswith("{x}")',
    'not classname.startswith("{x}")',
    '"{x}" in m.__class__.__name__',
    'type(m).__name__.find("{x}") != -1',
]

FUNCTION = "def f(m):\n    classname = m.__class__.__name__\n    if {test}:\n        pass\n"

names = st.text(alphabet="ConvBatchNorm2d", max_size=8)


@pytest.mark.parametrize("form", FORMS)
@given(name=names, x=st.text(alphabet="ConvBatchNorm2d", min_size=1, max_size=4))
def test_predicate_is_the_test(form: str, name: str, x: str) -> None:
    test = form.format(x=x)
    fn = cst.parse_module(FUNCTION.format(test=test)).body[0]
    found = class_name_test(fn.body.body[1].test, fn)
    assert found is not None and found[0] == "m"

    class Named:
        pass

    Named.__name__ = name
    m = Named()
    want = eval(test, {"classname": name, "m": m})
    assert found[1](name) == want


def test_other_tests_are_not_read():
    for test in ('classname.find("Conv") != 0', 'classname.lower() == "conv"',
                 'other.find("Conv") != -1', 'len(classname) > 3'):
        fn = cst.parse_module(FUNCTION.format(test=test)).body[0]
        assert class_name_test(fn.body.body[1].test, fn) is None, test
    # a name assigned twice is not known to hold the class name
    fn = cst.parse_module("def f(m):\n    classname = m.__class__.__name__\n"
                          "    classname = 'x'\n    if 'C' in classname:\n        pass\n").body[0]
    assert class_name_test(fn.body.body[2].test, fn) is None
