"""Quantized serving tables: the schemes, their bounds, and the exports."""

import os

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_tpu_embed as kte
from keras_tpu_embed.lookups import padded_host
from keras_tpu_embed.tables import quantization
from tests import serving_cases

QUANTIZED = ["bfloat16", "int8"]


def _random_table(rows=300, dim=16, seed=0):
    rng = np.random.default_rng(seed)
    scale = rng.uniform(0.01, 10.0, size=(rows, 1))
    return (rng.normal(size=(rows, dim)) * scale).astype(np.float32)


@pytest.mark.parametrize("table_dtype", QUANTIZED)
def test_rows_stay_within_the_stated_bound(table_dtype):
    table = _random_table()
    codes, scale_offset = quantization.quantize_rows(table, table_dtype, "t")
    served = np.asarray(quantization.dequantize_rows(codes, scale_offset))
    error = np.abs(served.astype(np.float64) - table)
    bound = quantization.error_bound(table, table_dtype)
    # Plus float32 rounding of the dequantization: a few ulps of |x|.
    assert np.all(error <= bound + 4 * np.finfo(np.float32).eps * np.abs(table))
    # The bound is tight, not vacuous: errors reach most of it.
    assert np.max(error / np.maximum(bound, 1e-30)) > 0.9


def test_int8_stores_one_byte_and_a_scale_and_offset_per_row():
    table = _random_table(rows=5, dim=7)
    codes, scale_offset = quantization.quantize_rows(table, "int8", "t")
    assert codes.dtype == np.uint8 and codes.shape == (5, 7)
    assert scale_offset.dtype == np.float32 and scale_offset.shape == (5, 2)
    np.testing.assert_allclose(scale_offset[:, 1], table.min(axis=1))
    np.testing.assert_allclose(
        scale_offset[:, 0], (table.max(axis=1) - table.min(axis=1)) / 255
    )
    assert codes.min(axis=1).tolist() == [0] * 5
    assert codes.max(axis=1).tolist() == [255] * 5


def test_constant_rows_are_exact():
    table = np.array([[0.25] * 4, [-3.0] * 4, [0.0] * 4], np.float32)
    codes, scale_offset = quantization.quantize_rows(table, "int8", "t")
    assert np.all(np.isfinite(scale_offset))
    np.testing.assert_array_equal(
        quantization.dequantize_rows(codes, scale_offset), table
    )


@pytest.mark.parametrize("table_dtype", QUANTIZED)
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_rows_are_refused_naming_the_table(table_dtype, bad):
    table = _random_table(rows=4, dim=3)
    table[2, 1] = bad
    with pytest.raises(ValueError, match=r"Table 'users'.*rows \[2\]"):
        quantization.quantize_rows(table, table_dtype, "users")


def _model(dimension=4, rows=50, max_norm=None):
    column = kte.embedding_column(
        kte.categorical_column_with_identity("item", rows),
        dimension,
        max_norm=max_norm,
        tensor_core_shape=[None, 3],
    )
    pre = kte.FeaturePreprocessor([column])
    inputs = pre.keras_inputs()
    layer = kte.TPUEmbeddingLayer([column], output="concat")
    model = keras.Model(inputs, layer(inputs))
    return pre, layer, model


@pytest.mark.parametrize("bad", ["int4", "float16", "INT8", None, 8])
def test_unknown_table_dtype_fails_before_writing(tmp_path, bad):
    pre, _, model = _model()
    path = tmp_path / "export"
    with pytest.raises(
        ValueError, match=r"table_dtype=.*'float32', 'bfloat16'"
    ):
        kte.export_saved_model(model, str(path), pre, table_dtype=bad)
    assert not path.exists()


def test_export_refuses_a_table_with_nan(tmp_path):
    pre, layer, model = _model()
    variable = layer.table_variable("item")
    values = variable.numpy()
    values[3, 0] = np.nan
    variable.assign(values)
    with pytest.raises(ValueError, match="Table 'item'"):
        kte.export_saved_model(
            model, str(tmp_path / "e"), pre, table_dtype="int8"
        )


def _saved_variables(path):
    reader = tf.train.load_checkpoint(
        os.path.join(path, "variables", "variables")
    )
    shapes = reader.get_variable_to_shape_map()
    dtypes = reader.get_variable_to_dtype_map()
    return [
        (dtypes[name].name, tuple(shape))
        for name, shape in shapes.items()
        if "VARIABLE_VALUE" in name
    ]


