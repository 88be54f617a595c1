"""`snapana batch`: a whole incident directory as a partitioned Parquet dataset."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from snapana.commands import _policy as policy
from snapana.commands._options import CapacityOpt, Engine, EngineOpt, FilesArg, RulesOpt, WorkersOpt


def batch(
    files: FilesArg,
    output: Annotated[Path, typer.Option("-o", "--output", metavar="DIR",
                                         help="dataset folder to write")],
    job: Annotated[str | None, typer.Option("--job", metavar="NAME",
                                            help="job name (default: folder)")] = None,
    engine: EngineOpt = Engine.local,
    workers: WorkersOpt = None,
    rules: RulesOpt = None,
    capacity: CapacityOpt = None,
) -> None:
    """Summarise a whole incident directory into a partitioned Parquet dataset
    (ranks/ and families/, one partition per job and rank); --engine dask|ray for clusters."""
    from snapana.io import rank_dataset

    ins = policy.inputs(files, texts=False, every_rank=True)
    policy.output_folder(output, ins.files)
    ruleset, cap = policy.check_rules(rules, capacity)
    multi, run = policy.analyse_many(ins.ranks, workers, rules, ruleset, cap, engine.value,
                                     findings=True)  # each rank's verdict is worded
    name = job or next((i.path.parent.name for i in ins.ranks if i.path is not None), "job")
    rank_dataset.write(multi, output, name, policy.verdicts(run))
    policy.none_analysed(multi, written=output)
    policy.wrote(output, detail=f" ({len(multi.ranks)} inputs, {len(multi.ok)} analysed)")
