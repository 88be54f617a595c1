"""The plain form of the tables the notebook API returns: a polars DataFrame whose text is a
few lines, not polars' full-width table.

A notebook saves every output's text/plain beside its HTML, and a terminal IPython prints
it: polars' own text of a 22-column table is 2–4 KB whatever its height. `Table` is a
polars DataFrame in every other way (`isinstance(x, pl.DataFrame)`, `.to_pandas()`, its
HTML, `print(x)` for polars' own table); the frame-returning methods a notebook chains
(`filter`, `sort`, `head`, ...) keep the short form.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, cast

import polars as pl

from snapana.units import plural

#: The most bytes a table's plain form takes (a notebook keeps it beside the HTML).
PLAIN_LIMIT = 1000
#: Rows shown at most (polars shows head and tail around an ellipsis row).
ROWS = 6
#: Columns shown at most (polars elides the middle ones).
COLUMNS = 5
#: Characters of a string cell before polars cuts it with "...".
CELL_CHARS = 16
#: Characters of the heading's column list.
HEADING_CHARS = 60

#: DataFrame methods returning a DataFrame a notebook user chains on what snapana returned.
CHAINED = ("filter", "sort", "head", "tail", "select", "with_columns", "drop", "unique",
           "top_k", "bottom_k", "slice", "sample", "rename", "join", "limit")


class Table(pl.DataFrame):
    """A polars DataFrame with a short plain form (see the module docstring)."""

    def __repr__(self) -> str:
        return plain_text(self)


def table(frame: pl.DataFrame) -> Table:
    """`frame` as a `Table`, sharing its data (no copy)."""
    if isinstance(frame, Table):
        return frame
    return cast(Table, Table._from_pydf(frame._df))  # polars builds `cls`, the subclass


def plain_text(frame: pl.DataFrame) -> str:
    """A heading (rows × columns: names) and polars' table cut to a few rows and columns,
    under `PLAIN_LIMIT` bytes."""
    names = ", ".join(frame.columns)
    if len(names) > HEADING_CHARS:
        names = names[:HEADING_CHARS - 3] + "..."
    heading = (f"{plural(frame.height, 'row')} × {plural(frame.width, 'column')} "
               f"(print() for polars' table): {names}")
    for rows in range(ROWS, 0, -2):
        with pl.Config(tbl_rows=rows, tbl_cols=COLUMNS, fmt_str_lengths=CELL_CHARS,
                       tbl_width_chars=COLUMNS * (CELL_CHARS + 8),
                       tbl_hide_column_data_types=True, tbl_hide_dataframe_shape=True,
                       tbl_formatting="ASCII_MARKDOWN", fmt_table_cell_list_len=3):
            text = f"{heading}\n{pl.DataFrame.__str__(frame)}"
        if len(text.encode()) < PLAIN_LIMIT:
            return text
    return heading


def _keeping_short_form(method: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(method)
    def chained(self: Table, *args: Any, **kwargs: Any) -> Any:
        out = method(self, *args, **kwargs)
        return table(out) if isinstance(out, pl.DataFrame) else out
    return chained


for _name in CHAINED:
    setattr(Table, _name, _keeping_short_form(getattr(pl.DataFrame, _name)))