def _size(path):
    return sum(
        os.path.getsize(os.path.join(folder, name))
        for folder, _, names in os.walk(path)
        for name in names
    )


def test_quantized_export_holds_no_float32_table_and_is_small(tmp_path):
    pre, layer, model = _model(dimension=64, rows=100_000)
    table = layer.table_variable("item")
    before = table.numpy()
    sizes, saved = {}, {}
    for table_dtype in ["float32", "bfloat16", "int8"]:
        path = kte.export_saved_model(
            model, str(tmp_path / table_dtype), pre, table_dtype=table_dtype
        )
        sizes[table_dtype] = _size(path)
        saved[table_dtype] = _saved_variables(path)
    assert ("float32", (100_000, 64)) in saved["float32"]
    # Codes are stored packed in 8-byte words (`packed_words`).
    assert sorted(saved["bfloat16"]) == [("int64", (100_000, 16))]
    assert sorted(saved["int8"]) == [
        ("float32", (100_000, 2)),
        ("int64", (100_000, 8)),
    ]
    assert sizes["int8"] <= 0.3 * sizes["float32"]
    assert sizes["bfloat16"] <= 0.55 * sizes["float32"]
    # The model's own table: float32 and unchanged.
    assert table.dtype == tf.float32
    np.testing.assert_array_equal(table.numpy(), before)


def _entries(ids, weights):
    """Per entry of preprocessed ids: its example and its |weight|."""
    if isinstance(ids, tf.SparseTensor):
        rows = ids.indices[:, 0].numpy()
        values = np.ones(len(rows)) if weights is None else weights.values
        return rows, np.abs(np.asarray(values))
    ids = ids.numpy().reshape(ids.shape[0], -1)
    rows = np.nonzero(ids != -1)[0]
    if weights is None:
        return rows, np.ones(len(rows))
    return rows, np.abs(weights.numpy().reshape(ids.shape)[ids != -1])


def _combiner_factor(column, ids):
    """Largest sum of `|w|` over the combiner's normalizer among the
    examples (positions, for sequences) of the preprocessed `ids`: what
    multiplies a row's bound after the combiner (every entry counted,
    pruned or not: an upper bound)."""
    rows, weights = _entries(
        ids[column.feature_key],
        ids.get(column.weight_feature_key)
        if column.weight_feature_key
        else None,
    )
    if column.combiner == "mean" or len(rows) == 0:
        return 1.0
    if column.is_sequence:
        return float(weights.max()) if column.combiner == "sum" else 1.0
    if column.combiner == "sum":
        return float(np.bincount(rows, weights).max())
    return float(np.sqrt(np.bincount(rows).max()))


def test_quantized_exports_stay_within_bound_on_every_kind(tmp_path):
    """Each kind exported as float32, bfloat16 and int8; all served in one
    fresh process with TensorFlow only."""
    kinds = serving_cases.column_kinds(tmp_path)
    jobs, models = [], []
    for kind in serving_cases.KINDS:
        columns, features = kinds[kind]
        pre = kte.FeaturePreprocessor(columns)
        inputs = pre.keras_inputs()
        layer = kte.TPUEmbeddingLayer(
            columns,
            return_sequence_lengths=any(c.is_sequence for c in columns),
        )
        model = keras.Model(inputs, layer(inputs))
        models.append((kind, columns, pre(features), layer))
        for table_dtype in ["float32", *QUANTIZED]:
            path = kte.export_saved_model(
                model,
                str(tmp_path / kind / table_dtype),
                pre,
                table_dtype=table_dtype,
            )
            jobs.append((path, serving_cases.as_raw(features)))
    results = serving_cases.serve_many_in_fresh_process(jobs, tmp_path)
    worst = {name: 0.0 for name in QUANTIZED}
    for index, (kind, columns, ids, layer) in enumerate(models):
        reference, *quantized = results[3 * index : 3 * index + 3]
        for table_dtype, served in zip(QUANTIZED, quantized):
            assert sorted(served) == sorted(reference)
            for column in columns:
                table = layer.table_variable(column.table_name).numpy()
                bound = quantization.error_bound(table, table_dtype).max()
                bound *= _combiner_factor(column, ids)
                if column.max_norm is not None:
                    # Clipping is a projection: it does not grow the L2
                    # norm of the error, which an element's bound times
                    # sqrt(dim) bounds.
                    bound *= np.sqrt(table.shape[1])
                error = np.abs(served[column.name] - reference[column.name])
                assert error.max() <= bound * (1 + 1e-5) + 1e-7, (
                    kind,
                    table_dtype,
                    column.name,
                )
                worst[table_dtype] = max(worst[table_dtype], error.max())
            for name in set(reference) - {c.name for c in columns}:
                # Sequence lengths: exact.
                np.testing.assert_array_equal(served[name], reference[name])
    assert all(error > 0 for error in worst.values())


