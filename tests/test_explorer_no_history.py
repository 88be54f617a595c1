"""Issue 46: a capture without history still gets the explorer's find box and its sites with
their stacks, from the blocks' own frames. In real headless Chromium, on a bundled sample
with its trace removed (what PyTorch writes when history is off: `device_traces` empty) and
on the corpus's history-less capture; what is found is recomputed from the raw pickle."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest

from .browser import open_report
from .conftest import SAMPLES, corpus_files, invoke

#: What the explorer shows after a find: the total found, the families with found bytes,
#: the sites listed and each one's stack.
READ = """(() => {
  const box = document.querySelector('section.device .explore');
  return {found: box.dataset.found === undefined ? null : Number(box.dataset.found),
          allocated: Number(box.dataset.allocated), at: box.querySelector('.explore-at')
            .textContent, head: box.querySelector('.explore-sites-head').textContent,
          sites: Array.from(box.querySelectorAll('.explore-sites details')).map(d =>
            [d.dataset.site, Number(d.dataset.bytes), d.querySelector('pre').textContent]),
          sliderShown: !box.querySelector('.explore-slider').hidden};
})()"""


def _no_history(tmp_path: Path) -> Path:
    snap = pickle.loads((SAMPLES / "slime-tp2-chunked-logprob-oom.pickle").read_bytes())
    snap["device_traces"] = [[] for _ in snap["device_traces"]]
    out = tmp_path / "no-history.pickle"
    out.write_bytes(pickle.dumps(snap, protocol=4))
    return out


def _inputs() -> list:
    corpus = [pytest.param(f, id=f.name) for f in corpus_files(
        "torch_snapshots", "llm-1.3b-no-history.pickle")]
    return [pytest.param(None, id="sample-without-its-trace"), *corpus]


def _raw_blocks(path: Path, device: int) -> list[tuple[int, list[str]]]:
    """Each allocated block of the device: its size and its frames as the find box reads
    them (file:line function), read straight from the pickle."""
    snap = pickle.loads(path.read_bytes())
    return [(b["size"], [f"{f['filename']}:{f['line']} {f['name']}" for f in _frames(b)])
            for seg in snap["segments"] if seg.get("device", 0) == device
            for b in seg["blocks"] if b["state"] == "active_allocated"]


def _frames(block: dict) -> list[dict]:
    """A block's frames: `frames`, or in the older layout its `history`'s newest entry's."""
    return block.get("frames") or ((block.get("history") or [{}])[-1].get("frames") or [])


def _query(blocks: list[tuple[int, list[str]]]) -> str:
    """A function name some allocated bytes' stacks hold and others do not (largest first)."""
    total = sum(s for s, _ in blocks)
    for _, frames in sorted(blocks, key=lambda b: -b[0]):
        for line in frames:
            name = line.rsplit(" ", 1)[-1]
            if name.isidentifier() and len(name) > 3 and ".py:" in line:
                found = sum(s for s, fr in blocks if any(name.lower() in x.lower() for x in fr))
                if 0 < found < total:
                    return name
    pytest.fail("no function name separates the blocks")


@pytest.mark.chromium
@pytest.mark.parametrize("snap", _inputs())
def test_find_and_sites_without_history(tmp_path: Path, snap: Path | None) -> None:
    snap = snap or _no_history(tmp_path)
    out = tmp_path / "report.html"
    assert invoke("report", str(snap), "-o", str(out)).returncode == 0
    device = pickle.loads(snap.read_bytes())["segments"][0].get("device", 0)
    blocks = _raw_blocks(snap, device)
    text = _query(blocks)
    want = sum(s for s, fr in blocks if any(text.lower() in x.lower() for x in fr))
    stacks = {"\n".join(fr) for _, fr in blocks if fr}

    def find(page) -> None:
        page.fill("section.device .explore-find", text)
        page.wait_for_timeout(200)

    before = open_report(out, probe=READ)
    visit = open_report(out, act=find, probe=READ)
    assert not visit.console_errors and not before.console_errors
    assert not [u for u in visit.requests if not u.startswith(("file:", "data:", "blob:"))]
    seen, start = visit.probed, before.probed
    assert not start["sliderShown"] and "event" not in start["at"]
    assert start["allocated"] == sum(s for s, _ in blocks)
    assert start["head"] == "Top allocation sites" and start["sites"]
    assert seen["found"] == want
    assert seen["head"] == "Sites of the blocks found"
    # every site listed after the find holds the text in its stack, which is a block's own
    assert seen["sites"] and sum(b for _, b, _ in seen["sites"]) <= want
    for _site, _bytes, stack in seen["sites"]:
        assert stack in stacks and text.lower() in stack.lower()
    for _site, _bytes, stack in start["sites"]:
        assert stack in stacks or stack == "(no frames recorded)"
