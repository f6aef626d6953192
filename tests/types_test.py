"""Type aliases and the option sets that checks compare against."""

import ast
import pathlib
import re
import typing

import pytest

import keras_tpu_embed as kte
from keras_tpu_embed import types
from keras_tpu_embed.placement import devices
from tests import testing

PACKAGE = pathlib.Path(kte.__file__).parent


def test_option_sets_equal_their_literal_types():
    assert typing.get_args(types.Combiner) == types.SUPPORTED_COMBINERS
    assert typing.get_args(types.OutputMode) == types.SUPPORTED_OUTPUT_MODES
    assert typing.get_args(types.LookupDeviceName) == (
        devices.SUPPORTED_LOOKUP_DEVICES
    )


def test_every_combiner_is_accepted_and_others_name_the_set():
    for combiner in types.SUPPORTED_COMBINERS:
        assert testing.identity_column(combiner=combiner).combiner == combiner
    with pytest.raises(
        ValueError, match=re.escape(str(types.SUPPORTED_COMBINERS))
    ):
        testing.identity_column(combiner="max")


def test_every_output_mode_is_accepted_and_others_name_the_set():
    for mode in types.SUPPORTED_OUTPUT_MODES:
        layer = kte.TPUEmbeddingLayer([testing.identity_column()], output=mode)
        assert layer.output_mode == mode
    with pytest.raises(
        ValueError, match=re.escape(str(types.SUPPORTED_OUTPUT_MODES))
    ):
        kte.TPUEmbeddingLayer([testing.identity_column()], output="list")


# Parameters that name a domain object: their annotation says what it is
# (a class, or a named alias of `types.py` / `columns/embedding.py`), never
# a bare `Any`.
DOMAIN_NAMES = {
    "column",
    "columns",
    "table",
    "tables",
    "layer",
    "layers",
    "model",
    "spec",
    "engine",
    "lookup",
    "config",
    "feature",
    "layout",
    "initializer",
    "mid_level",
}
UNTYPED = {
    "Any",
    "Sequence[Any]",
    "list[Any]",
    "dict[str, Any]",
    "Any | None",
    "Sequence[Any] | None",
}


def _untyped_domain_names(path):
    relative = path.relative_to(PACKAGE).as_posix()
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            arguments = node.args
            named = [
                *arguments.posonlyargs,
                *arguments.args,
                *arguments.kwonlyargs,
            ]
        elif isinstance(node, ast.AnnAssign) and isinstance(
            node.target, ast.Name
        ):
            named = [ast.arg(arg=node.target.id, annotation=node.annotation)]
        else:
            continue
        for argument in named:
            if argument.arg not in DOMAIN_NAMES or argument.annotation is None:
                continue
            annotation = ast.unparse(argument.annotation)
            if annotation in UNTYPED:
                found.append(f"{relative}:{node.lineno} {argument.arg}")
    return found


def test_no_domain_parameter_is_typed_any():
    found = [
        entry
        for path in sorted(PACKAGE.rglob("*.py"))
        for entry in _untyped_domain_names(path)
    ]
    assert found == [], (
        f"Domain names typed Any: {found}. Give each the class it holds, "
        "or a named alias (types.TFFeatureColumn, types.LookupTable, "
        "types.KerasConfig, columns.embedding.EmbeddingColumnLike, ...)."
    )
