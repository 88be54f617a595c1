"""Tracebacks as they are pasted (issue 69): without their header, behind Ray's actor prefix
or torchrun's rank tag, several processes interleaved, log lines between the frames.

Ray's prefix is written from its format string (ray/_private/worker.py, print_worker_logs:
"{dim}{color}({actor_name} pid={pid}[, ip={ip}]){reset} {line}"), torchrun's from its
"[rank{N}]:" tag; the frames are slime's reference-model log-prob pass as its source reads
(slime/backends/megatron_utils/actor.py: train -> compute_log_prob -> forward_only, which is
@torch.no_grad; model.py forward_only -> Megatron's forward_backward_func; loss.py
get_log_probs_and_entropy; utils/ppo_utils.py vocab_parallel_softmax). What the reader names
is checked against the rules engine run here on the stack the test builds itself."""

from __future__ import annotations

import json

import pytest
from snapana.log_session import weigh
from snapana.sources.log_text import read_text
from snapana.sources.traceback_text import read_tracebacks

from .conftest import CORPUS, invoke
from .test_log_traceback import MEGATRON_CE, MEGATRON_FP32, SITE, decided, message, stack_of

#: slime's reference-model log-prob pass, outermost first (file, line, function, source).
REF_LOGPROB = [
    ("/root/slime/slime/backends/megatron_utils/actor.py", 440, "train",
     "self.compute_log_prob("),
    ("/root/slime/slime/backends/megatron_utils/actor.py", 364, "compute_log_prob",
     "return forward_only("),
    (f"{SITE}/torch/utils/_contextlib.py", 116, "decorate_context",
     "return func(*args, **kwargs)"),
    ("/root/slime/slime/backends/megatron_utils/model.py", 468, "forward_only",
     "forward_data_store += forward_backward_func("),
    ("/root/Megatron-LM/megatron/core/pipeline_parallel/schedules.py", 500,
     "forward_backward_no_pipelining", "output_tensor, num_tokens = forward_step("),
    ("/root/Megatron-LM/megatron/core/pipeline_parallel/schedules.py", 289, "forward_step",
     "output_tensor, loss_func = forward_step_func(data_iterator, model)"),
    ("/root/slime/slime/backends/megatron_utils/loss.py", 269, "get_log_probs_and_entropy",
     "log_prob, entropy = calculate_log_probs_and_entropy("),
    ("/root/slime/slime/utils/ppo_utils.py", 672, "calculate_log_probs_and_entropy",
     "log_prob = compute_log_probs(logits.clone(), tokens, tp_group)"),
    ("/root/slime/slime/utils/ppo_utils.py", 371, "vocab_parallel_softmax",
     "normalized_logits = logits - logits_max"),
]
OOM = "torch.OutOfMemoryError: " + message("18.55 GiB", "9.69 GiB", "69.50 GiB", "61.50 GiB",
                                           "6.02 GiB", "79.19 GiB")


def ray(actor: str, pid: int, line: str, ip: str | None = None, color: bool = False) -> str:
    """A worker's line as Ray's driver prints it (print_worker_logs' format string)."""
    dim, cyan, reset = ("\x1b[2m", "\x1b[36m", "\x1b[0m") if color else ("", "", "")
    where = f"{actor} pid={pid}" + (f", ip={ip}" if ip else "")
    return f"{dim}{cyan}({where}){reset} {line}"


def frames_only(frames: list[tuple[str, int, str, str]]) -> list[str]:
    """The frames as CPython prints them, with no header: a paste that starts mid-stack."""
    out = []
    for path, line, function, code in frames:
        out += [f'  File "{path}", line {line}, in {function}', f"    {code}"]
    return out


