"""A paste that kept only the innermost frame's source line (issue 69): where that line is a
library's own statement, it names the frame, and the failing request is named from it.

The statements are copied here from the libraries' files (cited above each), not from
`sources/source_lines.toml`; the family each must get is decided by the rules engine run by
the test on the one-frame stack it builds itself, and for Module.to's `convert` written
down by hand (the weights moved to the device). The corpus test reads the real pastes and
checks what an engineer reading them would conclude."""

from __future__ import annotations

import json

import pytest
from snapana.analysis.attribution import load_rules
from snapana.analysis.attribution.stack import BlockContext
from snapana.log_session import weigh
from snapana.render.text_log import text_log_view
from snapana.sources.log_text import read_text
from snapana.sources.traceback_text import read_tracebacks

from .conftest import CORPUS, invoke
from .test_log_traceback import message

RULES = load_rules()
MIB = 1 << 20

#: (source line as CPython prints it, file, function), each from the library's source:
LIBRARY_LINES = [
    # torch/nn/modules/module.py Module.to's inner convert, torch 1.6-2.0
    ("return t.to(device, dtype if t.is_floating_point() or t.is_complex() else None, "
     "non_blocking)", "torch/nn/modules/module.py", "convert"),
    # the same, torch 1.0-1.5 (no complex dtypes)
    ("return t.to(device, dtype if t.is_floating_point() else None, non_blocking)",
     "torch/nn/modules/module.py", "convert"),
    # torch/autograd/__init__.py backward: run_backward's last line (CPython <= 3.7 prints it)
    ("allow_unreachable=True)  # allow_unreachable flag", "torch/autograd/__init__.py",
     "backward"),
    ("allow_unreachable=True, accumulate_grad=True)  # allow_unreachable flag",
     "torch/autograd/__init__.py", "backward"),
    # transformers modeling_utils.py _load_state_dict_into_meta_model (4.48 on)
    ("param = param[...]", "transformers/modeling_utils.py", "_load_state_dict_into_meta_model"),
]
#: How pastes put them: (line prefix, the exception line's prefix)
PREFIXES = [("    ", ""), ("", ""), ("[rank3]:     ", "[rank3]: "),
            ("(VllmWorker rank=1 pid=2978) ", "(VllmWorker rank=1 pid=2978) "),
            ("`    ", ""), ("--> 781         ", ""), ("sglang-1  |     ", "sglang-1  | ")]
OOM = "torch.OutOfMemoryError: " + message("64.00 MiB", "20.00 MiB", "23.40 GiB", "22.90 GiB",
                                           "10.00 MiB", "23.52 GiB")


def _request(text: str):
    ev = weigh([read_text(text, "t.log")])
    assert len(ev.diagnoses) == 1
    return ev.requests[0], ev


@pytest.mark.parametrize(("code", "path", "function"), LIBRARY_LINES)
@pytest.mark.parametrize(("prefix", "exc_prefix"), PREFIXES)
def test_a_library_source_line_alone_names_its_frame(code: str, path: str, function: str,
                                                     prefix: str, exc_prefix: str) -> None:
    r, ev = _request(f"{prefix}{code}\n{exc_prefix}{OOM}\n")
    assert r is not None
    (frame,) = r.traceback.frames
    assert (frame.path, frame.function, frame.line, frame.code) == (path, function, 0, code)
    stack = ((path, function, 0),)
    want = RULES.with_sites([stack]).classify(stack, BlockContext(size=64 * MIB))
    assert r.family == want.family != "unknown"
    assert ev.not_read == ()


def test_module_to_alone_is_the_weights_moved_with_a_weights_knob() -> None:
    r, _ = _request(f"    {LIBRARY_LINES[0][0]}\ntorch.cuda.{OOM}\n")
    assert r is not None and r.family == "parameters"
    assert any("weights" in k for k, _ in r.knobs)
    assert r.site == "nn/modules/module.py convert"  # no line number: the paste has none


def test_autograd_backward_alone_is_the_backward() -> None:
    r, _ = _request(f"    {LIBRARY_LINES[2][0]}\nRuntimeError: {OOM.split(': ', 1)[1]}\n")
    assert r is not None and r.phase == "backward"


@pytest.mark.parametrize("line", [
    "    return func(*args, **kwargs)",  # torch/utils/_contextlib.py and a hundred others
    "    torch.empty(",
    "see how return t.to(device, dtype if t.is_floating_point() else None, non_blocking)",
    "x = 1; param = param[...]",
])
def test_a_generic_or_embedded_statement_names_no_frame(line: str) -> None:
    assert read_tracebacks([line, OOM]) == []
    r, _ = _request(f"{line}\n{OOM}\n")
    assert r is None


def test_json_says_the_line_number_is_not_known(tmp_path) -> None:
    f = tmp_path / "p.log"
    f.write_text(f"    {LIBRARY_LINES[4][0]}\n{OOM}\n")
    res = invoke("summary", "--format", "json", str(f))
    assert res.returncode == 0, res.stderr
    req = json.loads(res.stdout)["messages"][0]["failing_request"]
    assert req["traceback"]["frames"] == [{"file": LIBRARY_LINES[4][1], "line": None,
                                           "function": LIBRARY_LINES[4][2],
                                           "code": LIBRARY_LINES[4][0]}]
    assert req["site"] == "transformers/modeling_utils.py _load_state_dict_into_meta_model"


#: Expectations written from each paste's raw text (its line above the OOM message):
#: id -> (family, a word the first request knob must hold), None: no request can be named.
EXPECTED = {
    # `return t.to(device, dtype if ...)`: Module.to moving the model's weights
    "oom-052": ("parameters", "weights"),
    "oom-114": ("parameters", "weights"),
    "oom-118": ("parameters", "weights"),
    # `param = param[...]`: transformers loading a checkpoint's tensor onto the GPU
    "oom-107": ("parameters", "torch_dtype"),
    # `allow_unreachable=True)  # allow_unreachable flag`: autograd's backward
    "oom-069": ("gradients", None),
    # lines that name no one function: no request, and no knob made up for one
    "oom-032": None,  # return func(*args, **kwargs)
    "oom-072": None,  # torch.zeros(
    "oom-124": None,  # torch.empty(
    "oom-013": None,  # the message alone
}


def _corpus() -> dict[str, str]:
    path = CORPUS / "oom_messages" / "messages.jsonl"
    if not path.exists():
        pytest.skip("the corpus is not next to this checkout")
    return {m["id"]: m["text"] for m in map(json.loads, path.read_text().splitlines())}


@pytest.mark.parametrize("mid", sorted(EXPECTED))
def test_corpus_pastes_with_a_library_line(mid: str) -> None:
    text = _corpus()[mid]
    r, _ = _request(text)
    want = EXPECTED[mid]
    if want is None:
        assert r is None
        return
    family, knob = want
    assert r is not None and r.family == family
    if knob is None:
        return
    assert r.knobs and knob in r.knobs[0][0]
    view = text_log_view("t.log", weigh([read_text(text, "t.log")]))
    assert any(knob in k for k, _ in view.best_knobs)
