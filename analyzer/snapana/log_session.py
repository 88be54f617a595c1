"""The wiring for text logs (issue 44), as `session` is for captures: read the text's OOM
messages, diagnose each. Kept apart from `session` so that a paste is answered without
importing the capture pipeline (polars, the rule engine): `snapana summary -` in well under
a second."""

from __future__ import annotations

from pathlib import Path

from snapana.analysis.text_diagnosis import TextDiagnosis, diagnose
from snapana.sources import oom_text


def read_logs(paths: list[Path] | None) -> tuple[list[oom_text.TextLog], list[TextDiagnosis]]:
    """The logs (`None`: a paste on standard input) and every message of theirs diagnosed,
    in order."""
    logs = [oom_text.read_stdin()] if paths is None else [oom_text.read(p) for p in paths]
    return logs, [diagnose(m) for log in logs for m in log.messages]
