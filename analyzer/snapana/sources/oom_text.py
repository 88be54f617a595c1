"""Out-of-memory messages read from text: a job's log, a pasted traceback, per-rank logs
(issue 44).

Most OOM tickets carry no snapshot, only what PyTorch printed when the job died. Each message
is found by its anchor ("CUDA out of memory." / "HIP out of memory.", torch_npu's "NPU out of
memory."); its lines are joined
again (a log wraps them and puts a timestamp or a rank tag before each), HTML and JSON
escapes undone; then its figures are read clause by clause (`CLAUSES`). Every wording PyTorch
has used is a combination of these clauses, so one reader takes them all; which wording a
message has is told by the clauses it holds (`WORDINGS`, each with the releases that print it,
from `c10/cuda/CUDACachingAllocator.cpp`). A clause that is not there is None, never guessed.

Figures are as printed: PyTorch's `format_size` writes bytes up to 1 KiB and otherwise two
decimals of KiB, MiB or GiB, so "79.15 GiB" is known to within 0.005 GiB (`Size.slack`).
"""

from __future__ import annotations

import html
import re
from dataclasses import replace

from snapana.log_model import Dialect, OomMessage
from snapana.printed import SIZE, Size, whole
from snapana.sources.text_lines import bounded_lines

#: Each clause: name -> (regex, what it means, the releases that print it). Sizes are the
#: regex's groups (number, unit); a clause with a leading integer group names a device or pid.
CLAUSES: dict[str, tuple[str, str, str]] = {
    "request": (r"Tried to allocate " + SIZE,
                "what the allocator asked the device for: the request's segment "
                "(`alloc_size`: 2 MiB for a small request, 20 MiB for one of 1-10 MiB, else "
                "the request rounded up to 2 MiB), not the tensor's own size",
                "every release"),
    # 1.x - 2.0: "(GPU 0; 15.78 GiB total capacity; 14.56 GiB already allocated; 3.44 MiB
    # free; 14.75 GiB reserved in total by PyTorch)"
    "old_capacity": (r"\(GPU (\d++); " + SIZE + r" total capacity",
                     "the device's memory (cudaMemGetInfo total)", "1.0 - 2.0"),
    # torch_npu (Ascend), NPUCachingAllocator.cpp `malloc`'s OOM branch: "(NPU 0; 60.97 GiB
    # total capacity; 59.57 GiB already allocated; 59.57 GiB current active; 16.54 MiB free;
    # [<fraction> allowed; ]60.06 GiB reserved in total by PyTorch)" (1.x: "...free; <c> cached)")
    "npu_capacity": (r"\(NPU (\d++); " + SIZE + r" total capacity",
                     "the NPU's memory (aclrtGetMemInfo total)", "torch_npu, every release"),
    "old_allocated": (SIZE + r" already allocated",
                      "bytes of live tensors PyTorch's allocator handed out", "1.0 - 2.0"),
    "old_free": (r"; " + SIZE + r" free\b",
                 "the device's free memory when the request failed (cudaMemGetInfo)",
                 "1.0 - 2.0"),
    "old_allowed": (SIZE + r" allowed;",
                    "the cap set by torch.cuda.set_per_process_memory_fraction",
                    "1.8 - 2.0 and 2.5+ (computed but not printed in 2.1 - 2.4)"),
    "old_reserved": (SIZE + r" reserved in total by PyTorch",
                     "everything PyTorch's allocator holds from the device (allocated + cached)",
                     "1.4 - 2.0"),
    "old_cached": (SIZE + r" cached\)",
                   "the allocator's cache: held from the device and not allocated (what "
                   "later releases call reserved but unallocated)", "1.0 - 1.3"),
    # 2.1+: "GPU 0 has a total capacity of 79.15 GiB of which 14.81 MiB is free."
    "capacity": (r"GPU ?(\d++|[\x00-\x1f])? has a total capac(?:i)?ty of " + SIZE
                 + r" of which " + SIZE + r" is free",
                 "the device's memory and its free bytes (cudaMemGetInfo)",
                 "2.1+ ('capacty' in 2.1; 2.3 prints the device as a raw byte)"),
    "process": (r"Process (\d++) has " + SIZE + r" memory in use",
                "another process on the device and its memory (NVML, CUDA builds on Linux; "
                "this process is the 'this process has' sentence)", "2.1+"),
    "preempted": (r"exceed per_process_memory_fraction limit\. Requested size: " + SIZE,
                  "a request refused before it was tried: it would pass the memory fraction",
                  "2.12+"),
    "exabyte": (r"Tried to allocate more than 1EB memory",
                "a request of more than an exabyte (a size bug)", "1.9+"),
    "this_process": (r"this process has " + SIZE + r" memory in use",
                     "this process's device memory, PyTorch's and the rest (CUDA context, "
                     "NCCL, cuBLAS workspaces, other libraries)", "2.2+"),
    "allocated": (r"Of the allocated memory " + SIZE + r" is allocated by PyTorch",
                  "bytes of live tensors PyTorch's allocator handed out", "2.1+"),
    "private_pools": (r"with " + SIZE + r" allocated in private pools",
                      "of those, bytes in private pools (CUDA graphs)", "2.4+"),
    "unallocated": (SIZE + r" is reserved by PyTorch but unallocated",
                    "cached by PyTorch's allocator and free for its own tensors, not for the "
                    "device", "2.1+"),
}
_COMPILED = {k: re.compile(v[0]) for k, v in CLAUSES.items()}

