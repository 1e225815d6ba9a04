"""Play 1's wheel plan (roles/pytorch/tasks/preflight.yml): the exact wheel set, every host it comes from, no download.

The parts, each tested here on its own and together:

* roles/pytorch/files/pytorch_wheel_plan.py, run on the node: ``pip install --dry-run --ignore-installed
  --report`` with the install's source options, then a HEAD per file and per index/find-links URL;
* plugins/lookup/pip_zipapp.py: the controller's pip as one zip the node's Python runs (pip 25.3 or newer);
* the ``gpufleet.fleet.wheel_plan`` filter (plugins/filter/gpufleet_filters.py): judges the script's output
  and words each problem (the host, the file, the requirement that needs it, the fix).

The wheel source is tests/unit/wheel_index.py on 127.0.0.1, serving tiny real wheels built by ``pip
wheel`` the ways real sources serve them: a PEP 503 index with PEP 658 metadata (download.pytorch.org,
PyPI), one without, a flat nginx autoindex wheelhouse (the lab's mirror), files on a second host
(download.pytorch.org/whl/mpmath/ links to files.pythonhosted.org:
https://github.com/pytorch/pytorch/issues/197552), a wheel gone from the index (nvidia-cudnn-cu12==9.1.0.70
vanished from download.pytorch.org/whl/cu124 around 2026-08-12, https://github.com/pytorch/pytorch/issues/193491).
The dummy projects stand for torch's: ``gpufleet-demo-top`` pins ``gpufleet-demo-pinned==2.0`` exactly, as
torch 2.5.1+cu121 pins nvidia-cudnn-cu12==9.1.0.70, and takes ``gpufleet-demo-free>=1.1`` unpinned, as it
takes sympy.

The live tests run the real pip the role would ship (the controller's, ``pip_zipapp``) and skip, saying
so, when it is older than 25.3 (requirements/dev.txt pins 25.3: make venv). The judge's tests also run on
outputs recorded from those live runs (tests/unit/data/wheel_plan.json, see its ``_source``; rewrite it with
``python tests/unit/test_wheel_plan.py --record``), so they run with any pip.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import ansible_playbook, load_script
from wheel_index import Project, WheelSource, build_wheels, closed_port

from ansible_collections.gpufleet.fleet.plugins.module_utils import wheel_plan as wheel_plan_utils

REPO_ROOT = Path(__file__).resolve().parents[2]
PLAN_SCRIPT = REPO_ROOT / "roles" / "pytorch" / "files" / "pytorch_wheel_plan.py"
RECORDED = Path(__file__).resolve().parent / "data" / "wheel_plan.json"
filters = load_script(REPO_ROOT / "plugins" / "filter" / "gpufleet_filters.py", "gpufleet_filters_wheel_plan")
pip_zipapp = load_script(REPO_ROOT / "plugins" / "lookup" / "pip_zipapp.py", "gpufleet_pip_zipapp")
plan_script = load_script(PLAN_SCRIPT, "gpufleet_pytorch_wheel_plan")

TOP, PINNED, FREE = "gpufleet-demo-top", "gpufleet-demo-pinned", "gpufleet-demo-free"
PROJECTS = [
    Project(TOP, "1.0", requires=(f"{PINNED}==2.0", f"{FREE}>=1.1", 'gpufleet-demo-never; python_version < "3"')),
    Project(PINNED, "2.0", payload=2_000_000),
    Project(FREE, "1.0"),
    Project(FREE, "1.1", payload=500_000),
]
TOP_WHEEL, PINNED_WHEEL = "gpufleet_demo_top-1.0-py3-none-any.whl", "gpufleet_demo_pinned-2.0-py3-none-any.whl"
FREE_WHEEL, FREE_OLD_WHEEL = "gpufleet_demo_free-1.1-py3-none-any.whl", "gpufleet_demo_free-1.0-py3-none-any.whl"
REQUIREMENTS = [f"{TOP}==1.0"]
# The pip options the role adds (validate.yml __pytorch_plan_pip_args: the install's, then timeout and one retry).
TIMEOUTS = ["--timeout", "5", "--retries", "1"]

# The cases: the source's settings, how pip is pointed at it, the lock, and what the judge must say
# (fragments of one problem or warning, in order; a fragment between slashes is a regular expression).
CASES: dict[str, dict[str, Any]] = {
    "happy": {"source": {}, "expect": {"problems": [], "summary": ["3 wheels for CPython", "from 127.0.0.1:"]}},
    "no-metadata": {"source": {"metadata": False}, "expect": {"problems": []}},
    "missing-pinned": {
        "source": {"unlisted": {PINNED_WHEEL}},
        "expect": {
            "problems": [
                [
                    "(pytorch_index_url) offers no wheel of gpufleet-demo-pinned==2.0 (needed by gpufleet-demo-top)",
                    "for CPython 3.",
                    "it offers no version of it",
                    "Mirror the file into http://127.0.0.1:",
                    "or change the pin (pytorch_release)",
                ]
            ]
        },
    },
    "file-gone": {
        "source": {"gone": {PINNED_WHEEL}},
        "expect": {
            "problems": [
                [
                    "/files/gpufleet_demo_pinned-2.0-py3-none-any.whl answers HTTP 404",
                    f"{PINNED_WHEEL}, the wheel of gpufleet-demo-pinned==2.0 (needed by gpufleet-demo-top==1.0), is "
                    "listed but gone",
                    "Mirror the file into",
                    "or change the pin (pytorch_release)",
                ]
            ]
        },
    },
    "second-host-closed": {
        "source": {"file_hosts": {PINNED: "closed"}},
        "expect": {
            "problems": [
                [
                    r"/^127\.0\.0\.1:\d+ does not answer \(connection refused\)/",
                    f"pip fetches {PINNED_WHEEL} from it",
                    "for gpufleet-demo-pinned==2.0 (needed by gpufleet-demo-top==1.0)",
                    r"/Allow 127\.0\.0\.1:\d+ through the site's firewall or proxy/",
                    "or mirror the file into",
                ]
            ]
        },
    },
    "second-host-closed-no-metadata": {
        "source": {"metadata": False, "file_hosts": {PINNED: "closed"}},
        "expect": {
            "problems": [
                [
                    r"/^127\.0\.0\.1:\d+ does not answer \(connection refused\)/",
                    f"pip fetches {PINNED_WHEEL} from it",
                    "(needed by gpufleet-demo-top==1.0)",
                ]
            ]
        },
    },
    "redirect-closed": {
        "source": {"redirect": "closed"},
        "expect": {
            "problems": [
                [
                    r"/^127\.0\.0\.1:\d+ \(redirected from 127\.0\.0\.1:\d+\) does not answer \(connection refused\)/",
                    f": it serves 3 wheels of the install: {TOP_WHEEL}, the wheel of gpufleet-demo-top==1.0; ",
                    f"{PINNED_WHEEL}, the wheel of gpufleet-demo-pinned==2.0 (needed by gpufleet-demo-top==1.0); ",
                    r"/Allow 127\.0\.0\.1:\d+ through/",
                ]
            ]
        },
    },
    "index-closed": {
        "source": {},
        "index": "closed",
        "expect": {
            "problems": [
                [
                    r"/^127\.0\.0\.1:\d+ does not answer \(connection refused\): pip cannot read the listing/",
                    "so it finds none of the wheels there",
                    "or correct pytorch_index_url",
                ]
            ]
        },
    },
    "wheelhouse-lock": {
        "source": {"unlisted": {FREE_OLD_WHEEL}},
        "index": "flat",
        "lock": "full",
        "expect": {"problems": [], "summary": ["3 wheels"]},
    },
    "wheelhouse-missing-wheel": {
        "source": {"unlisted": {FREE_OLD_WHEEL, PINNED_WHEEL}},
        "index": "flat",
        "lock": "full",
        "expect": {
            "problems": [
                [
                    "/wheels/ (pytorch_wheelhouse_url) offers no wheel of gpufleet-demo-pinned==2.0 (pinned by "
                    "pytorch_hashes_file /srv/locks/demo.lock) for CPython 3.",
                    "or change the pin (pytorch_hashes_file)",
                ]
            ]
        },
    },
    "lock-lacks-dependency": {
        "source": {"unlisted": {FREE_OLD_WHEEL}},
        "index": "flat",
        "lock": "without-pinned",
        "expect": {
            "problems": [
                [
                    "does not pin gpufleet-demo-pinned==2.0 (needed by gpufleet-demo-top==1.0)",
                    "pip --require-hashes refuses the install",
                    "Write the lock again",
                ]
            ]
        },
    },
    "conflict": {
        "source": {},
        "extra": [f"{FREE}==1.0"],
        "expect": {
            "problems": [
                [
                    "pip cannot install the pins together: The user requested gpufleet-demo-free==1.0; "
                    "gpufleet-demo-top 1.0 depends on gpufleet-demo-free>=1.1. Change the pins (pytorch_release, "
                    "pytorch_extra_packages)"
                ]
            ]
        },
    },
    "no-metadata-no-ranges": {
        "source": {"metadata": False, "ranges": False},
        "expect": {
            "problems": [],
            "warnings": [
                [
                    "serves neither PEP 658 metadata nor byte ranges for gpufleet_demo_top-1.0-py3-none-any.whl",
                    "which play 1 does not do",
                ]
            ],
        },
    },
}


def matches(text: str, fragments: list[str]) -> bool:
    """Every fragment in ``text`` (a /regex/ searched), in order."""
    position = 0
    for fragment in fragments:
        if fragment.startswith("/") and fragment.endswith("/"):
            found = re.compile(fragment[1:-1]).search(text, position)
            if not found:
                return False
            position = found.end()
        else:
            index = text.find(fragment, position)
            if index < 0:
                return False
            position = index + len(fragment)
    return True


def check_judged(judged: dict[str, Any], expect: dict[str, Any]) -> None:
    for key in ("problems", "warnings"):
        wanted = expect.get(key, [] if key == "problems" else None)
        if wanted is None:
            continue
        assert len(judged[key]) == len(wanted), (key, judged[key])
        for text, fragments in zip(judged[key], wanted, strict=True):
            assert matches(text, fragments), (fragments, text)
    if "summary" in expect:
        assert matches(judged["summary"], expect["summary"]), judged["summary"]


# --- the parts that need no pip ---------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def wheels(tmp_path_factory) -> dict:
    return build_wheels(PROJECTS, tmp_path_factory.mktemp("wheel-plan"))


def _dist(tmp_path: Path, version: str, requires_python: str = ">=3.9") -> Any:
    """A pip installation whose metadata says ``version`` (the controller's pip package, its METADATA's Version set)."""
    site = tmp_path / f"site-{version}"
    real = pip_zipapp.controller_pip()
    shutil.copytree(Path(str(real.locate_file("pip"))), site / "pip", ignore=shutil.ignore_patterns("__pycache__"))
    info = site / f"pip-{version}.dist-info"
    info.mkdir()
    metadata = re.sub(r"(?m)^Version: .*$", f"Version: {version}", real.read_text("METADATA"))
    metadata = re.sub(r"(?m)^Requires-Python: .*$", f"Requires-Python: {requires_python}", metadata)
    (info / "METADATA").write_text(metadata)
    import importlib.metadata

    return importlib.metadata.PathDistribution(info)


def test_pip_older_than_25_3_is_not_shipped(tmp_path):
    """pip 25.2 still downloads every wheel on --dry-run (its resolver calls prepare_linked_requirements_more; pip NEWS
    25.3, https://github.com/pypa/pip/blob/main/NEWS.rst#253-2025-10-24): no zip, and the reason."""
    out = pip_zipapp.zipapp(tmp_path, _dist(tmp_path, "25.2"))
    assert out["path"] == "" and out["version"] == "25.2" and out["min_python"] == "3.9"
    assert (
        "the controller's pip is 25.2" in out["problem"]
        and "pip 25.3 or newer reads only the index's metadata" in out["problem"]
    )
    assert not list(tmp_path.glob("*.pyz"))


def test_the_zip_runs_on_the_node_python_and_is_the_same_each_time(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    first = pip_zipapp.zipapp(tmp_path / "a", _dist(tmp_path, "25.3"))
    second = pip_zipapp.zipapp(tmp_path / "b", _dist(tmp_path / "x", "25.3"))
    assert first["problem"] == "" and first["path"].endswith("/gpufleet-pip-25.3.pyz")
    assert Path(first["path"]).read_bytes() == Path(second["path"]).read_bytes()
    assert "__main__.py" in zipfile.ZipFile(first["path"]).namelist()
    done = subprocess.run(
        [sys.executable, "-I", first["path"], "--version"],
        capture_output=True,
        text=True,
        env={"PATH": "/usr/bin:/bin"},
        check=False,
    )
    assert done.returncode == 0, done.stderr
    # The package's own version (the copy's metadata was edited, its code was not).
    assert done.stdout.startswith(f"pip {pip_zipapp.controller_pip().version} from {first['path']}/pip")


@pytest.mark.parametrize(
    ("requires", "minimum"), [(">=3.9", "3.9"), (">=3.10", "3.10"), (">=3.7, !=3.8.0", "3.7"), (None, "")]
)
def test_the_oldest_python_of_requires_python(requires, minimum):
    assert pip_zipapp.min_python(requires) == minimum


def test_pip_option_values_in_both_spellings():
    args = ["--index-url", "https://a/simple", "--proxy=http://p:3128", "--trusted-host", "b:8081", "--trusted-host=c"]
    assert plan_script.option_values(args, "--proxy") == ["http://p:3128"]
    assert plan_script.option_values(args, "--trusted-host") == ["b:8081", "c"]
    assert plan_script.option_values(args, "--cert") == []


def test_the_tls_context_is_made_once_per_distinct_pip_options(wheels, monkeypatch):
    """Loading the CA bundle costs ~30 ms of CPU a time: a wheel set's HEADs share one context per combination of
    --cert, --client-cert and --trusted-host, and a trusted host's context does not verify."""
    made = []
    create = plan_script.ssl.create_default_context
    monkeypatch.setattr(plan_script.ssl, "create_default_context", lambda **kw: made.append(kw) or create(**kw))
    monkeypatch.setattr(plan_script, "TLS_CONTEXTS", {})
    with WheelSource(wheels) as source:
        urls = [source.url("/files/" + TOP_WHEEL)] * 6
        answers = plan_script.fetch_all(urls, [], 5)
        plan_script.fetch_all(urls, ["--trusted-host", "127.0.0.1"], 5)
    assert [a["status"] for a in answers] == [200] * 6
    assert made == [{"cafile": None}, {"cafile": None}]
    trusted = plan_script.tls_context(None, None, True)
    assert (trusted.verify_mode, trusted.check_hostname) == (plan_script.ssl.CERT_NONE, False)
    assert plan_script.tls_context(None, None, False).verify_mode == plan_script.ssl.CERT_REQUIRED


def test_fetch_answers(wheels):
    """HEAD per file: 200, 404, a closed port, a server that refuses HEAD (GET of one byte instead), a redirect."""
    dead = f"http://127.0.0.1:{closed_port()}/files/"
    with (
        WheelSource(wheels) as source,
        WheelSource(wheels, head=False) as no_head,
        WheelSource(wheels, redirect=source.url("/files/")) as moved,
    ):
        ok = plan_script.fetch(source.url("/files/" + TOP_WHEEL), [], 5)
        missing = plan_script.fetch(source.url("/files/absent-1.0-py3-none-any.whl"), [], 5)
        refused = plan_script.fetch(dead + TOP_WHEEL, [], 5)
        ranged = plan_script.fetch(no_head.url("/files/" + TOP_WHEEL), [], 5)
        redirected = plan_script.fetch(moved.url("/files/" + TOP_WHEEL), [], 5)
    assert (ok["status"], ok["error"]) == (200, "")
    assert (missing["status"], missing["error"]) == (404, "Not Found")
    assert refused["status"] == 0 and "Connection refused" in refused["error"]
    assert ranged["status"] == 206 and [(r.method, r.range) for r in no_head.requests] == [
        ("HEAD", None),
        ("GET", "bytes=0-0"),
    ]
    assert redirected["status"] == 200 and redirected["final_url"] == source.url("/files/" + TOP_WHEEL)
    assert [r.method for r in source.requests if r.path.endswith(TOP_WHEEL)] == ["HEAD", "HEAD"]


def test_the_script_says_when_the_python_is_too_old_for_the_pip(tmp_path):
    config = {"pip": str(tmp_path / "pip.pyz"), "pip_version": "25.3", "min_python": "99.0", "pip_args": []}
    done = subprocess.run(
        [sys.executable, "-I", "-c", PLAN_SCRIPT.read_text(), json.dumps(config)],
        input="",
        capture_output=True,
        text=True,
        env={"PATH": "/usr/bin:/bin"},
        check=False,
    )
    out = json.loads(done.stdout)
    assert out["skipped"].startswith("pip 25.3 runs on Python 99.0 or newer, ") and out["install"] == []
    judged = filters.wheel_plan({"rc": done.returncode, "stdout": done.stdout, "stderr": done.stderr}, {})
    assert judged["problems"] == [] and judged["warnings"][0].startswith(
        "the wheel set was not resolved: pip 25.3 runs on Python 99.0"
    )


def test_a_plan_that_did_not_run_is_a_warning_not_a_stop():
    judged = filters.wheel_plan({"rc": None, "msg": "No space left on device"}, {})
    assert judged["problems"] == []
    assert judged["warnings"] == [
        "the wheel plan did not run (rc None: No space left on device); the hosts of the wheels were not checked"
    ]


# --- the recorded outputs of the live runs ---------------------------------------------------------------------


def recorded() -> dict[str, Any]:
    return json.loads(RECORDED.read_text())


@pytest.mark.parametrize("case", list(CASES))
def test_the_judge_on_recorded_output(case):
    """Each case as recorded from a live run (real pip 25.3, tests/unit/data/wheel_plan.json)."""
    entry = recorded()["cases"][case]
    check_judged(filters.wheel_plan(entry["result"], entry["context"]), CASES[case]["expect"])


def test_a_pip_failure_of_another_kind_warns_and_does_not_stop():
    """Only what pip says of the source stops a host; anything else (here the recorded missing-pinned output, its ERROR
    lines replaced by pip's crash line) leaves the install to find out."""
    entry = json.loads(json.dumps(recorded()["cases"]["missing-pinned"]))
    entry["result"]["stdout"] = (
        entry["result"]["stdout"]
        .replace(
            "ERROR: Could not find a version that satisfies the requirement gpufleet-demo-pinned==2.0 (from "
            "gpufleet-demo-top) (from versions: none)",
            "ERROR: Exception:",
        )
        .replace("ERROR: No matching distribution found for gpufleet-demo-pinned==2.0", "ERROR: Exception:")
    )
    judged = filters.wheel_plan(entry["result"], entry["context"])
    assert judged["problems"] == []
    assert judged["warnings"][0].startswith(
        "pip could not resolve the wheel set on this host (rc 1: ERROR: Exception: ERROR: Exception:)"
    )


def test_the_script_reduces_a_real_report():
    """pip's installation report (https://pip.pypa.io/en/stable/reference/installation-report/, version "1"), as pip
    25.3 wrote it for the happy case: each item's name, version, URL, requested flag, Requires-Dist and sha256."""
    report = recorded()["report"]
    assert report["version"] == "1"
    items = plan_script.installs(report)
    assert [(i["name"], i["version"], i["requested"]) for i in items] == [
        (TOP, "1.0", True),
        (PINNED, "2.0", False),
        (FREE, "1.1", False),
    ]
    assert items[0]["requires_dist"] == [f"{PINNED}==2.0", f"{FREE}>=1.1", 'gpufleet-demo-never; python_version < "3"']
    assert items[1]["url"].endswith("/files/" + PINNED_WHEEL) and re.fullmatch(r"[0-9a-f]{64}", items[1]["sha256"])


def test_the_judge_lists_every_file_with_its_host_and_who_needs_it():
    entry = recorded()["cases"]["happy"]
    judged = filters.wheel_plan(entry["result"], entry["context"])
    files = {f["name"]: f for f in judged["files"]}
    assert files[PINNED]["needed_by"] == [f"{TOP}==1.0"] and files[TOP]["needed_by"] == []
    assert files[FREE]["version"] == "1.1"  # the newest, as pip chose it
    assert judged["hosts"] == [files[TOP]["host"]] and files[TOP]["status"] == 200


# --- live: the real pip -----------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def pip_app(tmp_path_factory) -> dict[str, Any]:
    app = pip_zipapp.zipapp(tmp_path_factory.mktemp("pip"))
    if app["problem"]:
        pytest.skip(f"live wheel plan: {app['problem']}")
    return app


def lock_lines(wheels: dict, names: set[str], without: str = "") -> list[str]:
    """The hash lock files/wheelhouse_lock.py writes for those wheels (one line per project)."""
    lines = []
    for wheel in sorted((w for n, w in wheels.items() if n in names and w.project != without), key=lambda w: w.project):
        lines.append(f"{wheel.project}=={wheel.version} --hash=sha256:{wheel.sha256}")
    return lines


def run_case(name: str, wheels: dict, pip_app: dict, workdir: Path) -> tuple[dict, dict, WheelSource]:
    """Run the plan of case ``name``: (the command's result, the judge's context, the source as it was asked)."""
    case = CASES[name]
    settings = dict(case["source"])
    dead = f"http://127.0.0.1:{closed_port()}"
    settings["file_hosts"] = {p: f"{dead}/files/" for p in settings.get("file_hosts", {})}
    if settings.get("redirect") == "closed":
        settings["redirect"] = f"{dead}/files/"
    source = WheelSource(wheels, **settings).start()
    try:
        flat = case.get("index") == "flat"
        url = {"flat": source.url("/wheels/"), "closed": f"{dead}/simple"}.get(
            case.get("index", ""), source.url("/simple")
        )
        pip_args = (["--no-index", "--find-links", url] if flat else ["--index-url", url]) + TIMEOUTS
        if case.get("lock"):
            # The lock of the whole wheelhouse (one version of each project), written before any wheel went missing.
            lines = lock_lines(
                wheels, set(wheels) - {FREE_OLD_WHEEL}, without=PINNED if case["lock"] == "without-pinned" else ""
            )
            requirements = [re.sub(r"\s+--hash=\S+", "", line) for line in lines]
        else:
            lines, requirements = [], REQUIREMENTS + case.get("extra", [])
        context = {
            "source": url,
            "source_setting": "pytorch_wheelhouse_url" if flat else "pytorch_index_url",
            "hashes_file": "/srv/locks/demo.lock" if lines else "",
            "matrix_packages": [TOP],
            "requirements": requirements,
        }
        workdir.mkdir(parents=True, exist_ok=True)
        shutil.copy(pip_app["path"], workdir / "pip.pyz")
        config = {
            "pip": str(workdir / "pip.pyz"),
            "pip_version": pip_app["version"],
            "min_python": pip_app["min_python"],
            "timeout": 5,
            "pip_args": pip_args,
        }
        done = subprocess.run(
            [sys.executable, "-I", "-c", PLAN_SCRIPT.read_text(), json.dumps(config)],
            input="\n".join(requirements),
            capture_output=True,
            text=True,
            env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(workdir)},
            timeout=300,
            check=False,
        )
        return {"rc": done.returncode, "stdout": done.stdout, "stderr": done.stderr}, context, source
    finally:
        source.stop()


@pytest.mark.parametrize("case", list(CASES))
def test_live(case, wheels, pip_app, tmp_path):
    """Each case with the real pip; what it fetched, where that is the point:

    * happy: with PEP 658 metadata pip 25.3 --dry-run fetches no byte of any wheel (the pages, the .metadata files,
      then the plan's HEADs);
    * no-metadata: without (a wheelhouse, an older index) fast-deps reads each wheel's zip directory and METADATA
      through byte ranges: measured here 22 kB of the 2.5 MB of wheels with pip 25.3, where the same run without
      --use-feature=fast-deps downloaded all 2.5 MB;
    * no-metadata-no-ranges: pip is stopped at its first whole-wheel download; the 2 MB wheel is never asked for.
    """
    result, context, source = run_case(case, wheels, pip_app, tmp_path)
    assert result["rc"] == 0, result["stderr"]
    check_judged(filters.wheel_plan(result, context), CASES[case]["expect"])
    wheel_gets = [r for r in source.requests if r.method == "GET" and r.path.endswith(".whl")]
    if case == "happy":
        assert source.bytes_fetched("wheel") == 0 and not wheel_gets
        assert sorted(r.path.rsplit("/", 1)[-1] for r in source.requests if r.path.endswith(".metadata")) == [
            FREE_WHEEL + ".metadata",
            PINNED_WHEEL + ".metadata",
            TOP_WHEEL + ".metadata",
        ]
    elif case == "no-metadata":
        whole = sum(len(w.data) for n, w in wheels.items() if n in (TOP_WHEEL, PINNED_WHEEL, FREE_WHEEL))
        assert wheel_gets and all(r.status == 206 for r in wheel_gets)
        assert 0 < source.bytes_fetched("wheel") < whole / 50
    elif case == "no-metadata-no-ranges":
        assert not [r for r in source.requests if r.path.endswith(PINNED_WHEEL)]


# --- the action gpufleet.fleet.wheel_plan: the pip copied to the host, the script run there, judged ----------------


def _action_play(tasks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{"name": "Wheel plan", "hosts": "localhost", "connection": "local", "gather_facts": False, "tasks": tasks}]


def _action(python: str, source: WheelSource | str, **more: Any) -> dict[str, Any]:
    url = source if isinstance(source, str) else source.url("/simple")
    return {
        "gpufleet.fleet.wheel_plan": {
            "python": python,
            "script": PLAN_SCRIPT.read_text(),
            "requirements": REQUIREMENTS,
            "pip_args": ["--index-url", url, *TIMEOUTS],
            "timeout": 5,
            "context": {"source": url, "source_setting": "pytorch_index_url", "matrix_packages": [TOP]},
            **more,
        },
        "register": "judged",
    }


def test_the_action_copies_the_controllers_pip_runs_the_plan_and_judges_it(wheels, pip_app, tmp_path):
    """One task a host, as play 1 runs it (a local connection here): a fetchable set passes and says where it comes
    from, a file on a second host that does not answer is a problem naming it, and a host whose interpreter does
    not run warns without a copy. The task's temporary directory (the pip's) is gone after each."""
    dead = f"http://127.0.0.1:{closed_port()}"
    remote_tmp = tmp_path / "remote-tmp"
    with WheelSource(wheels) as happy, WheelSource(wheels, file_hosts={PINNED: f"{dead}/files/"}) as closed:
        tasks = [
            {"name": "Plan against a good source", **_action(sys.executable, happy)},
            {"name": "Keep it", "ansible.builtin.set_fact": {"happy": "{{ judged }}"}},
            {
                "name": "Plan against a second host that does not answer",
                **_action(sys.executable, closed),
                # It stops the host; the play goes on here to write what was judged.
                "ignore_errors": True,
            },
            {"name": "Keep that", "ansible.builtin.set_fact": {"closed": "{{ judged }}"}},
            {"name": "Plan with no interpreter", **_action("/nonexistent/python3", dead, python_runs=False)},
            {
                "name": "Write what was judged",
                "ansible.builtin.copy": {
                    "content": "{{ {'happy': happy, 'closed': closed, 'none': judged} | to_json }}",
                    "dest": str(tmp_path / "judged.json"),
                    "mode": "0644",
                },
            },
        ]
        variables = f"ansible_remote_tmp={remote_tmp} ansible_python_interpreter={sys.executable}"
        run = ansible_playbook(tmp_path, _action_play(tasks), "-e", variables)
        assert run.returncode == 0, run.stdout[-4000:] + run.stderr
        happy_gets = [r for r in happy.requests if r.path.endswith(".metadata")]
    judged = json.loads((tmp_path / "judged.json").read_text())
    assert judged["happy"]["changed"] is False and judged["happy"]["plan"]["problems"] == []
    check_judged(judged["happy"]["plan"], CASES["happy"]["expect"])
    assert len(happy_gets) == 3
    check_judged(judged["closed"]["plan"], CASES["second-host-closed"]["expect"])
    assert judged["closed"]["failed"] is True and judged["happy"].get("failed") is not True
    assert judged["closed"]["msg"] == wheel_plan_utils.refusal(judged["closed"]["plan"], "localhost")
    assert judged["closed"]["msg"].startswith("pytorch on localhost: pip resolved the pinned wheel set on this host, ")
    assert judged["none"]["plan"]["problems"] == [] and judged["none"]["plan"]["warnings"] == [
        "the wheel set was not resolved: the interpreter does not run yet; play 1 checked the listings of the pinned "
        "wheels only, not the wheels they need nor the hosts those come from"
    ]
    assert not remote_tmp.exists() or list(remote_tmp.iterdir()) == []


def test_hosts_alike_share_one_resolution_and_each_asks_for_the_files(wheels, pip_app, tmp_path):
    """Three hosts (local connections here), two alike and one on another interpreter path: pip resolves once for
    the two alike (the first to get there; the other waits, takes that resolution and sends only its own HEADs, with
    no pip copied), and once for the third. Every host's plan is the same judged set, the sharing host's names the
    host that resolved, and a refusal there says so."""
    python_link = tmp_path / "bin" / "python3"
    python_link.parent.mkdir()
    python_link.symlink_to(sys.executable)
    inventory = tmp_path / "hosts.yml"
    hosts = {"node-a": sys.executable, "node-b": sys.executable, "node-c": str(python_link)}
    inventory.write_text(
        yaml.safe_dump(
            {
                "all": {
                    "hosts": {
                        name: {"ansible_connection": "local", "ansible_python_interpreter": sys.executable, "py": py}
                        for name, py in hosts.items()
                    }
                }
            }
        )
    )
    with WheelSource(wheels) as happy:
        task = _action("{{ py }}", happy)
        task["gpufleet.fleet.wheel_plan"]["python_version"] = "3.11 x86_64"
        plays = [
            {
                "name": "Wheel plan",
                "hosts": "all",
                "gather_facts": False,
                "tasks": [
                    {"name": "Plan", **task},
                    {
                        "name": "Write what was judged",
                        "ansible.builtin.copy": {
                            "content": "{{ judged | to_json }}",
                            "dest": f"{tmp_path}/judged-{{{{ inventory_hostname }}}}.json",
                            "mode": "0644",
                        },
                    },
                ],
            }
        ]
        run = ansible_playbook(tmp_path, plays, "-i", str(inventory), "-f", "3")
        assert run.returncode == 0, run.stdout[-4000:] + run.stderr
        metadata_gets = [r for r in happy.requests if r.path.endswith(".metadata")]
        heads = [r for r in happy.requests if r.method == "HEAD" and r.path.endswith(".whl")]
    judged = {name: json.loads((tmp_path / f"judged-{name}.json").read_text()) for name in hosts}
    for name in hosts:
        check_judged(judged[name]["plan"], CASES["happy"]["expect"])
    assert sorted([judged["node-a"]["plan"]["resolved_on"], judged["node-b"]["plan"]["resolved_on"]]) in (
        ["", "node-a"],
        ["", "node-b"],
    )
    assert judged["node-c"]["plan"]["resolved_on"] == ""
    # Two resolutions (3 metadata files each), three hosts' HEADs of the 3 wheels.
    assert len(metadata_gets) == 6 and len(heads) == 9
    sharing = "node-a" if judged["node-a"]["plan"]["resolved_on"] else "node-b"
    plan = {**judged[sharing]["plan"], "problems": ["a file that does not answer"]}
    assert wheel_plan_utils.refusal(plan, sharing).startswith(
        f"pytorch on {sharing}: pip resolved the pinned wheel set on {plan['resolved_on']} (a host of the same "
        "interpreter and platform), and the install cannot fetch all of it (nothing has been changed): [1] "
    )


def test_a_controller_pip_that_cannot_serve_warns_and_does_not_stop():
    """The lookup's problem (a controller's pip older than 25.3) is the warning the action gives instead of a plan."""
    from ansible_collections.gpufleet.fleet.plugins.action.wheel_plan import not_run

    plan = not_run("the controller's pip is 23.2.1 (...)")
    assert (
        plan["problems"] == []
        and plan["summary"] == ""
        and plan["warnings"]
        == [
            "the wheel set was not resolved: the controller's pip is 23.2.1 (...); play 1 checked the listings of the "
            "pinned wheels only, not the wheels they need nor the hosts those come from"
        ]
    )


# --- recording ---------------------------------------------------------------------------------------------------


def record(workdir: Path) -> None:
    """Rewrite tests/unit/data/wheel_plan.json from live runs of every case (needs pip 25.3 or newer here)."""
    wheels = build_wheels(PROJECTS, workdir / "build")
    app = pip_zipapp.zipapp(workdir)
    assert not app["problem"], app["problem"]
    cases = {}
    for name in CASES:
        result, context, _source = run_case(name, wheels, app, workdir / name)
        cases[name] = {"result": result, "context": context}
    with WheelSource(wheels) as source:
        report = workdir / "report.json"
        subprocess.run(
            [
                sys.executable,
                "-I",
                app["path"],
                "install",
                "--dry-run",
                "--ignore-installed",
                "--no-cache-dir",
                "--quiet",
                "--only-binary=:all:",
                "--report",
                str(report),
                "--index-url",
                source.url("/simple"),
                *REQUIREMENTS,
            ],
            check=True,
            env={"PATH": "/usr/bin:/bin", "HOME": str(workdir), "PIP_CONFIG_FILE": os.devnull},
        )
    data = {
        "_source": (
            f"Recorded by `python tests/unit/test_wheel_plan.py --record` with pip {app['version']} on CPython "
            f"{sys.version.split()[0]} ({os.uname().machine}): the output of roles/pytorch/files/pytorch_wheel_plan.py "
            "for each case of CASES against tests/unit/wheel_index.py on 127.0.0.1, verbatim (the ports are that "
            "run's), and pip's own --report of the happy case"
        ),
        "cases": cases,
        "report": json.loads(report.read_text()),
    }
    RECORDED.parent.mkdir(exist_ok=True)
    RECORDED.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    if sys.argv[1:] != ["--record"]:
        sys.exit("usage: python tests/unit/test_wheel_plan.py --record")
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        record(Path(tmp))
