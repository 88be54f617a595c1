"""What a command line names, resolved once, before any analysis: files, `-` (a paste on
standard input), folders, globs, `--log`, `--trace`, `--memray` and `--at` become one typed
list of inputs. Each input has its path, its kind (`capture_kinds`, by content: sniffed
here, once), its role (the capture shown, a capture read beside it, a log, one rank of
many), its sidecar and the rank its file name carries; beside them, a line for each file of
a named folder that is not read, with why. The commands, the rank runner and the output's
refusal of an input all read this list: nothing later sniffs, expands or looks for a
sidecar again.

It stands low (kinds, sources, errors, units), so the rank runner below the session reads
it without an import running back up."""

from __future__ import annotations

import glob
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from enum import Enum
from pathlib import Path

from snapana.capture_kinds import CaptureKind
from snapana.errors import InputError
from snapana.units import inert

#: File names a folder's snapshots carry (a folder's other files are told apart by content).
SNAPSHOT_SUFFIXES = (".pickle", ".pkl", ".pickle.gz", ".pkl.gz", ".pt", ".snapshot")
#: How ranks are spelled in snapshot file names (Megatron-Bridge `snapshot_oom_rank-3`,
#: `oom_rank3`, `rank_3`, `r3`), tried in order.
RANK_PATTERNS = (r"rank[-_]?(\d+)", r"(?:^|[-_.])r(\d+)(?:[-_.]|$)", r"(?:^|[-_.])(\d+)\.pickle")


def rank_of(path: Path) -> int | None:
    """The rank a file's name carries (rank3.log, snapshot_oom_rank-3.pickle), if any."""
    name = path.name.lower()
    for pattern in RANK_PATTERNS:
        m = re.search(pattern, name)
        if m:
            return int(m.group(1))
    return None


class Role(str, Enum):
    """What a command does with an input."""

    #: the one capture shown in full
    SHOWN = "shown"
    #: a capture of the same job read beside the one shown (--trace, --memray, --calibrate,
    #: a folder's other captures)
    BESIDE = "beside"
    #: a text log: read alone for its OOM messages, or checked against the capture's figures
    LOG = "log"
    #: one input of many: a row of the rank table
    RANK = "rank"


@dataclass(frozen=True)
class Input:
    """One input, resolved. Small and picklable: the rank runner's workers receive it."""

    #: None: standard input (`-`)
    path: Path | None
    #: what its content says it is; None when it could not be told (`problem` says why)
    kind: CaptureKind | None
    role: Role
    #: the sidecar `snapana record` wrote beside it
    sidecar: Path | None = None
    #: the rank its file name carries
    rank: int | None = None
    #: the one line that refuses it (missing, empty, unrecognised), said where it is read
    problem: str | None = None

    @property
    def name(self) -> str:
        return "<stdin>" if self.path is None else self.path.name

    def known_kind(self) -> CaptureKind:
        """Its kind, or the line that refuses it (an `InputError`)."""
        if self.kind is None:
            raise InputError(self.problem or f"{self.path}: unrecognised format")
        return self.kind


@dataclass(frozen=True)
class Inputs:
    """The command line, resolved: the inputs in the order named, the lines for the files of
    named folders that are not read, and the folders named (an output inside a folder of
    logs is refused, as before). A file named is read (`--log` beside logs alone is one
    more log) or refused (`--trace` beside several inputs): never passed over unread."""

    items: tuple[Input, ...]
    skipped: tuple[str, ...] = ()
    folders: tuple[Path, ...] = field(default=(), repr=False)

    def of(self, role: Role) -> list[Input]:
        return [i for i in self.items if i.role is role]

    @property
    def single(self) -> Input | None:
        """The one capture shown in full, when the command line comes to one."""
        shown = self.of(Role.SHOWN)
        return shown[0] if len(shown) == 1 else None

    @property
    def ranks(self) -> list[Input]:
        return self.of(Role.RANK)

    @property
    def beside(self) -> list[Input]:
        return self.of(Role.BESIDE)

    @property
    def logs(self) -> list[Input]:
        return self.of(Role.LOG)

    @property
    def text_only(self) -> bool:
        """Text alone: logs, or a paste on standard input, and no capture."""
        return bool(self.items) and all(i.role is Role.LOG for i in self.items)

    @property
    def files(self) -> list[Path]:
        """Every file (and folder of logs) the command line names: what an output may not
        be."""
        return [*(p for i in self.items for p in (i.path, i.sidecar) if p is not None),
                *self.folders]

    @property
    def title(self) -> str:
        if self.single is not None:
            return self.single.name
        if self.text_only:
            return self.items[0].name if len(self.items) == 1 else f"{len(self.items)} logs"
        return f"{len(self.ranks)} inputs"

    def as_ranks(self, at: str | None = None) -> Inputs:
        """Logs named one by one that say nothing about memory, taken as the inputs of a
        rank table after all: each one's reason is then its row's."""
        _at_one(at, None)
        return replace(self, items=tuple(replace(i, role=Role.RANK) for i in self.items),
                       folders=())