@pytest.mark.parametrize(
    "lookup_device", ["cpu", "cpu_sparse_branch", "tpu_tensor_core"]
)
def test_every_serving_path_dequantizes(tmp_path, monkeypatch, lookup_device):
    pre, layer, model = _model(dimension=8, max_norm=0.05)
    if lookup_device == "cpu_sparse_branch":
        monkeypatch.setattr(
            padded_host, "worth_padding", lambda *_: tf.constant(False)
        )
        lookup_device = "cpu"
    ids = tf.constant([[1, 2, -1], [3, 3, 49], [-1, -1, -1]], tf.int64)
    expected = None
    for table_dtype in ["float32", "int8"]:
        path = kte.export_saved_model(
            model,
            str(tmp_path / table_dtype),
            pre,
            lookup_device=lookup_device,
            table_dtype=table_dtype,
        )
        serve = tf.saved_model.load(path).signatures["serving_default"]
        out = next(iter(serve(item=ids).values())).numpy()
        if expected is None:
            expected = out
    table = layer.table_variable("item").numpy()
    bound = quantization.error_bound(table, "int8").max() * np.sqrt(8)
    error = np.abs(out - expected)
    assert 0 < error.max() <= bound * (1 + 1e-5)


def test_quantization_error_per_table():
    pre, layer, model = _model(dimension=8)
    table = layer.table_variable("item").numpy()
    errors = kte.quantization_error(model, "int8")
    assert list(errors) == ["item"]
    assert (
        0
        < errors["item"]
        <= quantization.error_bound(table, "int8").max() * (1 + 1e-5)
    )
    assert kte.quantization_error(model, "float32") == {"item": 0.0}
    with pytest.raises(ValueError, match="table_dtype='int4'"):
        kte.quantization_error(model, "int4")


@pytest.mark.parametrize("table_dtype", ["int8", "bfloat16"])
@pytest.mark.parametrize("dimension", [7, 6, 64])
def test_packed_codes_gather_the_same_rows(table_dtype, dimension):
    # 7 int8 codes fill no word (kept as bytes); 6 bfloat16 values fill
    # three int32 words; 64 fill int64 words: every layout serves the rows
    # `dequantize_rows` gives from the unpacked codes.
    rng = np.random.default_rng(dimension)
    table = rng.standard_normal((50, dimension)).astype(np.float32)
    quantized = quantization.QuantizedTable(table, table_dtype, "t")
    assert tuple(quantized.shape) == (50, dimension)
    ids = tf.constant([[3, 0], [49, 3]], tf.int64)
    codes, scale_offset = quantization.quantize_rows(table, table_dtype, "t")
    expected = np.asarray(quantization.dequantize_rows(codes, scale_offset))
    np.testing.assert_array_equal(
        quantized.gather(ids).numpy(), expected[ids.numpy()]
    )
    # XLA fuses `code * scale + offset` into one rounding (FMA): ulps apart.
    compiled = tf.function(quantized.gather, jit_compile=True)
    np.testing.assert_allclose(
        compiled(ids).numpy(), expected[ids.numpy()], rtol=0, atol=1e-6
    )


def test_bfloat16_export_refuses_values_that_round_to_inf(tmp_path):
    pre, layer, model = _model()
    variable = layer.table_variable("item")
    values = variable.numpy()
    # Finite in float32, but rounds up past bfloat16's largest value.
    values[7, 2] = np.finfo(np.float32).max
    variable.assign(values)
    with pytest.raises(ValueError, match=r"Table 'item'.*rows \[7\].*bfloat16"):
        quantization.quantize_rows(values, "bfloat16", "item")
    with pytest.raises(ValueError, match=r"Table 'item'.*rows \[7\]"):
        kte.export_saved_model(
            model, str(tmp_path / "b"), pre, table_dtype="bfloat16"
        )
    with pytest.raises(ValueError, match=r"Table 'item'.*rows \[7\]"):
        kte.quantization_error(model, "bfloat16")


