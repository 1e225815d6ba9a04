"""The pytorch role's rules (plugins/module_utils/rules/pytorch.py), called directly with plain values.

Each rule: a value it takes and one it refuses, with the whole message. The same rules also run for real through
roles/pytorch/tasks/validate.yml in tests/unit/test_pytorch_role.py, on fake hosts.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

import pytest
import rules_case
import yaml
from ansible.parsing.dataloader import DataLoader
from ansible.template import Templar, trust_as_template

settings = importlib.import_module("ansible_collections.gpufleet.fleet.plugins.module_utils.settings")
rules = importlib.import_module("ansible_collections.gpufleet.fleet.plugins.module_utils.rules.pytorch")
ROLE = rules_case.ROLES_DIR / "pytorch"
INDEX = "https://download.pytorch.org/whl/cu121"
PINS = ["torch==2.5.1+cu121", "torchvision==0.20.1+cu121", "torchaudio==2.5.1+cu121"]
SHA = "--hash=sha256:" + "a" * 64

# The role's defaults as a host without settings sees them (pytorch_cuda_release follows an undefined cuda_release),
# its vars, and the facts of Ubuntu 22.04.
MATRIX_PACKAGES = yaml.safe_load((ROLE / "vars" / "main.yml").read_text())["__pytorch_matrix_packages"]
DEFAULTS = {
    **rules_case.defaults("pytorch", pytorch_cuda_release=""),
    "__pytorch_matrix_packages": MATRIX_PACKAGES,
    "ansible_facts": {"distribution": "Ubuntu", "distribution_version": "22.04"},
}


def judge(**values: Any) -> Any:
    """The rules on the defaults with ``values`` over them, for host node-1."""
    return settings.judge("pytorch", "node-1", {**DEFAULTS, **values}, stack=rules_case.stack)


def lock(tmp_path: Path, text: str) -> str:
    path = tmp_path / "wheels.lock"
    path.write_text(text)
    return str(path)


def locked(pins: list[str]) -> str:
    return "".join(f"{pin} {SHA}\n" for pin in pins)


# --- what the rules resolve ----------------------------------------------------------------------------------------


def test_the_defaults_resolve_the_newest_cu121_wheels_from_pytorchs_index():
    judgement = judge()
    assert judgement.errors == []
    facts = judgement.facts
    assert {
        name: facts[name]
        for name in (
            "__pytorch_release",
            "__pytorch_cuda_release",
            "__pytorch_variant",
            "__pytorch_expected_cuda",
            "__pytorch_venv",
            "__pytorch_index_url",
        )
    } == {
        "__pytorch_release": "2.5.1",
        "__pytorch_cuda_release": "12.1",
        "__pytorch_variant": "cu121",
        "__pytorch_expected_cuda": "12.1",
        "__pytorch_venv": "/opt/gpufleet/venv",
        "__pytorch_index_url": INDEX,
    }
    assert facts["__pytorch_matrix_pins"] == facts["__pytorch_requirements"] == PINS
    assert facts["__pytorch_stack"]["errors"] == [] and facts["__pytorch_stack"]["pins"] == PINS
    assert facts["__pytorch_pip_source_args"] == ["--index-url", INDEX]
    assert facts["__pytorch_source_pages"] == [f"{INDEX}/torch/", f"{INDEX}/torchvision/", f"{INDEX}/torchaudio/"]
    assert facts["__pytorch_hash_lines"] == []
    assert facts["__pytorch_plan_requirements"] == PINS
    assert facts["__pytorch_plan_pip_args"] == ["--index-url", INDEX, "--timeout", "60", "--retries", "1"]
    assert facts["__pytorch_plan_context"] == {
        "source": INDEX,
        "source_setting": "pytorch_index_url",
        "hashes_file": "",
        "matrix_packages": MATRIX_PACKAGES,
    }


def test_the_facts_are_those_the_role_s_vars_read_from_the_judgement():
    """vars/main.yml reads every resolved fact by name from the judgement (__pytorch_resolved: validate.yml's, or play
    1's in the entry point probe): none is left out, none is extra, each under its own name."""
    role_vars = yaml.safe_load((ROLE / "vars" / "main.yml").read_text())
    read = {name: value for name, value in role_vars.items() if "__pytorch_resolved." in str(value)}
    assert set(read) == set(judge().facts)
    assert all(value == "{{ __pytorch_resolved.%s }}" % name for name, value in read.items())


def test_an_http_mirror_with_a_second_index_is_trusted_once_per_host():
    judgement = judge(
        pytorch_index_url="http://Mirror:8081/whl/{variant}/",
        pytorch_extra_index_url="http://mirror:8081/pypi",
        pytorch_extra_packages="numpy==1.26.4,ray[default]==2.9.3",
        pytorch_venv="/srv/venv//",
    )
    assert judgement.errors == []
    assert judgement.facts["__pytorch_index_url"] == "http://Mirror:8081/whl/cu121"
    assert judgement.facts["__pytorch_pip_source_args"] == [
        "--index-url",
        "http://Mirror:8081/whl/cu121",
        "--extra-index-url",
        "http://mirror:8081/pypi",
        "--trusted-host=Mirror:8081",
    ]
    assert judgement.facts["__pytorch_requirements"] == PINS + ["numpy==1.26.4", "ray[default]==2.9.3"]
    assert judgement.facts["__pytorch_source_pages"][0] == "http://Mirror:8081/whl/cu121/torch/"
    assert judgement.facts["__pytorch_venv"] == "/srv/venv"


def test_a_locked_wheelhouse_gives_pip_the_lock_and_the_plan_its_pins(tmp_path):
    """pip-compile's continuations and comments: one requirement per line, and the plan's without the hashes."""
    path = lock(
        tmp_path,
        f"# pip-compile\ntorch==2.5.1+cu121 \\\n    {SHA} \\\n    {SHA}\n    # via -r in\n"
        f"TorchVision==0.20.1+cu121 {SHA}  # a comment\ntorchaudio==2.5.1+cu121 {SHA}\n\n",
    )
    judgement = judge(
        pytorch_wheelhouse_url="http://wheels.corp/house/",
        pytorch_hashes_file=path,
        pytorch_pip_extra_args=["--cert", "/etc/ca.pem"],
        pytorch_pip_timeout="20",
        pytorch_pip_retries=0,
    )
    assert judgement.errors == []
    facts = judgement.facts
    assert facts["__pytorch_hash_lines"] == [
        f"torch==2.5.1+cu121      {SHA}      {SHA}",
        f"TorchVision==0.20.1+cu121 {SHA}",
        f"torchaudio==2.5.1+cu121 {SHA}",
    ]
    assert facts["__pytorch_plan_requirements"] == [
        "torch==2.5.1+cu121",
        "TorchVision==0.20.1+cu121",
        "torchaudio==2.5.1+cu121",
    ]
    assert facts["__pytorch_pip_source_args"] == [
        "--no-index",
        "--find-links",
        "http://wheels.corp/house/",
        "--trusted-host=wheels.corp",
    ]
    assert facts["__pytorch_source_pages"] == ["http://wheels.corp/house/"]
    assert facts["__pytorch_plan_pip_args"] == facts["__pytorch_pip_source_args"] + [
        "--cert",
        "/etc/ca.pem",
        "--timeout",
        "20",
        "--retries",
        "0",
    ]
    assert facts["__pytorch_plan_context"] == {
        "source": "http://wheels.corp/house/",
        "source_setting": "pytorch_wheelhouse_url",
        "hashes_file": path,
        "matrix_packages": MATRIX_PACKAGES,
    }


def test_settings_are_read_as_jinjas_filters_read_them():
    """| string of None is 'None' (but {{ None }} in a message is ''), | int of a word is 0, | bool of 'no' is false."""
    judgement = judge(pytorch_pip_retries="many", pytorch_torchvision="no", pytorch_torchaudio="off")
    assert judgement.facts["__pytorch_matrix_pins"] == ["torch==2.5.1+cu121"]
    assert judgement.facts["__pytorch_plan_pip_args"][-2:] == ["--retries", "0"]
    assert judgement.errors == []
    assert (
        judge(pytorch_index_url=None)
        .errors[0]
        .startswith("pytorch_index_url '' is not an http(s) URL (rendered: 'None';")
    )
    assert judge(pytorch_venv=None, pytorch_pip_timeout=None).errors == [
        "pytorch_venv '' must be an absolute path of its own, not / or a system directory such as /usr or /opt"
        " (for example /opt/gpufleet/venv)",
        "pytorch_pip_timeout must be a whole number of seconds above 0, got ''",
    ]


@pytest.mark.parametrize("value", [None, "", "x", 0, 5, False, ["/usr/bin/python3"], {"a": 1}])
def test_shown_is_a_value_as_a_message_template_shows_it(value):
    """settings.shown(value) is what '... {{ value }} ...' renders (None: '', unlike | string)."""
    templar = Templar(loader=DataLoader(), variables={"v": value})
    assert "<" + settings.shown(value) + ">" == templar.template(trust_as_template("<{{ v }}>"))


def test_ubuntu_20_04_takes_the_newest_release_of_its_python():
    judgement = judge(ansible_facts={"distribution": "Ubuntu", "distribution_version": "20.04"})
    assert judgement.errors == [] and judgement.facts["__pytorch_release"] == "2.4.1"
    assert judgement.facts["__pytorch_stack"]["python"]["version"] == "3.8"


# --- what the rules refuse, each with a value it takes -----------------------------------------------------------


def test_the_matrix_reasons_come_first_and_name_the_cuda_setting_followed():
    assert (
        judge(pytorch_release="2.0.1")
        .errors[0]
        .startswith("pytorch_release '2.0.1' is not a PyTorch release gpufleet knows")
    )
    followed = judge(cuda_release="11.8", pytorch_cuda_release="11.8").errors
    assert followed[0].startswith(
        "pytorch_cuda_release (following cuda_release) '11.8' is not a CUDA release gpufleet knows"
    )
    apart = judge(cuda_release="12.1", pytorch_cuda_release="11.8").errors
    assert apart[0].startswith("pytorch_cuda_release '11.8' is not a CUDA release gpufleet knows")
    failed = judge(pytorch_release="2.0.1")
    assert failed.facts["__pytorch_release"] == "2.0.1" and failed.facts["__pytorch_matrix_pins"] == []
    assert failed.facts["__pytorch_stack"] == {"errors": failed.errors[:1]}
    assert judge(cuda_release="12.1").errors == []


REFUSED = [
    (
        {"pytorch_index_url": "ftp://mirror/whl/{variant}"},
        {"pytorch_index_url": "https://mirror/whl/{variant}"},
        "pytorch_index_url 'ftp://mirror/whl/{variant}' is not an http(s) URL (rendered: 'ftp://mirror/whl/cu121';"
        " PyTorch's own is https://download.pytorch.org/whl/{variant}, {variant} being the only placeholder, PyPI's"
        " https://pypi.org/simple; empty for the index of pytorch_wheel_source)",
    ),
    (
        {"pytorch_extra_index_url": "pypi.org/simple"},
        {"pytorch_extra_index_url": "https://pypi.org/simple"},
        "pytorch_extra_index_url 'pypi.org/simple' is not an http(s) URL (for example https://pypi.org/simple)",
    ),
    (
        {"pytorch_wheelhouse_url": "file:///srv/wheels/", "pytorch_require_hashes_offline": False},
        {"pytorch_wheelhouse_url": "https://mirror/wheels/", "pytorch_require_hashes_offline": False},
        "pytorch_wheelhouse_url 'file:///srv/wheels/' is not an http(s) URL"
        " (for example http://mirror.example.com/wheels/)",
    ),
    (
        {"pytorch_wheelhouse_url": "http://mirror/wheels", "pytorch_require_hashes_offline": False},
        {"pytorch_wheelhouse_url": "http://mirror/wheels/", "pytorch_require_hashes_offline": False},
        "pytorch_wheelhouse_url 'http://mirror/wheels' must end with '/': it is the directory listing of the wheels"
        " (for example http://mirror/wheels/)",
    ),
    (
        {
            "pytorch_wheelhouse_url": "http://mirror/w/",
            "pytorch_extra_index_url": "https://pypi.org/simple",
            "pytorch_require_hashes_offline": False,
        },
        {"pytorch_extra_index_url": "https://pypi.org/simple"},
        "pytorch_extra_index_url is set but pytorch_wheelhouse_url makes pip use no index at all (--no-index):"
        " put the extra packages' wheels in the wheelhouse and empty pytorch_extra_index_url",
    ),
    (
        {"pytorch_venv": "/usr/local/"},
        {"pytorch_venv": "/usr/local/venv"},
        "pytorch_venv '/usr/local/' must be an absolute path of its own,"
        " not / or a system directory such as /usr or /opt (for example /opt/gpufleet/venv)",
    ),
    (
        {"pytorch_venv": "/opt/my venv"},
        {"pytorch_venv": "/opt/my-venv"},
        "pytorch_venv '/opt/my venv' must be an absolute path of its own,"
        " not / or a system directory such as /usr or /opt (for example /opt/gpufleet/venv)",
    ),
    (
        {"pytorch_python": "python3"},
        {"pytorch_python": "/usr/bin/python3.11"},
        "pytorch_python 'python3' must be the absolute path of an interpreter (for example /usr/bin/python3)",
    ),
    (
        {"pytorch_extra_packages": ["numpy>=1.26", "ray[default]==2.9.3", "scipy"]},
        {"pytorch_extra_packages": ["numpy==1.26.4", "ray[default]==2.9.3"]},
        "pytorch_extra_packages must be exact pins name==version (as every host must get the same build):"
        " numpy>=1.26, scipy",
    ),
    (
        {"pytorch_extra_packages": ["Torch==2.5.1", "torch_audio==2.5.1", "torchaudio[x]==2.5.1", "TORCH==2.5.1"]},
        {"pytorch_extra_packages": ["torchdata==0.9.0"]},
        "pytorch_extra_packages pins torch, torchaudio, whose versions come from pytorch_release and"
        " files/compatibility.yml (turn torchvision or torchaudio off with pytorch_torchvision or pytorch_torchaudio)",
    ),
    (
        {"pytorch_wheelhouse_url": "http://mirror/wheels/"},
        {"pytorch_wheelhouse_url": "http://mirror/wheels/", "pytorch_require_hashes_offline": "no"},
        "pytorch_wheelhouse_url is an offline install, which gpufleet checks wheel by wheel:"
        " set pytorch_hashes_file to a requirements file with --hash=sha256 for every wheel"
        " (python3 files/wheelhouse_lock.py DIR writes one),"
        " or pytorch_require_hashes_offline to false",
    ),
    (
        {"pytorch_pip_timeout": "soon"},
        {"pytorch_pip_timeout": "5"},
        "pytorch_pip_timeout must be a whole number of seconds above 0, got 'soon'",
    ),
    (
        {"pytorch_pip_timeout": 0},
        {"pytorch_pip_timeout": 1},
        "pytorch_pip_timeout must be a whole number of seconds above 0, got '0'",
    ),
    ({"pytorch_pip_retries": -1}, {"pytorch_pip_retries": "0"}, "pytorch_pip_retries must be a whole number, got '-1'"),
    (
        {"pytorch_min_free_disk_gb": "-5"},
        {"pytorch_min_free_disk_gb": 0},
        "pytorch_min_free_disk_gb must be a whole number of GB, got '-5'",
    ),
]


@pytest.mark.parametrize("refused, taken, message", REFUSED, ids=[message[:40] for _r, _t, message in REFUSED])
def test_each_rule_refuses_with_its_message_and_takes_a_good_value(refused, taken, message):
    assert judge(**refused).errors == [message]
    assert judge(**taken).errors == []


def test_a_lock_that_is_missing_or_empty_is_refused(tmp_path):
    assert judge(pytorch_hashes_file="/nonexistent/wheels.lock").errors == [
        "pytorch_hashes_file /nonexistent/wheels.lock does not exist on the controller, or is empty"
    ]
    empty = lock(tmp_path, "\n  \n")
    assert judge(pytorch_hashes_file=empty).errors == [
        f"pytorch_hashes_file {empty} does not exist on the controller, or is empty"
    ]
    assert judge(pytorch_hashes_file=lock(tmp_path, locked(PINS))).errors == []


@pytest.mark.parametrize(
    "line",
    [
        "torch>=2.5.1 " + SHA,
        "torch==2.5.1+cu121",
        "torch==2.5.1+cu121 --hash=sha256:abc",
        "torch==2.5.1+cu121 --hash=md5:" + "a" * 32,
    ],
)
def test_a_lock_line_that_is_not_a_hashed_pin_is_refused(tmp_path, line):
    path = lock(tmp_path, locked(PINS[1:]) + line + "\n")
    assert judge(pytorch_hashes_file=path).errors[0] == (
        f"pytorch_hashes_file {path} has lines that are not an exact pin with --hash=sha256:<64 hex digits>"
        f" (pip --require-hashes refuses them): {line}"
    )


def test_a_long_bad_lock_line_is_cut_as_jinjas_truncate_cuts_it(tmp_path):
    """| truncate(120): at the last word before 117 characters, '...' added; a line up to 125 characters whole."""
    long_line = "torch>=2.5.1 " + " ".join([SHA] * 3)
    path = lock(tmp_path, locked(PINS) + long_line + "\n")
    assert judge(pytorch_hashes_file=path).errors[0].endswith("refuses them): torch>=2.5.1 " + SHA + "...")
    assert rules.truncate("x" * 125, 120) == "x" * 125
    assert rules.truncate("ab " + "x" * 130, 120) == "ab..."


def test_a_lock_of_another_release_is_refused_naming_what_it_pins(tmp_path):
    other = ["torch==2.4.1+cu121", "torchvision==0.19.1+cu121", "Torch.Audio==2.4.1+cu121"]
    path = lock(tmp_path, locked(other))
    assert judge(pytorch_hashes_file=path, pytorch_extra_packages=["ray[default]==2.9.3"]).errors == [
        f"pytorch_hashes_file {path} does not pin torch==2.5.1+cu121, torchvision==0.20.1+cu121,"
        " torchaudio==2.5.1+cu121, ray==2.9.3 (it pins torch==2.4.1+cu121, torchvision==0.19.1+cu121):"
        " write it again for this release"
    ]
    # Names as pip compares them: TorchVision is torchvision, an extra's [extras] are not part of its pin.
    same = ["Torch==2.5.1+cu121", "TorchVision==0.20.1+cu121", "torchaudio==2.5.1+cu121", "Ray[default]==2.9.3"]
    assert (
        judge(pytorch_hashes_file=lock(tmp_path, locked(same)), pytorch_extra_packages=["ray[default]==2.9.3"]).errors
        == []
    )
    # A requirement whose name is not a regular expression (a loose extra) is said, not an error of the rules.
    errors = judge(pytorch_hashes_file=lock(tmp_path, locked(PINS)), pytorch_extra_packages=["c++(x)"]).errors
    assert errors[-1].endswith("does not pin c++(x) (it pins no such project): write it again for this release")


def test_every_failed_rule_is_said_in_order_in_one_rejection():
    """The matrix's reasons first; a release it does not know has no index either (the source's index is its)."""
    judgement = judge(pytorch_release="2.0.1", pytorch_python="python3", pytorch_pip_retries=-1)
    assert judgement.message.startswith("pytorch settings rejected on node-1: [1] pytorch_release '2.0.1' is not")
    assert "; [2] pytorch_index_url '' is not an http(s) URL (rendered: '';" in judgement.message
    assert "; [3] pytorch_python 'python3' must be" in judgement.message
    assert judgement.message.endswith("; [4] pytorch_pip_retries must be a whole number, got '-1'")