class _Seen:
    """What resolving has looked at, each once: a path's kind (`sources.sniff`, or the line
    that refuses it) and a glob's matches."""

    def __init__(self) -> None:
        self._seen: dict[Path, CaptureKind | InputError] = {}
        self._globbed: dict[str, list[Path]] = {}

    def matches(self, pattern: str) -> list[Path]:
        """The files a glob matches, in a stable order."""
        if pattern not in self._globbed:
            self._globbed[pattern] = sorted(Path(m) for m in glob.glob(pattern))
        return self._globbed[pattern]

    def __call__(self, path: Path) -> CaptureKind | InputError:
        if path not in self._seen:
            from snapana.sources import sniff

            try:
                self._seen[path] = sniff(path)
            except InputError as exc:
                self._seen[path] = exc
        return self._seen[path]

    def kind(self, path: Path) -> CaptureKind:
        """The kind, or the refusal raised."""
        told = self(path)
        if isinstance(told, InputError):
            raise told
        return told

    def is_text(self, path: Path) -> bool:
        """A log (empty or unreadable: not a log to read)."""
        told = self(path)
        return not isinstance(told, InputError) and not told.row.yields_capture

    def is_rank(self, path: Path) -> bool:
        """A capture a folder's rank table takes (a snapshot, whatever its name)."""
        told = self(path)
        return not isinstance(told, InputError) and told.row.rank_input

    def says_nothing(self, path: Path) -> bool:
        """A text file with no OOM message, memory table or refusal in it (notes, a
        readme): read once, as a log is."""
        from snapana.sources import log_text

        try:
            return log_text.read(path, require=False).empty
        except InputError:
            return True

    def made(self, path: Path, role: Role) -> Input:
        """The input at `path`, with its kind (or why not), sidecar and rank."""
        from snapana.sources import sidecar

        told = self(path)
        try:
            found = sidecar.find(path) if path.is_file() else None
        except (OSError, ValueError):  # a name the file system cannot hold: no sidecar
            found = None
        return Input(path, None if isinstance(told, InputError) else told, role, found,
                     rank_of(path), str(told) if isinstance(told, InputError) else None)