@pytest.mark.parametrize(
    "lookup_device", ["cpu", "cpu_sparse_branch", "tpu_tensor_core"]
)
def test_int8_export_refuses_rows_whose_spread_overflows(
    tmp_path, monkeypatch, lookup_device
):
    pre, layer, model = _model()
    if lookup_device == "cpu_sparse_branch":
        monkeypatch.setattr(
            padded_host, "worth_padding", lambda *_: tf.constant(False)
        )
        lookup_device = "cpu"
    variable = layer.table_variable("item")
    values = variable.numpy()
    big = np.finfo(np.float32).max
    values[5] = [-big, big, 0.0, 1.0]
    variable.assign(values)
    with pytest.raises(ValueError, match=r"Table 'item'.*rows \[5\].*int8"):
        kte.export_saved_model(
            model,
            str(tmp_path / "i"),
            pre,
            lookup_device=lookup_device,
            table_dtype="int8",
        )


def test_int8_table_dtype_survives_a_resave(tmp_path):
    pre, _, model = _model()
    path = kte.export_saved_model(
        model, str(tmp_path / "int8"), pre, table_dtype="int8"
    )
    loaded = tf.saved_model.load(path)
    again = str(tmp_path / "again")
    tf.saved_model.save(loaded, again, signatures=loaded.signatures)
    assert kte.load_saved_model(again, verify=False).table_dtype == "int8"
    assert kte.load_saved_model(path).table_dtype == "int8"


@pytest.mark.parametrize("max_norm", [np.inf, float("inf")])
def test_infinite_max_norm_is_refused(max_norm):
    with pytest.raises(ValueError, match=r"max_norm.*finite.*None"):
        kte.embedding_column(
            kte.categorical_column_with_identity("item", 5),
            2,
            max_norm=max_norm,
        )


@pytest.mark.parametrize(
    "lookup_device", ["cpu", "cpu_sparse_branch", "tpu_tensor_core"]
)
def test_huge_max_norm_leaves_rows_unclipped(
    tmp_path, monkeypatch, lookup_device
):
    pre, layer, model = _model(max_norm=1e37)
    if lookup_device == "cpu_sparse_branch":
        monkeypatch.setattr(
            padded_host, "worth_padding", lambda *_: tf.constant(False)
        )
        lookup_device = "cpu"
    variable = layer.table_variable("item")
    values = np.full(variable.shape, 100.0, np.float32)
    values[3] = 1e15
    variable.assign(values)
    ids = tf.constant([[1, 3, -1], [2, -1, -1]], tf.int64)
    path = kte.export_saved_model(
        model, str(tmp_path / "e"), pre, lookup_device=lookup_device
    )
    served = next(
        iter(
            tf.saved_model.load(path)
            .signatures["serving_default"](item=ids)
            .values()
        )
    ).numpy()
    # "mean": row 0 averages ids 1 and 3, row 1 is id 2; no row's norm
    # (at most 2e15) reaches 1e37.
    expected = np.stack([(values[1] + values[3]) / 2, values[2]])
    np.testing.assert_allclose(served, expected, rtol=1e-6)
    np.testing.assert_allclose(
        layer({"item": ids}).numpy(),
        expected,
        rtol=1e-6,
    )


def _whole_table_reference(values, table_dtype):
    """`quantize_rows` as it was before it worked in row chunks: the whole
    table at once, int8 in float64. The chunked version must give these
    bits exactly."""
    values = np.asarray(values, np.float32)
    if table_dtype == "bfloat16":
        return tf.cast(values, tf.bfloat16).numpy(), None
    wide = values.astype(np.float64)
    low = wide.min(axis=1, keepdims=True)
    spread = wide.max(axis=1, keepdims=True) - low
    scale = spread / 255
    safe = np.where(scale > 0, scale, 1.0)
    codes = np.clip(np.rint((wide - low) / safe), 0, 255)
    scale_offset = np.concatenate([scale, low], axis=1).astype(np.float32)
    return codes.astype(np.uint8), scale_offset


