"""The tables the notebook API returns: polars DataFrames in every way but their plain form,
which stays a few rows under 1 KB however wide or long the table (issue 46)."""

from __future__ import annotations

import pickle

import polars as pl
import pytest
from snapana.render.notebook_table import PLAIN_LIMIT, Table, plain_text, table

from .conftest import SAMPLES


def _wide(rows: int) -> pl.DataFrame:
    return pl.DataFrame({f"column_{i}": [f"{'x' * 80}{r}" for r in range(rows)]
                         for i in range(30)})


@pytest.mark.parametrize("rows", [0, 1, 7, 100_000])
def test_plain_form_is_short_and_names_the_shape(rows: int) -> None:
    t = table(_wide(rows))
    text = repr(t)
    assert len(text.encode()) < PLAIN_LIMIT
    assert text.startswith(f"{rows:,} row")
    assert "30 columns" in text.splitlines()[0]
    assert text == plain_text(t)


def test_a_table_is_the_polars_frame_it_wraps() -> None:
    df = pl.DataFrame({"family": ["a", "b", "c"], "bytes": [3, 1, 2]})
    t = table(df)
    assert isinstance(t, pl.DataFrame) and t.equals(df)
    assert str(t) == str(df)  # print() is polars' own table
    assert t._repr_html_() == df._repr_html_()
    assert t.to_pandas()["bytes"].tolist() == [3, 1, 2]
    assert table(t) is t


def test_chained_methods_keep_the_short_form() -> None:
    t = table(_wide(50))
    for derived in (t.filter(pl.col("column_0").str.ends_with("1")), t.sort("column_1"),
                    t.head(3), t.select("column_2"), t.with_columns(n=pl.lit(1))):
        assert isinstance(derived, Table)
        assert len(repr(derived).encode()) < PLAIN_LIMIT
    assert isinstance(pickle.loads(pickle.dumps(t)), pl.DataFrame)


def test_api_tables_are_short() -> None:
    import snapana

    a = snapana.load(SAMPLES / "slime-tp2-chunked-logprob-oom.pickle")
    for name in ("blocks", "events", "segments", "frames", "stacks", "families", "sites",
                 "timeline"):
        frame = getattr(a, name)
        assert isinstance(frame, Table), name
        assert len(repr(frame).encode()) < PLAIN_LIMIT, name
        assert repr(frame).startswith(f"{frame.height:,} row"), name
    state = a.at(moment="peak")
    assert isinstance(state.blocks, Table) and len(repr(state)) < 200
