"""The view of a budget check (issue 47): each budget line held or breached, with the figure;
and the same as JUnit XML (what GitLab, Jenkins, Buildkite and GitHub's test reporters read)
and as GitHub workflow annotations. The renderers (text, markdown, json) only lay it out."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar
from xml.sax.saxutils import quoteattr

from snapana.analysis.budget import Check
from snapana.render import ViewKind

COLUMNS = ("budget", "limit", "measured", "holds")


@dataclass(frozen=True)
class CheckView:
    kind: ClassVar[ViewKind] = "check"
    title: str  # the capture
    budget: str  # the budget file
    where: str  # the device and moment measured ("cuda:0 at the OOM")
    checks: tuple[Check, ...]

    @property
    def breaches(self) -> tuple[Check, ...]:
        return tuple(c for c in self.checks if not c.ok)

    @property
    def verdict(self) -> str:
        n = len(self.breaches)
        if not n:
            return f"Within budget: all {len(self.checks)} limits of {self.budget} hold."
        return (f"Over budget: {n} of {len(self.checks)} limits of {self.budget} "
                f"{'is' if n == 1 else 'are'} breached.")

    def rows(self) -> list[tuple[str, str, str, str]]:
        return [(c.name, c.limit, c.actual, "yes" if c.ok else "NO") for c in self.checks]

    def breach_lines(self) -> list[str]:
        """One line per breach: what, how much, the budget, and where it comes from."""
        return [breach_line(c) for c in self.breaches]


def breach_line(c: Check) -> str:
    """A breached budget line in words (`check`, the cell magic)."""
    return (f"over budget: {c.name}: measured {c.actual}; budget: {c.limit}"
            + (f"; {c.detail}" if c.detail else ""))


def junit_xml(view: CheckView) -> str:
    """A JUnit report: one test suite (the capture), one test case per budget line, a
    <failure> for each breach."""
    name = quoteattr(f"snapana budget {view.budget}")
    lines = ['<?xml version="1.0" encoding="UTF-8"?>',
             f'<testsuites name={name} tests="{len(view.checks)}" '
             f'failures="{len(view.breaches)}" errors="0">',
             f'  <testsuite name={quoteattr(view.title)} tests="{len(view.checks)}" '
             f'failures="{len(view.breaches)}" errors="0" skipped="0">']
    for c in view.checks:
        case = (f'    <testcase classname={quoteattr("snapana.budget")} '
                f'name={quoteattr(c.name)}')
        if c.ok:
            lines.append(case + "/>")
            continue
        message = f"{c.name}: measured {c.actual}; budget: {c.limit}"
        lines += [case + ">",
                  f"      <failure message={quoteattr(message)} type=\"over budget\">"
                  f"{_text(message + (f'; {c.detail}' if c.detail else ''))}</failure>",
                  "    </testcase>"]
    lines += ["  </testsuite>", "</testsuites>"]
    return "\n".join(lines) + "\n"


def _text(s: str) -> str:
    return s.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def github_annotations(view: CheckView) -> list[str]:
    """`::error` workflow commands, one per breach (GitHub shows them on the run)."""
    def escape(s: str) -> str:
        return s.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")

    return [f"::error title={escape('snapana: ' + c.name + ' over budget')}::"
            f"{escape(line)}" for c, line in zip(view.breaches, view.breach_lines(),
                                                strict=True)]