@pytest.mark.parametrize("ip,color", [(None, False), ("10.0.0.7", True)])
def test_a_ray_actor_paste_without_header_names_the_request(ip: str | None,
                                                              color: bool) -> None:
    lines = [ray("MegatronTrainRayActor", 12345, ln, ip, color)
             for ln in ["[2025-10-01 10:00:01] INFO timer.py:24 - Timer ref_log_probs start",
                        *frames_only(REF_LOGPROB), OOM]]
    ev = weigh([read_text("\n".join(lines), "ray.log")])
    (finding,) = ev.requests
    assert finding is not None
    want = decided(REF_LOGPROB, int(18.55 * (1 << 30)))
    assert finding.traceback.stack == stack_of(REF_LOGPROB)
    assert finding.traceback.headless
    assert (finding.family, finding.rule_id) == (want.family, want.rule_id)
    # a no_grad pass keeps no softmax for backward: not the saved-for-backward family
    assert want.family != "saved_logprob_softmax"
    assert finding.code == REF_LOGPROB[-1][3]
    assert "forward_only" in finding.forward_only
    knobs = [k for k, _ in finding.knobs]
    assert knobs[0] == "--log-probs-max-tokens-per-gpu"
    assert "--recompute-loss-function" not in knobs


def test_torchrun_ranks_interleaved_without_headers() -> None:
    """Two ranks' headless frames interleaved line by line: each message gets its own."""
    def rank(r: int, frames: list[tuple[str, int, str, str]], text: str) -> list[str]:
        return [f"[rank{r}]: {ln}" for ln in [*frames_only(frames), "torch.OutOfMemoryError: "
                                               + text]]

    r0 = rank(0, MEGATRON_FP32, message("29.50 GiB", "12.31 GiB", "66.20 GiB", "63.91 GiB",
                                        "1.48 GiB"))
    r1 = rank(1, MEGATRON_CE, message("14.75 GiB", "3.02 GiB", "75.49 GiB", "72.80 GiB",
                                      "1.92 GiB"))
    lines = []
    for k in range(max(len(r0), len(r1))):
        lines += [*r0[k:k + 1], *r1[k:k + 1]]
    ev = weigh([read_text("\n".join(lines), "torchrun.log")])
    by_rank = {d.message.rank: r for d, r in zip(ev.diagnoses, ev.requests, strict=True)}
    for r, frames, size in ((0, MEGATRON_FP32, 29.50), (1, MEGATRON_CE, 14.75)):
        got = by_rank[r]
        assert got is not None and got.traceback.stack == stack_of(frames), r
        want = decided(frames, int(size * (1 << 30)))
        assert (got.family, got.rule_id) == (want.family, want.rule_id), r


def test_two_ray_actors_interleaved_are_read_apart() -> None:
    """Two actors print at once: the lines are grouped by their pid, not mixed."""
    a = [ray("MegatronTrainRayActor", 101, ln) for ln in [*frames_only(REF_LOGPROB), OOM]]
    b = [ray("MegatronTrainRayActor", 202, ln) for ln in frames_only(MEGATRON_CE)]
    lines = []
    for k in range(len(a)):
        lines += [*a[k:k + 1], *b[k:k + 1]]
    tbs = read_tracebacks(lines)
    stacks = {t.stack for t in tbs}
    assert stack_of(REF_LOGPROB) in stacks and stack_of(MEGATRON_CE) in stacks
    (finding,) = weigh([read_text("\n".join(lines), "ray.log")]).requests
    assert finding is not None and finding.traceback.stack == stack_of(REF_LOGPROB)


def test_log_lines_between_frames_and_a_timestamp_prefix() -> None:
    """A paste that starts mid-stack, each line behind a timestamp, log lines (not indented,
    "INFO:" like an exception's name) between the frames: the frames and their own source
    lines are read, the log lines are not."""
    body = frames_only(REF_LOGPROB[3:])
    body.insert(4, "INFO:megatron.core.timers:forward-compute took 1.2s")
    body.insert(9, "Note: a log line between two frames")
    lines = [f"2025-10-01T10:00:{k:02d}.123456Z {ln}" for k, ln in
             enumerate(["```", *body, OOM])]
    (finding,) = weigh([read_text("\n".join(lines), "paste.md")]).requests
    assert finding is not None
    assert finding.traceback.stack == stack_of(REF_LOGPROB[3:])
    assert [f.code for f in finding.traceback.frames] == [c for *_, c in REF_LOGPROB[3:]]