def resolve(files: Sequence[str | Path], *, at: str | None = None,
            logs: Iterable[Path] = (), trace: Iterable[Path] = (),
            memray: Iterable[Path] = (), texts: bool = True, every_rank: bool = False
            ) -> Inputs:
    """The command line as one list of inputs. `texts`: text inputs are read as logs (a
    paste, files or a folder of logs; logs named among captures are read beside them);
    `every_rank`: each input is a rank, even one alone (a dataset's rows). Otherwise one
    capture (a file, an export folder, a folder or glob of one snapshot) is shown, with
    `trace` / `memray` and a folder's other captures beside it; several are ranks, and
    `--at` applies to one capture only."""
    sniffed = _Seen()
    named = [str(f) for f in files]
    logs, trace, memray = tuple(logs), tuple(trace), tuple(memray)
    if texts:
        alone = _text_alone(named, sniffed)
        if alone is not None:
            _beside_one(trace + memray, None, "the inputs here are text logs")
            return replace(alone, items=(*alone.items, *(
                sniffed.made(p, Role.LOG) for p in logs if p not in alone.files)))
    among = _logs_among(named, sniffed) if texts else []
    named = [f for f in named if f not in among]
    log_inputs = [sniffed.made(p, Role.LOG) for p in (*logs, *map(Path, among))]
    may_be_one = not every_rank and _may_be_one(named)
    if not may_be_one:
        _at_one(at, None)
    paths, skipped, companions, folder_logs = expand(named, sniffed, take_logs=texts)
    log_inputs += [sniffed.made(p, Role.LOG) for p in folder_logs
                   if p not in {i.path for i in log_inputs}]
    single = paths[0] if may_be_one and len(paths) == 1 else None
    _at_one(at, single)
    _beside_one(trace + memray, single, f"the {len(paths)} inputs here make a rank table")
    if single is not None:  # a file, an export folder or a glob of one: no folder's others
        return Inputs((sniffed.made(single, Role.SHOWN),
                       *(sniffed.made(p, Role.BESIDE) for p in (*trace, *memray)),
                       *log_inputs))
    if every_rank:
        companions = []
    return Inputs((*(sniffed.made(p, Role.RANK) for p in paths),
                   *(sniffed.made(p, Role.BESIDE) for p in companions), *log_inputs),
                  tuple(skipped))


def resolve_each(files: Sequence[Path], beside: Iterable[Path] = ()) -> Inputs:
    """Each file as named (no folder expanded, no log told apart), each shown, and the
    captures read beside them: `explain`, `whatif`, `check`, `export`, `diff`, `convert`."""
    sniffed = _Seen()
    return Inputs((*(sniffed.made(p, Role.SHOWN) for p in files),
                   *(sniffed.made(p, Role.BESIDE) for p in beside)))


def _beside_one(beside: tuple[Path, ...], single: Path | None, why: str) -> None:
    """`--trace` / `--memray` are read beside the one capture shown: with none (several
    inputs, or logs alone) they would be read by nothing, so they are refused, not passed
    over without a word."""
    if beside and single is None:
        raise InputError(f"--trace and --memray are read beside one capture, and {why}: "
                         "name one snapshot with them, or read "
                         f"{inert(beside[0].name, lines=False)} on its own")


def _at_one(at: str | None, single: Path | None) -> None:
    if single is None and at is not None:
        raise InputError("--at applies to one capture; with several inputs, pick one file")


def _may_be_one(named: list[str]) -> bool:
    """One file, export folder or glob named: it may come to the one capture shown (a
    folder of snapshots is a rank table, even of one)."""
    from snapana.sources.parquet_dir import MARKER

    only = Path(named[0]) if len(named) == 1 else None
    return only is not None and (not only.is_dir() or (only / MARKER).is_file())


def _text_alone(named: list[str], sniffed: _Seen) -> Inputs | None:
    """Text inputs alone (`-`: a paste on standard input; files whose content is a log; a
    folder of logs holding no snapshot, a note for each of its other files); None when any
    input is a capture. A file that cannot be read is refused here, before any other."""
    if named == ["-"]:
        return Inputs((Input(None, CaptureKind.TEXT_LOG, Role.LOG),))
    from snapana.sources.parquet_dir import MARKER

    paths: list[Path] = []
    skipped: list[str] = []
    folders: list[Path] = []
    for f in named:
        p = Path(f)
        if p.is_dir() and not (p / MARKER).exists():
            members = sorted(m for m in p.iterdir() if m.is_file()
                             and not m.name.startswith("."))
            if any(m.name.lower().endswith(SNAPSHOT_SUFFIXES) or sniffed.is_rank(m)
                   for m in members):  # a snapshot by name or content (`x.pickle__sha`)
                return None
            found = [m for m in members if sniffed.is_text(m)]
            if not found:
                return None
            paths += found
            folders.append(p)
            skipped += [f"{inert(str(m), lines=False)}: not read (not a text log, or empty)"
                        for m in members if m not in found]
        else:
            paths += [p] if p.is_dir() else expand([f], sniffed)[0]
    if not paths or any(p.is_dir() or sniffed.kind(p).row.yields_capture for p in paths):
        return None
    return Inputs(tuple(sniffed.made(p, Role.LOG) for p in dict.fromkeys(paths)),
                  tuple(skipped), tuple(folders))


