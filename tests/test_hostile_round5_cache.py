"""Issue 66, the fifth hostile round: the user's cache holds data only and runs no code.

Compiled page templates were kept there and executed when read back; a relative
`XDG_CACHE_HOME` (or `HOME=.`) made the working directory the cache, so a checked-out folder
could plant them. Now nothing executable is kept, a relative base is ignored, the folders are
the user's own (0700, not writable by others, not a link), and every entry read back is
checked against what it was made from: a bad one is made again, never an error.
"""

from __future__ import annotations

import base64
import gzip
import hashlib
import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import jinja2
import pytest
from snapana import user_cache
from snapana.analysis.attribution import engine
from snapana.render import assets

from .conftest import ROOT

SAMPLE = ROOT / "sample_snapshots" / "expandable-segments-oom.pickle"
TEMPLATE = "report.html.j2"


def _report(out: Path, env: dict[str, str | None], cwd: Path) -> subprocess.CompletedProcess:
    """`snapana report SAMPLE -o out` in a fresh interpreter, under `env` (on top of ours)."""
    full = dict(os.environ, COLUMNS="200", **env)
    for name, value in env.items():
        if value is None:
            full.pop(name)
    return subprocess.run([sys.executable, "-m", "snapana", "report", str(SAMPLE), "-o",
                           str(out)], capture_output=True, text=True, cwd=cwd, env=full,
                          timeout=600)


def _sealed(body: bytes) -> bytes:
    """A kept file as user_cache writes it: the SHA-256 of the body, a newline, the body (the
    digest anyone can recompute, which is why it only detects damage)."""
    return hashlib.sha256(body).hexdigest().encode() + b"\n" + body


@pytest.mark.parametrize("xdg", ["cache", ".", "./cache"])
def test_a_relative_xdg_cache_home_is_ignored(tmp_path, xdg):
    """XDG Base Directory: a relative XDG_CACHE_HOME is invalid and ignored, so the cache is
    ~/.cache, never the working folder (where a checked-out tree could plant entries)."""
    work, home = tmp_path / "work", tmp_path / "home"
    work.mkdir()
    home.mkdir()
    run = _report(tmp_path / "r.html", {"XDG_CACHE_HOME": xdg, "HOME": str(home)}, work)
    assert run.returncode == 0, run.stderr
    assert list(work.iterdir()) == [], "the working folder was used as the cache"
    assert list((home / ".cache" / "snapana" / "sealed").iterdir())


def test_a_relative_home_means_no_cache(tmp_path, monkeypatch):
    """HOME=. (no XDG_CACHE_HOME): no cache at all, never ./.cache."""
    work = tmp_path / "work"
    work.mkdir()
    run = _report(tmp_path / "r.html", {"XDG_CACHE_HOME": None, "HOME": "."}, work)
    assert run.returncode == 0, run.stderr
    assert list(work.iterdir()) == []
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.setenv("HOME", "rel/home")
    assert user_cache.folder() is None
    monkeypatch.setenv("XDG_CACHE_HOME", "rel")
    assert user_cache.folder() is None


def test_the_cache_folders_are_private(tmp_path, monkeypatch):
    """The snapana folder and its sealed subfolder are made 0700 (only the user reads or
    writes what a report will trust)."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    user_cache.write_text("kept.json", "{}")
    for folder in (tmp_path / "snapana", tmp_path / "snapana" / "sealed"):
        assert stat.S_IMODE(folder.lstat().st_mode) == 0o700, folder
    assert user_cache.read_text("kept.json") == "{}"


@pytest.mark.parametrize("unsafe", ["group-writable", "other-writable sealed", "link",
                                    "sealed link", "foreign owner"])
def test_a_folder_others_can_write_is_not_used(tmp_path, monkeypatch, unsafe):
    """A cache folder writable by group or others, a link in place of one, or one another
    user owns: nothing in it is read, nothing is written to it (as if there were no cache),
    so another account cannot leave entries for snapana to trust."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    user_cache.write_text("kept.json", "{}")
    top, sealed = tmp_path / "snapana", tmp_path / "snapana" / "sealed"
    assert user_cache.read_text("kept.json") == "{}"
    if unsafe == "group-writable":
        top.chmod(0o770)
    elif unsafe == "other-writable sealed":
        sealed.chmod(0o702)
    elif unsafe == "link":
        top.rename(tmp_path / "elsewhere")
        top.symlink_to(tmp_path / "elsewhere")
    elif unsafe == "sealed link":
        sealed.rename(tmp_path / "elsewhere")
        sealed.symlink_to(tmp_path / "elsewhere")
    else:
        real = os.getuid()
        monkeypatch.setattr(user_cache.os, "getuid", lambda: real + 1)
    assert user_cache.read_text("kept.json") is None
    user_cache.write_text("new.json", "{}")
    assert not any(p.name == "new.json" for p in tmp_path.rglob("*"))


