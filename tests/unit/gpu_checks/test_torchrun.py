"""torchrun's failure summary and the training check's account of why the payload failed."""

from __future__ import annotations

from pathlib import Path

import pytest
from gpufleet_check import checks, launcher

from .fakes import FakeHost, fake_torch, probe, with_torch

# --------------------------------------------------------------------------- torchrun's failure summary

TORCHRUN_FAILURE = """\
[rank0]: RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer \
[10.89.77.12]:51234
E1130 05:50:02.114000 812 torch/distributed/elastic/multiprocessing/api.py:882] failed (exitcode: 1) local_rank: 0 \
(pid: 811)
Traceback (most recent call last):
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
/opt/gpufleet/payload/train.py FAILED
------------------------------------------------------------
Failures:
[1]:
  time      : 2026-11-30_05:50:02
  host      : gpufleet-node-2
  rank      : 3 (local_rank: 1)
  exitcode  : 1 (pid: 812)
  error_file: <N/A>
  traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-11-30_05:50:01
  host      : gpufleet-node-2
  rank      : 2 (local_rank: 0)
  exitcode  : -9 (pid: 811)
  error_file: <N/A>
  traceback : Signal 9 (SIGKILL) received by PID 811
============================================================
"""


def test_worker_failures_are_read_from_torchruns_summary():
    failures = launcher.worker_failures(TORCHRUN_FAILURE)
    assert failures == [  # the root cause first
        {"host": "gpufleet-node-2", "rank": 2, "exitcode": -9, "cause": "Signal 9 (SIGKILL) received by PID 811"},
        {
            "host": "gpufleet-node-2",
            "rank": 3,
            "exitcode": 1,
            "cause": "To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html",
        },
    ]
    assert [launcher.describe_failure(f) for f in failures] == [
        "rank 2 on gpufleet-node-2 was killed by signal 9 (SIGKILL)",
        "rank 3 on gpufleet-node-2 exited with code 1",
    ]


def test_no_summary_no_failures():
    assert launcher.worker_failures("step 10 loss 0.5\nall good\n") == []
    assert (
        launcher.describe_failure({"host": "", "rank": 0, "exitcode": -99, "cause": ""})
        == "rank 0 on an unknown host was killed by signal 99 (signal 99)"
    )


# Issue 16, item 10: a payload that fails under torchrun (here rank 1 raised). train.py logs
# "rank<N> ERROR <message>" and records the exception in torchrun's error file, which torchrun
# prints as the root cause's traceback; torchrun's own ChildFailedError traceback comes before it.
PAYLOAD_FAILURE = """\
2026-12-01 05:59:44,100 rank0 INFO world 2 | backend gloo | device cpu
2026-12-01 05:59:45,900 rank1 ERROR training failed: RuntimeError: boom on purpose
Traceback (most recent call last):
  File "/opt/gpufleet/payload/train.py", line 400, in main
    raise RuntimeError("boom on purpose")
RuntimeError: boom on purpose
E1201 05:59:45.911000 26576 torch/distributed/elastic/multiprocessing/api.py:1002] failed (exitcode: 3) local_rank: 1\
 (pid: 26625) of binary: /opt/gpufleet/venv/bin/python
Traceback (most recent call last):
  File "<frozen runpy>", line 198, in _run_module_as_main
  File "/opt/gpufleet/venv/lib/python3.11/site-packages/torch/distributed/launcher/api.py", line 383, in launch_agent
    raise ChildFailedError(
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:\x20
============================================================
/opt/gpufleet/payload/train.py FAILED
------------------------------------------------------------
Failures:
  <NO_OTHER_FAILURES>
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-12-01_05:59:45
  host      : gpufleet-node-1
  rank      : 1 (local_rank: 1)
  exitcode  : 3 (pid: 26625)
  error_file: /tmp/torchelastic_u01w9_1z/aac10ba4_qssnrgfn/attempt_0/1/error.json
  traceback : Traceback (most recent call last):
    File "/opt/gpufleet/payload/train.py", line 400, in main
      raise RuntimeError("boom on purpose")
  RuntimeError: boom on purpose
\x20\x20
============================================================
"""


def test_failure_cause_is_the_ranks_own_error(tmp_path: Path) -> None:
    failures = launcher.worker_failures(PAYLOAD_FAILURE)
    assert failures == [
        {"host": "gpufleet-node-1", "rank": 1, "exitcode": 3, "cause": "training failed: RuntimeError: boom on purpose"}
    ]
    assert (
        launcher.describe_failure(failures[0])
        == "rank 1 on gpufleet-node-1 exited with code 3: training failed: RuntimeError: boom on purpose"
    )
    # without the payload's own line, the traceback it recorded in torchrun's error file
    recorded_only = "\n".join(line for line in PAYLOAD_FAILURE.splitlines() if " rank1 ERROR " not in line)
    assert launcher.worker_failures(recorded_only)[0]["cause"] == "RuntimeError: boom on purpose"

    log = tmp_path / "torchrun.log"
    log.write_text(PAYLOAD_FAILURE)
    tail = launcher.log_tail(log, "").splitlines()
    assert tail[0] == "2026-12-01 05:59:45,900 rank1 ERROR training failed: RuntimeError: boom on purpose"
    assert tail.count(tail[0]) == 1
    assert not any("ChildFailedError" in line or "<frozen runpy>" in line for line in tail)  # the launcher's stack
    assert "Root Cause (first observed failure):" in tail and "  RuntimeError: boom on purpose" in tail


def test_training_check_says_why_the_payload_failed(
    driver_only: FakeHost, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    log = tmp_path / "torchrun.log"
    log.write_text(PAYLOAD_FAILURE)
    run = {
        "rc": 1,
        "result": None,
        "log_tail": launcher.log_tail(log, ""),
        "failures": launcher.worker_failures(PAYLOAD_FAILURE),
    }
    monkeypatch.setattr(launcher, "run_training", lambda *args, **kwargs: run)
    result = checks.check_training(with_torch(probe(driver_only, "--train"), fake_torch(0)))
    assert result["verdict"] == "fail"
    assert result["detail"] == (
        "no result from the payload (torchrun rc 1): rank 1 on gpufleet-node-1 exited with "
        "code 3: training failed: RuntimeError: boom on purpose"
    )
    assert result["failures"] == run["failures"]