#: The wordings, by the clauses that tell them apart, newest first: (id, releases, clauses).
WORDINGS = (
    ("2.1+", "PyTorch 2.1 and later", ("capacity", "allocated", "unallocated")),
    ("2.12+ fraction", "PyTorch 2.12 and later, a memory-fraction refusal", ("preempted",)),
    ("1.4-2.0", "PyTorch 1.4 - 2.0", ("old_capacity", "old_allocated", "old_reserved")),
    ("1.0-1.3", "PyTorch 1.0 - 1.3", ("old_capacity", "old_allocated", "old_cached")),
    ("torch_npu", "torch_npu (Ascend NPU)", ("npu_capacity", "old_allocated", "old_reserved")),
    ("torch_npu 1.x", "torch_npu 1.x (Ascend NPU)", ("npu_capacity", "old_allocated",
                                                     "old_cached")),
)
#: The wordings printed by allocators that have expandable segments (PyTorch 2.1+,
#: torch_npu's PYTORCH_NPU_ALLOC_CONF): the others get max_split_size_mb instead.
EXPANDABLE_WORDINGS = frozenset({"2.1+", "torch_npu"})

#: Where a message starts: PyTorch's "CUDA out of memory." (HIP on ROCm builds, hipified;
#: NPU from torch_npu's allocator, its own copy of the caching allocator).
ANCHOR = re.compile(r"(CUDA|HIP|NPU) out of memory\b")  # (a paste may glue a word before it)
#: A message whose head ("CUDA out of memory.") the paste cut off: its request clause, then
#: the device clause of the 1.x ("(GPU 0; ") or the 2.1+ wording (". GPU 0 has a total
#: capac"), read only on a line with no anchor. The device is a GPU; which backend is not
#: said (ROCm prints the same), so the message is read as CUDA's and says so.
HEADLESS = re.compile(r"Tried to allocate " + SIZE + r"(?= \(GPU \d| ?\. GPU ?\d{0,3} has a "
                      r"total capac)")
#: Where its text ends: the documentation pointer every wording closes with, or the anchor
#: of the next message.
_END = re.compile(r"See documentation for Memory Management[^\n]*|\bCUDA out of memory\b|"
                  r"\bHIP out of memory\b|\bNPU out of memory\b")