def _edge_table(rows=1003, dim=13):
    table = _random_table(rows=rows, dim=dim, seed=7)
    table[0] = 0.5  # a constant row (scale 0) at the first row
    table[-1] = -2.0  # and at the last
    table[1, 3] = 1e30  # a huge spread, still finite when dequantized
    table[-2] = np.float32(1e-38) * np.arange(dim)  # subnormal steps
    table[500, :] = np.linspace(-1, 1, dim)  # codes at exactly .5 levels
    return table


def _bits(array):
    array = np.ascontiguousarray(array)
    return array.view(np.dtype(f"u{array.dtype.itemsize}"))


@pytest.mark.parametrize("table_dtype", QUANTIZED)
@pytest.mark.parametrize("chunk_bytes", [1, 8 * 13 * 64, 8 * 13 * 1002])
def test_chunked_quantization_is_bit_identical_to_the_whole_table(
    monkeypatch, table_dtype, chunk_bytes
):
    # 1 byte: one row per chunk; 64 rows: 16 chunks and a partial last one
    # (1003 = 15 * 64 + 43); 1002 rows: a last chunk of one row.
    monkeypatch.setattr(quantization, "_CHUNK_BYTES", chunk_bytes)
    monkeypatch.setattr(quantization, "_MIN_CHUNKS", 1)
    table = _edge_table()
    rows = quantization.chunk_rows(*table.shape)
    assert rows == max(1, min(chunk_bytes // (8 * 13), 1003))
    codes, scale_offset = quantization.quantize_rows(table, table_dtype, "t")
    expected_codes, expected_scale_offset = _whole_table_reference(
        table, table_dtype
    )
    assert codes.dtype == expected_codes.dtype
    np.testing.assert_array_equal(_bits(codes), _bits(expected_codes))
    if table_dtype == "int8":
        np.testing.assert_array_equal(
            _bits(scale_offset), _bits(expected_scale_offset)
        )
    else:
        assert scale_offset is None


@pytest.mark.parametrize("table_dtype", QUANTIZED)
def test_chunks_read_from_a_variable_give_the_same_bits(
    monkeypatch, table_dtype
):
    # The export passes the table variable itself, so that only a chunk of
    # it is ever copied to host memory at once.
    monkeypatch.setattr(quantization, "_CHUNK_BYTES", 8 * 13 * 100)
    table = _edge_table()
    from_variable = quantization.quantize_rows(
        tf.Variable(table), table_dtype, "t"
    )
    expected = _whole_table_reference(table, table_dtype)
    for got, want in zip(from_variable, expected):
        if want is None:
            assert got is None
        else:
            np.testing.assert_array_equal(_bits(got), _bits(want))


@pytest.mark.parametrize("table_dtype", QUANTIZED)
def test_errors_name_the_bad_rows_of_every_chunk(monkeypatch, table_dtype):
    monkeypatch.setattr(quantization, "_CHUNK_BYTES", 8 * 3 * 4)
    table = _random_table(rows=20, dim=3)
    table[[2, 9, 19], 1] = np.inf  # in the first, third and last chunk
    with pytest.raises(ValueError, match=r"Table 'users'.*rows \[2, 9, 19\]"):
        quantization.quantize_rows(table, table_dtype, "users")


def test_int8_overflow_rows_of_every_chunk_are_named(monkeypatch):
    monkeypatch.setattr(quantization, "_CHUNK_BYTES", 8 * 3 * 4)
    table = _random_table(rows=20, dim=3)
    big = np.finfo(np.float32).max
    table[[0, 19]] = [-big / 2, 0.0, big / 2]
    with pytest.raises(ValueError, match=r"rows \[0, 19\] with a spread"):
        quantization.quantize_rows(table, "int8", "t")


def test_int8_quantization_peak_allocation_stays_under_the_table():
    # The export's budget is 1.25x one table for everything it adds; the
    # quantize step, outputs included (a quarter of the table and 8 bytes
    # a row), must stay well under one table. numpy reports every array it
    # allocates to tracemalloc, so this peak is exact, not a timing.
    import tracemalloc

    table = _random_table(rows=40_000, dim=64)
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        codes, scale_offset = quantization.quantize_rows(table, "int8", "t")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert codes.shape == (40_000, 64)
    assert peak <= 0.75 * table.nbytes, (peak, table.nbytes)
