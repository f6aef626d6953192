"""Type aliases and the option sets that checks compare against."""

import re
import typing

import pytest

import keras_tpu_embed as kte
from keras_tpu_embed import types
from keras_tpu_embed.lookup import devices
from tests import testing


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
