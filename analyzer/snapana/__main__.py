"""The command line's entry point, for `python -m snapana` and the `snapana` script alike:
a snapshot the command line names starts decoding first (in its bounded child,
`commands._early`), then the CLI (typer, rich and every command, 0.2 s of imports) is
imported and runs while it decodes. So this module imports nothing else at the top.

When the command is over, the process ends at once (`_end`): an interpreter's own exit
frees every object of a report one by one (0.3 s after a million-entry snapshot), where
the kernel takes the whole heap back in one go."""

import sys


def run() -> None:
    """Start reading the command line's one snapshot, run the CLI, end the process. Ctrl-C
    at any moment, imports included, ends it with status 130 and no traceback."""
    try:
        _lean_address_space()
        _one_blas_thread()
        _fewer_collections()
        import signal

        from snapana.children import end_children_on

        end_children_on(signal.SIGTERM, signal.SIGHUP)
        from snapana.commands._early import start_reading

        if sys.stdout is None:  # started with stdout closed: writing to it fails, said once
            sys.stdout = _Closed()
        start_reading(sys.argv[1:])
        from snapana.cli import main

        try:
            main()
        except SystemExit as exc:
            _end(exc.code)
    except KeyboardInterrupt:
        _end(130)
    _end(0)


def _lean_address_space() -> None:
    """Keep the allocators from reserving address space the analysis never uses, so that a
    job run under a virtual-memory limit (`ulimit -v`, a batch system's VSZ cap) refuses
    an input too large for it instead of aborting: pyarrow's default pool (mimalloc)
    reserves about 1 GiB on its first Parquet read, and glibc gives every thread that
    allocates (polars', pyarrow's) an arena of 64 MiB. Measured on `summary` of an export
    folder: 2.6 GB of address space before, 0.7 GB after, the same time. Both are the
    process's own settings, made before pyarrow is imported; a user's own choice stays."""
    import os

    from snapana.process_settings import default

    default("ARROW_DEFAULT_MEMORY_POOL", "system")
    if "MALLOC_ARENA_MAX" in os.environ:
        return
    try:
        import ctypes

        libc = ctypes.CDLL(None)
        libc.mallopt(M_ARENA_MAX, 2)
    except (OSError, AttributeError):  # not glibc: its allocator is its own
        pass


M_ARENA_MAX = -8  # glibc's malloc.h

#: OpenBLAS's setting of its thread count, read when numpy loads it.
BLAS_THREADS = "OPENBLAS_NUM_THREADS"


def _fewer_collections() -> None:
    """Let the cyclic garbage collector wait for 20,000 new objects, not 700: a report
    makes millions of small objects (imports, rule tables, the page's lists) and almost none
    of them is cyclic garbage, so the default's ~200 passes over the young objects found
    nothing to free and cost ~0.1 s of CPU on a million-entry snapshot (7 passes and ~0.05 s
    now). The process is short and ends at once (`_end`); what a cycle holds is freed a
    little later, not never."""
    import gc

    gc.set_threshold(20_000, 20, 20)


def _one_blas_thread() -> None:
    """numpy's OpenBLAS starts a thread per core when numpy is imported, and they spin a
    while: 60 ms of CPU on every run (measured: `python -c "import numpy"`, 0.12 s of CPU
    for 0.07 s of wall, 0.06 s with one thread). snapana does no floating-point linear
    algebra, so one thread; the user's own setting stays."""
    from snapana.process_settings import default

    default(BLAS_THREADS, "1")


def _end(code: object) -> None:
    """Exit with `code` as `SystemExit(code)` would, without tearing the heap down: the exit
    handlers run (a decode child no one took is ended) and the standard streams are
    flushed first. Outputs are whole already: each was written to a temporary file and
    renamed into place."""
    import atexit
    import os

    run_handlers = getattr(atexit, "_run_exitfuncs", None)
    if run_handlers is None:  # not CPython: the usual exit
        raise SystemExit(code)
    if code is None:
        status = 0
    elif isinstance(code, int):
        status = code & 0xFF
    else:  # SystemExit's own rule: anything else is printed, and the status is 1
        print(code, file=sys.stderr)
        status = 1
    run_handlers()
    try:  # what stdout still buffers: a full disk or a reader gone shows only now
        sys.stdout.flush()
    except (OSError, ValueError, AttributeError) as exc:
        if status == 0:
            why = getattr(exc, "strerror", None) or str(exc)
            print(f"snapana: error: could not write the output: {why}", file=sys.stderr)
            status = OUTPUT_ERROR
    try:
        sys.stderr.flush()
    except (OSError, ValueError, AttributeError):  # no one left to tell
        pass
    os._exit(status)


OUTPUT_ERROR = 4  # errors.OutputError.exit_code (not imported: this module imports nothing)


class _Closed:
    """Standard output when the process started with it closed: every write fails as the
    closed descriptor would (EBADF), so the command says so once and exits 4."""

    def write(self, text: str) -> int:
        raise OSError(9, "standard output is closed")

    def flush(self) -> None:
        pass

    def isatty(self) -> bool:
        return False

    def fileno(self) -> int:
        raise OSError(9, "standard output is closed")


if __name__ == "__main__":
    run()
