"""tests/lab/files/build-cuda-repo.py: versions, control data and package layout, without building anything."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from conftest import load_script

REPO_ROOT = Path(__file__).resolve().parents[2]
SCRIPT = REPO_ROOT / "tests" / "lab" / "files" / "build-cuda-repo.py"
MATRIX = yaml.safe_load((REPO_ROOT / "files" / "compatibility.yml").read_text())
FPR = "CD100623DAF667973F4422AE0FE12B791AFFF794"
# The lab's site repository: NVIDIA's debian12 directory has no CUDA 12.1, so the lab does not pretend to be it.
REPO_URL = "http://gpufleet-mirror/site/cuda-12.1/debian12/"
LAB_VARS = yaml.safe_load((REPO_ROOT / "tests" / "lab" / "vars" / "lab.yml").read_text())
LAB_INVENTORY = yaml.safe_load(
    (REPO_ROOT / "tests" / "lab" / "inventory" / "group_vars" / "all" / "main.yml").read_text()
)
LAB_PLAYBOOK = (REPO_ROOT / "tests" / "lab" / "lab.yml").read_text()


def load_builder():
    return load_script(SCRIPT, "build_cuda_repo")


builder = load_builder()


def matrix_versions(release: str = "12.1"):
    row = MATRIX["cuda_releases"][release]
    return builder.parse_versions(
        row["toolkit_version"],
        row["component_version"],
        row["cudnn"]["package_version"],
        row["nccl"]["package_version"],
    )


@pytest.fixture(name="packages")
def fixture_packages():
    return {p.name: p for p in builder.repository_packages(matrix_versions(), b"KEY", FPR, REPO_URL)}


def test_versions_from_the_matrix():
    v = matrix_versions()
    assert (v.cuda, v.dashed, v.cuda_major) == ("12.1", "12-1", "12")
    assert v.component_package == "12.1.105-1"
    assert (v.cudnn_upstream, v.nccl_upstream) == ("8.9.2.26", "2.18.1")


@pytest.mark.parametrize(
    "args, message",
    [
        (("12.1", "12.1.105", "8.9.2.26-1+cuda12.1", "2.18.1-1+cuda12.1"), "--cuda-toolkit-version"),
        (("12.1.1-1", "11.8.89", "8.9.2.26-1+cuda12.1", "2.18.1-1+cuda12.1"), "--cuda-component-version"),
        (("12.1.1-1", "12.1.105", "8.9.2.26-1+cuda11.8", "2.18.1-1+cuda12.1"), "--cudnn-version"),
        (("12.1.1-1", "12.1.105", "8.9.2.26-1+cuda12.1", "2.18.1"), "--nccl-version"),
    ],
)
def test_mismatched_versions_are_refused(args, message):
    with pytest.raises(builder.BuildError, match=message):
        builder.parse_versions(*args)


@pytest.mark.parametrize(
    "version, upstream",
    [
        ("8.9.2.26-1+cuda12.1", "8.9.2.26"),
        ("1:2.0-3", "2.0"),
        ("12.1.105", "12.1.105"),
        ("1.2-3-4", "1.2-3"),
    ],
)
def test_upstream_version(version, upstream):
    assert builder.upstream_version(version) == upstream


def test_deb_filename_drops_the_epoch():
    assert builder.deb_filename("libnccl2", "2.18.1-1+cuda12.1", "amd64") == "libnccl2_2.18.1-1+cuda12.1_amd64.deb"
    assert builder.deb_filename("x", "1:2.0-1", "all") == "x_2.0-1_all.deb"


def test_control_round_trip():
    fields = {"Package": "p", "Version": "1-1", "Description": "short\nfirst line\n\nafter a blank line"}
    text = builder.render_control(fields)
    assert text == "Package: p\nVersion: 1-1\nDescription: short\n first line\n .\n after a blank line\n"
    assert builder.parse_control(text) == fields


def test_names_and_versions_are_nvidias(packages):
    row = MATRIX["cuda_releases"]["12.1"]
    expected = {
        "cuda-nvcc-12-1": "12.1.105-1",
        "cuda-cudart-12-1": "12.1.105-1",
        "cuda-cudart-dev-12-1": "12.1.105-1",
        "cuda-nvrtc-12-1": "12.1.105-1",
        "cuda-nvrtc-dev-12-1": "12.1.105-1",
        "cuda-toolkit-12-1": "12.1.1-1",
        "cuda-keyring": "1.1-1",
    }
    expected.update({name: row["cudnn"]["package_version"] for name in row["cudnn"]["packages"]})
    expected.update({name: row["nccl"]["package_version"] for name in row["nccl"]["packages"]})
    assert {name: p.version for name, p in packages.items()} == expected
    assert packages["cuda-keyring"].architecture == "all"
    assert all(p.architecture == "amd64" for name, p in packages.items() if name != "cuda-keyring")


def test_dependencies_are_exact(packages):
    assert packages["cuda-toolkit-12-1"].depends == [
        "cuda-nvcc-12-1 (= 12.1.105-1)",
        "cuda-cudart-12-1 (= 12.1.105-1)",
        "cuda-cudart-dev-12-1 (= 12.1.105-1)",
        "cuda-nvrtc-12-1 (= 12.1.105-1)",
        "cuda-nvrtc-dev-12-1 (= 12.1.105-1)",
    ]
    assert packages["cuda-cudart-dev-12-1"].depends == ["cuda-cudart-12-1 (= 12.1.105-1)"]
    assert packages["cuda-nvrtc-dev-12-1"].depends == ["cuda-nvrtc-12-1 (= 12.1.105-1)"]
    assert packages["libcudnn8-dev"].depends == ["libcudnn8 (= 8.9.2.26-1+cuda12.1)"]
    assert packages["libnccl-dev"].depends == ["libnccl2 (= 2.18.1-1+cuda12.1)"]


def test_layout_follows_nvidia(packages):
    home = "/usr/local/cuda-12.1"
    assert packages["cuda-cudart-12-1"].links[f"{home}/lib64"] == "targets/x86_64-linux/lib"
    assert packages["cuda-cudart-dev-12-1"].links[f"{home}/include"] == "targets/x86_64-linux/include"
    lib = f"{home}/targets/x86_64-linux/lib"
    assert packages["cuda-nvrtc-12-1"].links[f"{lib}/libnvrtc.so.12"] == "libnvrtc.so.12.1.105"
    assert packages["libcudnn8"].links["/usr/lib/x86_64-linux-gnu/libcudnn.so.8"] == "libcudnn.so.8.9.2"
    assert packages["libnccl2"].links["/usr/lib/x86_64-linux-gnu/libnccl.so.2"] == "libnccl.so.2.18.1"
    nvcc_dests = {i.dest for i in packages["cuda-nvcc-12-1"].installs}
    assert f"{home}/bin/ptxas" in nvcc_dests
    assert not any(d.endswith("/nvcc") for d in nvcc_dests), "the wheel has no nvcc driver: none may be invented"


def test_descriptions_name_the_wheel_and_the_fixtures(packages):
    for name, package in packages.items():
        description = builder.render_control(package.control_fields())
        if package.wheel:
            assert package.wheel.requirement in " ".join(description.split()), name
        if name.startswith("libcudnn") or name == "cuda-keyring":
            assert "gpufleet lab fixture:" in description, name


def test_keyring_source_and_conffile(packages):
    keyring = packages["cuda-keyring"]
    source = keyring.contents["/etc/apt/sources.list.d/cuda-debian12-x86_64.list"].decode()
    assert source == f"deb [signed-by=/usr/share/keyrings/cuda-archive-keyring.gpg] {REPO_URL} /\n"
    assert keyring.conffiles == ["/etc/apt/sources.list.d/cuda-debian12-x86_64.list"]
    assert keyring.contents["/usr/share/keyrings/cuda-archive-keyring.gpg"] == b"KEY"
    assert "trusted=yes" not in SCRIPT.read_text()


def test_control_fields_carry_maintainer_and_installed_size(packages):
    fields = packages["libnccl2"].control_fields(installed_size=42)
    assert fields["Maintainer"] == "gpufleet lab <lab@gpufleet.invalid>"
    assert fields["Installed-Size"] == "42"
    assert list(fields)[:5] == ["Package", "Version", "Architecture", "Maintainer", "Installed-Size"]


def test_release_hash_and_index_helpers(tmp_path):
    release = "Origin: x\nSHA256:\n abc 10 Packages\n def 5 Packages.gz\n"
    assert builder.release_hash_of(release, "Packages") == "abc"
    assert builder.release_hash_of(release, "Sources") is None
    unsorted = (
        "Package: b\nVersion: 1\nFilename: ./b.deb\nSize: 3\n\nPackage: a\nVersion: 1\nFilename: ./a.deb\nSize: 2\n"
    )
    assert builder.sort_packages(unsorted).startswith("Package: a\n")
    (tmp_path / "a.deb").write_bytes(b"aa")
    (tmp_path / "b.deb").write_bytes(b"bbb")
    assert builder.index_matches(unsorted, tmp_path)
    (tmp_path / "b.deb").write_bytes(b"b")
    assert not builder.index_matches(unsorted, tmp_path)


def test_installed_size_counts_like_dpkg(tmp_path):
    (tmp_path / "DEBIAN").mkdir()
    (tmp_path / "DEBIAN" / "control").write_text("x" * 5000)
    (tmp_path / "usr").mkdir()
    (tmp_path / "usr" / "f").write_bytes(b"x" * 1025)
    (tmp_path / "usr" / "l").symlink_to("f")
    assert builder.installed_size_kib(tmp_path) == 1 + 2 + 1  # usr/, f (2 KiB), l


# --------------------------------------------------------------------------- the site repository's place


def test_the_repository_has_a_path_and_an_origin_of_its_own():
    """Not NVIDIA's compute/cuda/repos/debian12/x86_64 (which has no CUDA 12.1), nor NVIDIA's Release fields."""
    assert builder.repo_path("12.1") == "site/cuda-12.1/debian12"
    assert "compute/cuda/repos" not in builder.repo_path("12.1") and "x86_64" not in builder.repo_path("12.1")
    assert builder.RELEASE_FIELDS["Origin"] == "gpufleet-lab-site"
    assert "NVIDIA" not in builder.RELEASE_FIELDS["Origin"] + builder.RELEASE_FIELDS["Label"]


def test_the_lab_inventory_names_the_repository_the_lab_builds_as_the_site_repository():
    """tests/lab/lab.yml builds the repository where the lab inventory's cuda_repository_url points the nodes."""
    path = builder.repo_path(LAB_VARS["lab_cuda_release"])
    assert LAB_INVENTORY["cuda_repository_url"] == "{{ lab_mirror_url }}/" + path
    assert '__lab_cuda_repo: "{{ __lab_mirror_root }}/site/cuda-{{ lab_cuda_release }}/debian12"' in LAB_PLAYBOOK
    assert "'site/cuda-{{ lab_cuda_release }}/debian12/InRelease'" in LAB_PLAYBOOK
    assert "cuda/debian12/x86_64" not in LAB_PLAYBOOK