#: How many characters after the anchor a message may take (the longest wording, with a
#: dozen "Process ... has ..." lines and a log prefix before each line, is under 3,000).
SPAN = 6000
#: How many lines a message may take (its wording is under 20 lines even wrapped, with a
#: dozen "Process ... has ..." lines): blank lines between, each a character, never let one
#: anchor read on through the rest of a log.
SPAN_LINES = 64

#: The longest log prefix read before an anchor (timestamps, host, rank tags take under 200
#: characters): what stands further before it on its line is not read again for each anchor.
LONGEST_PREFIX = 1024

#: A rank named before or inside a log line: "[rank3]:", "rank 3", "RANK=3", "[Rank 3]".
_RANK = re.compile(r"\[?\brank[\s=:_-]?(\d{1,6})\]?", re.IGNORECASE)
#: A line's log prefix: what stands before the exception name or the message on its line.
_EXCEPTION = re.compile(r"(?:torch\.(?:cuda\.)?OutOfMemoryError|RuntimeError|OutOfMemoryError"
                        r"|torch\.OutOfMemoryError)\s*+:\s*+$")




def _find(name: str, text: str) -> re.Match[str] | None:
    return _COMPILED[name].search(text)


def _size(m: re.Match[str] | None, at: int = 1) -> Size | None:
    return None if m is None else Size.parse(m.group(at), m.group(at + 1))


def unescape(text: str) -> str:
    """Undo what carried the log: HTML entities (a web page, a ticket), JSON string escapes
    (a log line stored as JSON: literal \\n and \\")."""
    if "&" in text:
        text = html.unescape(_OVERLONG_REF.sub("\ufffd", text))
    if "\\n" in text or '\\"' in text:
        text = text.replace("\\r\\n", "\n").replace("\\n", "\n").replace('\\"', '"')
    return text


#: A numeric character reference past the last code point (U+10FFFF): html.unescape reads it
#: as U+FFFD, but converts its digits first (a 5,000-digit one fails); it is replaced first.
_OVERLONG_REF = re.compile(r"&#(?:[xX]0*+[0-9a-fA-F]{7,}+|0*+[0-9]{8,}+);?")


def _prefix(line: str, at: int) -> str:
    """The part of `line` before the message (or the exception name before it): the log
    prefix every wrapped line of the message may repeat."""
    head = line[max(0, at - LONGEST_PREFIX):at]
    m = _EXCEPTION.search(head)
    if m:
        head = head[:m.start()]
    return head


def _joined(lines: list[str], first: int, at: int, prefix: str) -> str:
    """The message's text from its anchor on, its lines joined: a continuation line that
    repeats the first line's prefix loses it; lines end at the documentation pointer or at
    the next anchor."""
    parts = [lines[first][at:at + SPAN]]
    total = len(parts[0])
    bare = prefix.strip()
    shape = _DIGIT.sub("0", prefix)
    for line in lines[first + 1:first + SPAN_LINES]:
        if total > SPAN or _END.search(parts[-1][1:] if len(parts) == 1 else parts[-1]):
            break
        if bare and line.lstrip().startswith(bare):
            line = line.lstrip()[len(bare):]
        elif prefix and _same_shape(shape, line):
            line = line[len(prefix):]
        parts.append(line.strip())
        total += len(line) + 1
    text = " ".join(p.strip() for p in parts if p.strip())
    end = _END.search(text, 1)
    return text[:end.start()] if end is not None else text


def _same_shape(shape: str, line: str) -> bool:
    """A continuation line whose start has the prefix's shape (a timestamp with other
    digits; `shape`: the prefix, its digits 0): digits may differ, the rest must match."""
    if len(line) < len(shape):
        return False
    return _DIGIT.sub("0", line[:len(shape)]) == shape


_DIGIT = re.compile(r"\d")


