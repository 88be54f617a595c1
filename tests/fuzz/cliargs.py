"""The command line as input (issue #27): hostile values for every option that takes one
(`--at`, `--capacity`, `--device`, `--workers`, `--rank`, `--block`, `--entries`, `--seed`,
`whatif --set`, `--drop`, `--free-before-forward`),
and outputs onto special files (a FIFO, a copy of /dev/null, a socket, links to them). A
value is read by one strict parser (ASCII digits, one sign, in range) and refused in one
line that quotes it cut short; an output that is not a regular file or folder is refused
and left as it was (the runner fails a case that replaced such a node)."""

from __future__ import annotations

import random

from . import seeds
from .cases import INPUT, Case

DIGITS = ("²", "١٢", "١", "𝟙", "½", "⑤", "٣", "①")
HUGE = "9" * 5000
AT = ("event:²", "event:--1", "event:+-1", "event:-1", "event:+3", "event:0", "event:1e3",
      "event: 1", "event:1 ", "event:0x10", "event:1_0", "event:", "event:" + HUGE,
      "time:99999999999999999999", "time:١٢", "time:-9223372036854775808",
      "time:9223372036854775807", "time:-" + HUGE, "time:4611686018427387904", "time:",
      "time:1.5", "time:-0", "peak", "end", "oom", "interest", ":", "event:\x1b[2J",
      "event:1\n2", "PEAK", "event:\ud800", "x" * 300)
CAPACITY = (HUGE + "GiB", "80GiB\x1b[2J", "٨٠GiB", "-1GiB", "1e3GiB", "NaN GiB", "80",
            "80G", "0GiB", "0.0000001GiB", "513GiB", "80 GiB", "80GiB ", "80\u00a0GiB",
            "80gib", "+80GiB", "80GiB\ud800", "1" + "0" * 400 + "B", "80.GiB", ".5GiB")
COUNTS = ("١", "-1", "0", "+0", "0x1", "1_0", " 1", "1 ", "99999999999999999999", HUGE,
          "²", "1.0", "", "--1", "4096", "4095", "\x1b[2J", "\ud800")
BLOCK = ("١٢", "0x" + "f" * 40, "-0x10", " 0x10", "0x", "0x١", "0X10", "16", "1_6",
         "0x10\x1b[2J", HUGE, "0x3fffffffffffffff", "0x4000000000000000")
SET = ("expandable_segments:maybe", "max_split_size_mb:20", "max_split_size_mb:" + HUGE,
       "max_split_size_mb:-1", "max_split_size_mb:١٢٨", "roundup_power2_divisions:[",
       "roundup_power2_divisions:[256:3]", "roundup_power2_divisions:" + HUGE,
       "roundup_power2_divisions:[>:4]", "roundup_power2_divisions:[0:2]",
       "roundup_power2_divisions:[" + "1:1," * 5000 + "]", "foo:bar", ":",
       "expandable_segments", "garbage_collection_threshold:0.6",
       "expandable_segments:True\x1b[2J", "\ud800:1", "max_split_size_mb:1" + "0" * 17,
       "expandable_segments:True,max_split_size_mb:512")
DROP = ("nope", "", "parameters", "unknown", "\x1b[2J", "\ud800", "x" * 5000, "logits\n",
        "saved_activations")
FAIL_ON = ("peak>+5", "family:>+1GiB", "reserved>+" + HUGE + "GiB", "reserved>+1e9%",
           "family:\ud800>+1GiB", "new_family\x1b[2J", "oom", "peak_allocated>+-5%",
           "reserved>+5%%", "family:kv_cache>+512MiB", "reserved>+" + "9" * 400 + "%",
           "reserved>+1.2.3%", "reserved>+0.0000001%")
OPTIONS = {
    "--at": AT, "--capacity": CAPACITY, "--device": COUNTS, "--workers": COUNTS,
    "--rank": COUNTS, "--block": BLOCK, "--set": SET, "--drop": DROP,
    "--free-before-forward": DROP, "--fail-on": FAIL_ON,
}
#: (option, commands that take it).
TAKES = {
    "--at": (["summary", "{input}", "-f", "json"], ["report", "{input}", "-o", "out.html"],
             ["explain", "{input}", "--family", "unknown"]),
    "--capacity": (["summary", "{input}", "-f", "json"], ["report", "{input}", "-o", "o.html"],
                   ["whatif", "{input}"]),
    "--device": (["summary", "{input}", "-f", "json"], ["explain", "{input}"],
                 ["whatif", "{input}", "--capacity", "141GiB"]),
    "--set": (["whatif", "{input}"], ["whatif", "{input}", "-f", "json"]),
    "--drop": (["whatif", "{input}"], ["whatif", "{input}", "-f", "markdown"]),
    "--fail-on": (["diff", "{input}", "{input}"],),
    "--free-before-forward": (["whatif", "{input}"],
                              ["whatif", "{input}", "--empty-cache-before-forward"]),
    "--workers": (["summary", "{input}", "{input}", "-f", "json"],),
    "--rank": (["report", "{input}", "{input}", "-o", "out.html"],),
    "--block": (["explain", "{input}"],),
}
#: Special files an output may find at its path (setup steps), and the commands writing one.
SPECIAL = (("fifo",), ("chardev",), ("socket",), ("symlink", "/dev/null"),
           ("symlink", "/dev/zero"), ("symlink", "node-fifo"), ("symlink", "node-dev"))
WRITERS = (["report", "{input}", "-o", "{out}"], ["diff", "{input}", "{input}", "-o", "{out}"],
           ["export", "{input}", "-o", "{out}"], ["synth", "--entries", "2000", "-o", "{out}"])


def _snapshot() -> bytes:
    data = seeds.small_snapshot()
    return data if data is not None else seeds.rank_snapshot(0, True)


def value_case(r: random.Random) -> Case:
    option = r.choice(list(OPTIONS))
    value = r.choice(OPTIONS[option])
    if r.random() < 0.15:
        value = value.replace("1", r.choice(DIGITS))
    argv = list(r.choice(TAKES[option])) + [option, value]
    if r.random() < 0.3:  # the value glued to the option
        argv = argv[:-2] + [f"{option}={value}"]
    return Case("cli", f"{option} {value[:40]!r}", {INPUT: _snapshot()}, argv=argv,
                ext=".pickle")


def output_case(r: random.Random) -> Case:
    special = r.choice(SPECIAL)
    out = "out.html"
    setup: list[tuple[str, ...]] = []
    if special[0] == "symlink" and special[1].startswith("node-"):
        kind = "fifo" if special[1] == "node-fifo" else "chardev"
        setup.append((kind, special[1]))
        setup.append(("symlink", out, special[1]))
    elif special[0] == "symlink":
        setup.append(("symlink", out, special[1]))
    else:
        setup.append((special[0], out))
    argv = [a.replace("{out}", out) for a in r.choice(WRITERS)]
    return Case("outputs", f"{' '.join(argv[:1])} -o {' -> '.join(special)}",
                {INPUT: _snapshot()}, argv=argv, setup=setup, ext=".pickle")


def cli_case(r: random.Random) -> Case:
    return output_case(r) if r.random() < 0.35 else value_case(r)