def test_cli_json_and_text_for_a_headless_paste(tmp_path) -> None:
    path = tmp_path / "ray.log"
    path.write_text("\n".join(ray("MegatronTrainRayActor", 7, ln)
                              for ln in [*frames_only(REF_LOGPROB), OOM]) + "\n")
    out = invoke("summary", "--format", "json", str(path))
    assert out.returncode == 0, out.stderr
    (msg,) = json.loads(out.stdout)["messages"]
    req = msg["failing_request"]
    assert req["family"] == decided(REF_LOGPROB, int(18.55 * (1 << 30))).family
    assert req["forward_only_pass"] and req["knobs"][0]["knob"] == \
        "--log-probs-max-tokens-per-gpu"
    text = invoke("summary", str(path)).stdout
    assert "vocab_parallel_softmax" in text and "--log-probs-max-tokens-per-gpu" in text


@pytest.mark.corpus
def test_every_corpus_message_with_frames_gets_its_request() -> None:
    """Each corpus OOM message whose paste carries frames (`File "…", line N, in f`, counted
    here by a plain search) gets a failing request."""
    path = CORPUS / "oom_messages" / "messages.jsonl"
    if not path.exists():
        pytest.skip("corpus absent")
    for row in map(json.loads, path.read_text().splitlines()):
        text = row["text"]
        if '", line ' not in text or 'File "' not in text:
            continue
        ev = weigh([read_text(text, row["id"])])
        assert ev.requests and all(r is not None for r in ev.requests), row["id"]


def test_a_pasted_log_fits_one_screen_and_full_keeps_the_rest(tmp_path) -> None:
    """At 80 columns the default text is one screen (24 lines): the verdict, three knobs and
    a three-line record hint, said once; --full keeps every knob and the record block."""
    path = tmp_path / "ray.log"
    path.write_text("\n".join(ray("MegatronTrainRayActor", 7, ln)
                              for ln in [*frames_only(REF_LOGPROB), OOM]) + "\n")
    brief = invoke("summary", str(path), columns=80)
    assert brief.returncode == 0, brief.stderr
    lines = brief.stdout.splitlines()
    assert len(lines) <= 24, brief.stdout
    assert sum(ln.lstrip().startswith(("1. ", "2. ", "3. ", "4. ")) for ln in lines) == 3
    assert brief.stdout.count("Next time, record") == 1
    hint = lines[next(i for i, ln in enumerate(lines) if ln.startswith("Next time")):]
    assert len(hint) <= 3
    full = invoke("summary", "--full", str(path), columns=80).stdout
    assert full.count("knob for the request:") > 3 and "_dump_snapshot('oom.pickle')" in full


def test_not_read_names_the_traceback_no_message_used(tmp_path) -> None:
    """A driver's traceback (Ray's RayTaskError, its frames through ray.get) and the actor's
    own ending at the OOM message: the actor's is the request's stack, the driver's is read
    and not used, and the JSON's not_read says so by its line."""
    driver = [("/root/slime/train.py", 88, "train",
               "ray.get(actor_model.async_train(rollout_id, rollout_data_ref))"),
              (f"{SITE}/ray/_private/worker.py", 1012, "get_objects",
               "raise value.as_instanceof_cause()")]
    lines = ["Traceback (most recent call last):", *frames_only(driver),
             "ValueError: the driver's own failure",
             *(ray("MegatronTrainRayActor", 7, ln) for ln in [*frames_only(REF_LOGPROB), OOM])]
    path = tmp_path / "ray.log"
    path.write_text("\n".join(lines) + "\n")
    doc = json.loads(invoke("summary", "--format", "json", str(path)).stdout)
    (msg,) = doc["messages"]
    # the actor's first frame: after the header, the driver's frames and source lines, and
    # the driver's exception line
    assert msg["failing_request"]["traceback"]["line"] == 1 + 2 * len(driver) + 2
    (note,) = [n for n in doc["not_read"] if "traceback" in n]
    assert "line 1" in note and f"{len(driver)} frame(s)" in note