def _wording(found: set[str]) -> tuple[str, str, tuple[str, ...]]:
    """(wording id, its releases, the clauses it should have and the message lacks). A
    wording is told by its capacity clause (each era words it its own way) and, for the
    old one, by 'cached' vs 'reserved in total'; a message cut short keeps its wording."""
    for wid, releases, needs in WORDINGS:
        if needs[0] in found and ("old_cached" in found) == ("old_cached" in needs):
            return wid, releases, tuple(n for n in needs if n not in found)
    return "unrecognised", "not one of PyTorch's wordings", ()


def read_messages(text: str) -> list[OomMessage]:
    """Every OOM message in `text`, in order."""
    return messages_in(bounded_lines(unescape(text))[0])[0]


def messages_in(lines: list[str], most: int | None = None) -> tuple[list[OomMessage], int]:
    """The first `most` OOM messages of `lines` (unescaped, bounded: `text_lines`), and how
    many anchors the lines hold: the anchors past `most` are counted, never read."""
    out: list[OomMessage] = []
    anchors = 0
    for i, line in enumerate(lines):
        found = list(ANCHOR.finditer(line))
        starts = [(a.start(), a.group(1)) for a in found]
        if not found and (cut := HEADLESS.search(line)) is not None:
            starts = [(cut.start(), "")]
        for start, backend in starts:
            anchors += 1
            if most is not None and anchors > most:
                continue
            prefix = _prefix(line, start)
            body = _joined(lines, i, start, prefix)
            msg = _message(i + 1, backend or "CUDA", body, prefix)
            if not backend:
                msg = replace(msg, oddities=(
                    "the paste starts at 'Tried to allocate': the message's head ('CUDA out "
                    "of memory.') is cut off, so it is read as a CUDA device's (ROCm's HIP "
                    "prints the same figures)", *msg.oddities))
            out.append(msg)
    return out, anchors


def _message(line: int, backend: str, body: str, prefix: str) -> OomMessage:
    found = {k for k in CLAUSES if _find(k, body)}
    wording, releases, missing = _wording(found)
    cap = _find("capacity", body)
    old_cap = _find("old_capacity", body) or _find("npu_capacity", body)
    raw_device = cap.group(1) if cap else old_cap.group(1) if old_cap else None
    device = None if not raw_device else (
        whole(raw_device) if raw_device.isdigit() else ord(raw_device))
    allocated = _size(_find("allocated", body)) or _size(_find("old_allocated", body))
    unallocated = _size(_find("unallocated", body)) or _size(_find("old_cached", body))
    reserved = _size(_find("old_reserved", body))
    if reserved is None and allocated is not None and unallocated is not None:
        reserved = Size(allocated.bytes + unallocated.bytes,
                        allocated.slack + unallocated.slack,
                        f"{allocated.text} + {unallocated.text}")
    processes = tuple((whole(m.group(1)), Size.parse(m.group(2), m.group(3)))
                      for m in _COMPILED["process"].finditer(body))
    rank = _RANK.search(prefix)
    msg = OomMessage(
        line=line, dialect=Dialect(backend, wording, releases), text=body,
        prefix=prefix.strip(), rank=int(rank.group(1)) if rank else None, device=device,
        request=_size(_find("request", body)) or _size(_find("preempted", body)),
        capacity=_size(cap, 2) if cap else _size(old_cap, 2),
        free=_size(cap, 4) if cap else _size(_find("old_free", body)),
        allocated=allocated, reserved=reserved, unallocated=unallocated,
        this_process=_size(_find("this_process", body)),
        private_pools=_size(_find("private_pools", body)),
        allowed=_size(_find("old_allowed", body)), processes=processes,
        exabyte="exabyte" in found, expandable_on=_expandable_on(wording, found, body))
    return _with_oddities(msg, found, missing)