def _fresh_packs() -> tuple:
    engine.builtin_packs.cache_clear()
    try:
        return engine.builtin_packs()
    finally:
        engine.builtin_packs.cache_clear()


def _edit_packs(kept: Path, edit) -> None:
    """Apply `edit` to the kept packs' JSON and seal it again (digest recomputed)."""
    data = json.loads(kept.read_bytes().partition(b"\n")[2])
    edit(data)
    kept.write_bytes(_sealed(json.dumps(data).encode()))


def _first_rule(data: list[dict]) -> dict:
    return next(p["rule"][0] for p in data if p.get("rule"))


def test_packs_in_an_unsafe_folder_do_not_change_the_packs(tmp_path, monkeypatch):
    """A packs entry the schema accepts but the TOML does not give (a rule's family
    changed), in a group-writable folder: not read, so the packs are the TOML's."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    first = _fresh_packs()
    kept = next((tmp_path / "snapana" / "sealed").glob("packs-*.json"))
    families = sorted({r.family for p in first for r in p.rules if r.family})

    def other_family(data: list[dict]) -> None:
        rule = _first_rule(data)
        rule["family"] = next(f for f in families if f != rule["family"])

    _edit_packs(kept, other_family)
    (tmp_path / "snapana").chmod(0o775)
    assert _fresh_packs() == first


def _plant_template(cache: Path, marker: Path, truncate: bool = False) -> Path:
    """Compiled report template at the name an earlier snapana read it from: a working
    template that also creates `marker` when executed (or, `truncate`, one cut short inside
    the pickled checksum after jinja2's magic, which jinja2 does not catch)."""
    from snapana.render import html

    env = html._env()
    source, filename, _ = env.loader.get_source(env, TEMPLATE)
    key = jinja2.BytecodeCache().get_cache_key(TEMPLATE, filename)
    python = f"open({str(marker)!r}, 'w').close()\n" + env.compile(source, TEMPLATE, filename,
                                                                    raw=True)
    bucket = jinja2.bccache.Bucket(env, key, jinja2.BytecodeCache().get_source_checksum(source))
    bucket.code = compile(python, filename, "exec")
    body = bucket.bytecode_to_string()
    if truncate:
        body = body[: len(jinja2.bccache.bc_magic) + 10]
    sealed = cache / "snapana" / "sealed"
    sealed.mkdir(parents=True, exist_ok=True, mode=0o700)
    (cache / "snapana").chmod(0o700)
    path = sealed / f"template-{key}.cache"
    path.write_bytes(_sealed(body))
    return path


@pytest.mark.parametrize("base", ["relative", "absolute"])
def test_planted_template_bytecode_is_never_run(tmp_path, base):
    """Bytecode at a kept template's name, digest recomputed, creating a marker file when
    run: a report never executes it, whether planted in a relative cache (a checked-out
    folder) or in the user's own."""
    work, home = tmp_path / "work", tmp_path / "home"
    work.mkdir()
    home.mkdir()
    marker = tmp_path / "ran"
    cache = work / "cache" if base == "relative" else tmp_path / "abs"
    _plant_template(cache, marker)
    xdg = "cache" if base == "relative" else str(cache)
    run = _report(tmp_path / "r.html", {"XDG_CACHE_HOME": xdg, "HOME": str(home)}, work)
    assert run.returncode == 0, run.stderr
    assert not marker.exists(), "planted template bytecode was executed"


def test_a_truncated_template_entry_still_makes_the_report(tmp_path):
    """A kept compiled template cut short (its digest recomputed) was `internal error`: no
    compiled template is read any more, so the report is made, as from an empty cache."""
    clean = _report(tmp_path / "clean.html", {"XDG_CACHE_HOME": str(tmp_path / "c0")}, tmp_path)
    assert clean.returncode == 0, clean.stderr
    cache = tmp_path / "c1"
    _plant_template(cache, tmp_path / "ran", truncate=True)
    run = _report(tmp_path / "r.html", {"XDG_CACHE_HOME": str(cache)}, tmp_path)
    assert run.returncode == 0, run.stderr
    assert (tmp_path / "r.html").read_bytes() == (tmp_path / "clean.html").read_bytes()


#: Edits of the kept packs' JSON (each re-sealed): each refused by the pack schema, the
#: vocabulary or the JSON reader.
PACK_EDITS = {
    "unknown family": lambda d: _first_rule(d).update(family="no_such_family"),
    "bad type": lambda d: _first_rule(d).update(priority="high"),
    "unknown field": lambda d: _first_rule(d).update(run="os.system"),
    "rules not a list": lambda d: d[0].update(rule={"id": "x"}),
    "null id": lambda d: _first_rule(d).update(id=None),
}


@pytest.mark.parametrize("edit", [*PACK_EDITS, "deep nesting"])
def test_an_edited_packs_entry_is_rebuilt_never_blamed_on_the_toml(tmp_path, monkeypatch,
                                                                     edit):
    """The built-in packs' parsed TOML, edited in the cache with its digest recomputed: an
    entry the pack schema or vocabulary refuses was an error blaming an intact
    packs/*.toml (exit 2), one nested deeply an internal error; now the TOML is read again,
    the packs are as without a cache, and the entry is made again."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    first = _fresh_packs()
    kept = next((tmp_path / "snapana" / "sealed").glob("packs-*.json"))
    written = kept.read_bytes()
    if edit == "deep nesting":
        kept.write_bytes(_sealed(b'[{"pack": ' + b"[" * 100_000 + b"]" * 100_000 + b"}]"))
    else:
        _edit_packs(kept, PACK_EDITS[edit])
    assert _fresh_packs() == first
    assert kept.read_bytes() == written  # made again from the TOML
    run = _report(tmp_path / "r.html", {"XDG_CACHE_HOME": str(tmp_path)}, tmp_path)
    assert run.returncode == 0, run.stderr


def test_an_edited_packs_entry_does_not_change_a_report(tmp_path):
    """End to end: a report from a cache whose packs entry was edited (a rule's family
    unknown, digest recomputed) is the report from an empty cache."""
    clean = _report(tmp_path / "clean.html", {"XDG_CACHE_HOME": str(tmp_path / "c0")}, tmp_path)
    assert clean.returncode == 0, clean.stderr
    cache = tmp_path / "c0"
    kept = next((cache / "snapana" / "sealed").glob("packs-*.json"))
    _edit_packs(kept, lambda d: _first_rule(d).update(family="no_such_family"))
    run = _report(tmp_path / "r.html", {"XDG_CACHE_HOME": str(cache)}, tmp_path)
    assert run.returncode == 0, run.stderr
    assert (tmp_path / "r.html").read_bytes() == (tmp_path / "clean.html").read_bytes()


def _plotly_bytes() -> bytes:
    return assets._plotly_data("plotly.min.js").read_bytes()


def _b64gz(raw: bytes) -> bytes:
    return base64.b64encode(gzip.compress(raw, mtime=0))


@pytest.mark.parametrize("copy", ["half", "other script", "two members", "not base64",
                                  "trailing bytes", "empty"])
def test_an_edited_plotly_copy_is_made_again(tmp_path, monkeypatch, copy):
    """The kept compressed plotly.js, edited with its digest recomputed (a copy of half the
    script gave a 248 KB report with no charts): what is inlined always inflates to the
    installed plotly.min.js, and the copy is made again."""
    raw = _plotly_bytes()
    bodies = {
        "half": _b64gz(raw[: len(raw) // 2]),
        "other script": _b64gz(b"alert(1)"),
        "two members": base64.b64encode(gzip.compress(raw, mtime=0) + gzip.compress(b";x()")),
        "not base64": _b64gz(raw) + b"<",
        "trailing bytes": base64.b64encode(gzip.compress(raw, mtime=0) + b"junk"),
        "empty": b"",
    }
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    sealed = tmp_path / "snapana" / "sealed"
    sealed.mkdir(parents=True, mode=0o700)
    (tmp_path / "snapana").chmod(0o700)
    (sealed / assets.cache_name()).write_bytes(_sealed(bodies[copy]))
    assets.plotly_js_gzip_b64.cache_clear()
    try:
        text = assets.plotly_js_gzip_b64()
    finally:
        assets.plotly_js_gzip_b64.cache_clear()
    assert text.isascii() and gzip.decompress(base64.b64decode(text, validate=True)) == raw
    kept = user_cache.read_text(assets.cache_name())
    assert kept == text


def test_an_edited_plotly_copy_still_gives_charts(tmp_path):
    """End to end: the report made over an edited plotly copy inlines the whole plotly.js,
    byte for byte the report from an empty cache."""
    cache = tmp_path / "c"
    clean = _report(tmp_path / "clean.html", {"XDG_CACHE_HOME": str(cache)}, tmp_path)
    assert clean.returncode == 0, clean.stderr
    kept = cache / "snapana" / "sealed" / assets.cache_name()
    raw = _plotly_bytes()
    kept.write_bytes(_sealed(_b64gz(raw[: len(raw) // 2])))
    run = _report(tmp_path / "r.html", {"XDG_CACHE_HOME": str(cache)}, tmp_path)
    assert run.returncode == 0, run.stderr
    assert (tmp_path / "r.html").read_bytes() == (tmp_path / "clean.html").read_bytes()