def _logs_among(named: list[str], sniffed: _Seen) -> list[str]:
    """The text logs named among captures (`snapana report oom.pickle job.log`)."""
    if len(named) < 2 or "-" in named:
        return []
    found = [f for f in named if Path(f).is_file() and sniffed.is_text(Path(f))]
    return found if len(found) != len(named) else []


def expand(args: Iterable[str | Path], sniffed: _Seen | None = None, *,
           take_logs: bool = False) -> tuple[list[Path], list[str], list[Path], list[Path]]:
    """Files, folders (their snapshots) and globs, in a stable order; a line for each file
    of a named folder that is not taken, with why (a folder's files are told apart by
    content, never dropped without a word); the folders' other captures of the same job
    (the kinds read beside a snapshot) where the inputs come to one snapshot: they are read
    beside it. Beside several snapshots a trace is tied to none of them, and listed with
    why. With `take_logs`, a folder's text logs that hold an OOM message or a memory table
    are read beside its snapshots, as a log named among them is (the incident folder a job
    left: its snapshot and its log)."""
    from snapana.sources.parquet_dir import MARKER

    sniffed = sniffed or _Seen()
    out: list[Path] = []
    skipped: list[str] = []
    companions: list[Path] = []
    logs: list[Path] = []
    for arg in args:
        p = Path(arg)
        if p.is_dir() and not (p / MARKER).exists():
            found, passed, others, texts = _folder(p, sniffed, take_logs)
            if not found:
                raise InputError(f"{p}: no snapshot files (*.pickle) in this directory"
                                 + (f" ({len(passed) + len(others)} other files)"
                                    if passed or others else ""))
            out.extend(found)
            skipped.extend(passed)
            companions.extend(others)
            logs.extend(texts)
        elif any(ch in str(arg) for ch in "*?[") and not p.exists():
            matches = sniffed.matches(str(arg))
            if not matches:
                raise InputError(f"{arg}: no file matches")
            out.extend(matches)
        else:
            out.append(p)
    out = list(dict.fromkeys(out))  # each input once, first mention wins
    if len(out) != 1:
        skipped += [f"{inert(f.name, lines=False)}: {sniffed.kind(f).row.not_a_rank} (with "
                    "several snapshots it is tied to none)" for f in companions]
        companions = []
    return out, skipped, companions, logs


def _folder(folder: Path, sniffed: _Seen, take_logs: bool = False
            ) -> tuple[list[Path], list[str], list[Path], list[Path]]:
    """A folder's snapshots (by name, or by content whatever their name: `x.pickle__sha`),
    a line for each other file that is not read with them (what its first bytes say it is,
    and how it is given: its row of `capture_kinds.SOURCES`), the captures read beside
    a lone snapshot, and (`take_logs`) the text logs that say something about memory."""
    found: list[Path] = []
    skipped: list[str] = []
    others: list[Path] = []
    logs: list[Path] = []
    for f in sorted(folder.iterdir()):
        if f.name.startswith(".") or not f.is_file():
            continue
        if f.name.lower().endswith(SNAPSHOT_SUFFIXES):
            found.append(f)
            continue
        if f.name.endswith(".meta.json"):
            skipped.append(f"{inert(f.name, lines=False)}: a sidecar, read with its capture")
            continue
        told = sniffed(f)
        if isinstance(told, InputError):
            why = str(told).removeprefix(f"{f}: ")
            skipped.append(f"{inert(f.name, lines=False)}: not read ({inert(why, lines=False)})")
        elif told.row.rank_input:
            found.append(f)
        elif told.row.read_beside:
            others.append(f)
        elif not told.row.yields_capture and sniffed.says_nothing(f):
            skipped.append(f"{inert(f.name, lines=False)}: no OOM message or capture in it")
        elif not told.row.yields_capture and take_logs:
            logs.append(f)
        else:
            skipped.append(f"{inert(f.name, lines=False)}: {told.row.not_a_rank}")
    return found, skipped, others, logs