def _expandable_on(wording: str, found: set[str], body: str) -> bool | None:
    """Whether expandable segments were on, as far as the message tells: 2.15 says so; a
    2.14+ message whole to its figures leaves out the hint suggesting them (or the paste
    ends there: the oddity says both)."""
    if "expandable_segments is enabled" in body:
        return True
    if wording == "2.1+" and "unallocated" in found:
        return False if "try setting" in body or "See documentation" in body else True
    return None


def _with_oddities(m: OomMessage, found: set[str], missing: tuple[str, ...]) -> OomMessage:
    """Each oddity of a real paste, said in a sentence rather than read as a wrong figure."""
    odd: list[str] = []
    if missing:
        odd.append("the message is cut short: its " + ", ".join(
            f"'{CLAUSES[k][1].split(' (')[0]}'" for k in missing) + " clause is not in the text")
    if "capacty" in m.text:
        odd.append("'total capacty': PyTorch 2.1's spelling (fixed in 2.2)")
    if "old_cached" in found:
        odd.append("'cached' is the 1.0 - 1.3 word for the allocator's cache, held from "
                   "the device but not allocated: read as reserved but unallocated (reserved "
                   "= allocated + cached)")
    if m.wording == "2.1+" and "this_process" not in found:
        odd.append("no 'this process has ... memory in use' sentence: the driver's process "
                   "list (NVML) was not available (a ROCm build, no NVML) or did not show "
                   "this process (a container's pid namespace: it may be one of the "
                   "'Process N' lines); this process's memory outside PyTorch is not split "
                   "from the other processes'")
    if cap_raw_byte(m.text):
        odd.append("the GPU number is a raw byte: PyTorch 2.3.0 printed the device that way "
                   "(fixed in 2.4); read as its value")
    if "exabyte" in found:
        odd.append("a request of more than an exabyte: a size bug (a negative or overflowed "
                   "size), not an OOM any setting can fix")
    if m.expandable_on and "expandable_segments is enabled" not in m.text:
        odd.append("no expandable_segments hint after the figures: PyTorch 2.14 and later "
                   "leave it out when expandable segments are already on (or the paste "
                   "ends there)")
    if m.this_process is not None and m.this_process.bytes == 0:
        odd.append("'this process has 0 bytes memory in use': the driver could not see this "
                   "process (a container or WSL without its pid namespace); its memory "
                   "outside PyTorch is not known")
    if m.processes and m.this_process is None:
        odd.append(f"{len(m.processes)} process line(s) and no figure for this process: "
                   "which of them is this job is not said")
    if m.request is None:
        odd.append("the request ('Tried to allocate ...') is not in the text: cut short?")
    if m.capacity is None:
        odd.append("the device's capacity is not in the text")
    if (m.capacity is not None and m.allocated is not None
            and m.allocated.bytes > m.capacity.bytes + m.capacity.slack):
        odd.append("allocated is above the device's capacity: the driver lets this process "
                   "spill into system memory (Windows / WSL shared GPU memory)")
    if (m.request is not None and m.capacity is not None
            and m.request.bytes > m.capacity.bytes + m.capacity.slack):
        odd.append("the request is larger than the whole device: a size bug (a shape or a "
                   "dtype), not an OOM a setting can fix")
    if (m.request is not None and m.free is not None and m.allowed is None
            and m.request.bytes + m.request.slack < m.free.bytes - m.free.slack):
        odd.append("the request is smaller than the device's free memory: another limit "
                   "was hit (a per-process memory fraction, a private pool, a CUDA "
                   "allocation the driver refused for another reason)")
    return replace(m, oddities=tuple(odd))


def cap_raw_byte(text: str) -> bool:
    """PyTorch 2.3.0's 'GPU \\x00 has a total capacity' (the device as a raw byte)."""
    return _RAW_BYTE.search(text) is not None and _NUMBERED.search(text) is None


_RAW_BYTE = re.compile(r"GPU ?[\x00-\x1f]? has a total capac")
_NUMBERED = re.compile(r"GPU \d++ has a total capac")
