"""A structure-aware fuzzer for snapana's inputs (issue #14).

Layout:

- `mutators.py` — one mutator per input format: snapshot pickles (decoded safely, the tree
  mutated — types, extreme numbers, deep nesting, shared "billion laughs", hostile dict keys,
  missing/extra keys, unknown actions, long strings — and re-encoded with protocol 2-5, some
  gzip'd, some cut or bit-flipped), kineto traces and memory timelines (JSON trees and text:
  5,000-digit numbers, NaN/Infinity, deep arrays, whitespace runs, long strings, gzip), memray
  captures (byte flips and truncation), `snapana export` folders (marker JSON, Parquet tables);
  `generate(i, seed)` is case number i of a campaign, deterministic.
- `sidecars.py` — a valid snapshot with a corrupt or hostile `record` sidecar beside it
  (mutated fields and tensor records, broken text and bytes, a FIFO, a folder or a link in
  its place), run through summary, report, export, explain and diff.
- `ranks.py` — the multi-input path: a folder of ranks (valid, mutated, truncated, other
  formats, corrupt sidecars, things that are not files) as a folder, a file list or a glob,
  through summary, report (--rank) and batch, in-process and through the worker pool; an
  unexpected exception a rank reports counts as an internal error.
- `hostile.py` — hand-made hostile inputs per class of the issue (FIFO input, output = input,
  gzip bombs, memo abuse, ...).
- `bombs.py` — inputs whose bytes lie about their size (issue 43): export tables whose
  run-length, dictionary or compressed pages spell out to GiBs, memray sizes past int64.
- `environment.py` — what surrounds the input (issue 43): outputs the environment cannot
  take (/dev/full, a closed or ASCII stdout, a disk that fills), odd paths, modules planted
  beside the inputs, signals while snapana works; run by `process.py` as a process of its own.
- `texts.py` — text logs (issue 58): the OOM wordings, memory_summary(), nvidia-smi and vLLM
  as their writers print them, mutated where the readers' patterns look (runs of digits,
  spaces, dots and anchors up to a megabyte, figures of hundreds of digits, character
  references, prefixes, gzip); hostile `check` budgets (nested thousands deep, huge counts,
  not UTF-8, a FIFO); CI outputs (`--junit`, `$GITHUB_STEP_SUMMARY`) that are a FIFO, a
  device, a socket, a folder or a link to one.
- `pickle_codec.py` — safe seed decoding and an encoder for shapes pickle.dumps cannot write.
- `seeds.py` — seeds: sample_snapshots/, ../shared/corpus/ (read in place), synthetic ones.
- `worker.py` / `runner.py` — a persistent worker subprocess (snapana imported once; cases run
  through `snapana.cli.main` with fds 1/2 captured) under RLIMIT_AS, a per-case timeout and a
  restart when it dies; each outcome classified (refused, ok, traceback, internal, multiline,
  invariant, crash, hang, memory, overwrite, executed, orphan); `invariants.py` checks every
  JSON summary.
- `minimize.py` — delta reduction of a failing case; `campaign.py` — the loop, counts, saving.
- `corpus/` — minimised regression cases: `<class>-<n>.<ext>` (a raw input, replayed with
  `summary FILE -f json`) or `<class>-<n>.case.json` (files, setup and command).

Run: `python -m tests.fuzz --minutes 5 [--seed S] [--jobs 2] [--save] [-v]`;
`python -m tests.fuzz --replay` runs the corpus and the hostile cases.
tests/test_fuzz.py runs a deterministic slice and the corpus in CI.
"""
