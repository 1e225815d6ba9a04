"""A wheel source on 127.0.0.1 for the tests of play 1's wheel plan: real wheels, served the ways sites serve them.

``build_wheels`` builds tiny real wheels with ``pip wheel`` (setuptools, no
network) from dummy projects; ``WheelSource`` serves them over HTTP:

* ``/simple/<project>/``: a PEP 503 project page (what download.pytorch.org/whl/cu121 and PyPI serve), each
  anchor with ``#sha256=`` and, when ``metadata`` is on, the PEP 658/714 attributes
  (``data-dist-info-metadata`` and ``data-core-metadata``) whose ``.metadata`` file sits beside the wheel;
  a project's files may live on another host (``file_hosts``: PyPI's pages link to files.pythonhosted.org, and
  download.pytorch.org/whl/mpmath/ does too, https://github.com/pytorch/pytorch/issues/197552);
* ``/wheels/``: a flat directory listing in nginx's autoindex format (the lab mirror's wheelhouse,
  tests/lab/files/nginx-mirror.conf), no metadata files;
* the files, with HEAD and single byte ranges (``Range: bytes=a-b`` and ``bytes=-n``) as nginx and S3 answer them.

Every request is recorded with the bytes its body carried, so that a test can say what a client fetched.
"""

from __future__ import annotations

import email.utils
import hashlib
import html
import http.server
import re
import socket
import subprocess
import sys
import threading
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import unquote


@dataclass(frozen=True)
class Project:
    """A dummy project: ``pip wheel`` builds it into one py3-none-any wheel."""

    name: str
    version: str
    requires: tuple[str, ...] = ()
    # Bytes of a data file in the wheel (a large wheel shows whether a client downloaded it).
    payload: int = 0


@dataclass(frozen=True)
class Wheel:
    filename: str
    project: str
    version: str
    data: bytes
    metadata: bytes

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.data).hexdigest()


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def build_wheels(projects: list[Project], workdir: Path) -> dict[str, Wheel]:
    """Build the projects with ``pip wheel --no-build-isolation`` (this interpreter's pip and setuptools)."""
    out = workdir / "dist"
    out.mkdir(parents=True, exist_ok=True)
    sources = []
    for project in projects:
        source = workdir / "src" / f"{project.name}-{project.version}"
        module = canonical(project.name).replace("-", "_")
        (source / module).mkdir(parents=True)
        (source / module / "__init__.py").write_text(f'__version__ = "{project.version}"\n')
        package_data = ""
        if project.payload:
            # Incompressible, so that the wheel is as large as the payload.
            (source / module / "payload.bin").write_bytes(
                hashlib.shake_256(project.name.encode()).digest(project.payload)
            )
            package_data = f'\n[tool.setuptools.package-data]\n{module} = ["payload.bin"]\n'
        requires = ", ".join(f"'{r}'" for r in project.requires)  # TOML literal strings: markers keep their quotes
        (source / "pyproject.toml").write_text(
            '[build-system]\nrequires = ["setuptools"]\nbuild-backend = "setuptools.build_meta"\n\n'
            f'[project]\nname = "{project.name}"\nversion = "{project.version}"\ndependencies = [{requires}]\n'
            f'requires-python = ">=3.8"\n\n[tool.setuptools]\npackages = ["{module}"]\n{package_data}'
        )
        sources.append((canonical(project.name), str(source)))
    # One pip run per batch of distinct names (pip refuses two versions of a project in one run).
    batches: list[dict[str, str]] = []
    for name, source in sources:
        batch = next((b for b in batches if name not in b), None)
        if batch is None:
            batch = {}
            batches.append(batch)
        batch[name] = source
    for batch in batches:
        subprocess.run(
            [
                sys.executable,
                "-I",
                "-m",
                "pip",
                "wheel",
                "--quiet",
                "--no-build-isolation",
                "--no-deps",
                "--no-index",
                "--wheel-dir",
                str(out),
                *batch.values(),
            ],
            check=True,
            capture_output=True,
        )
    wheels: dict[str, Wheel] = {}
    for built in sorted(out.glob("*.whl")):
        with zipfile.ZipFile(built) as archive:
            metadata = archive.read(next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA")))
        name, version = built.name.split("-")[:2]
        wheels[built.name] = Wheel(built.name, canonical(name), version, built.read_bytes(), metadata)
    assert len(wheels) == len(projects), sorted(wheels)
    return wheels


def closed_port() -> int:
    """A port on 127.0.0.1 that nothing listens on (bound, then closed): a host that does not answer."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@dataclass
class Request:
    method: str
    path: str
    status: int
    range: str | None
    body_bytes: int


@dataclass
class WheelSource:
    """The wheels served on 127.0.0.1 (start() ... stop(), or as a context manager)."""

    wheels: dict[str, Wheel]
    metadata: bool = True
    # project -> base URL its files are linked at (another host); default: this server's /files/.
    file_hosts: dict[str, str] = field(default_factory=dict)
    # Files left out of every listing (a wheel gone from the index, its metadata with it), and files still listed
    # (their .metadata too) whose own URL answers 404 (a listing that outlived the file).
    unlisted: set[str] = field(default_factory=set)
    gone: set[str] = field(default_factory=set)
    # Byte ranges and HEAD answered (nginx, S3); off: a server that sends the whole file and refuses HEAD (405).
    ranges: bool = True
    head: bool = True
    # A base URL the wheels redirect to (302), as an index hands its files to a CDN; empty: served here.
    redirect: str = ""
    requests: list[Request] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        self._server: http.server.ThreadingHTTPServer | None = None

    # ------------------------------------------------------------------ pages
    def url(self, path: str = "") -> str:
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.server_address[1]}{path}"

    def _listed(self) -> list[Wheel]:
        return [w for name, w in sorted(self.wheels.items()) if name not in self.unlisted]

    def file_url(self, wheel: Wheel) -> str:
        return self.file_hosts.get(wheel.project, self.url("/files/")) + wheel.filename

    def project_page(self, project: str) -> bytes | None:
        files = [w for w in self._listed() if w.project == project]
        if not files and project not in {w.project for w in self.wheels.values()}:
            return None
        anchors = []
        for wheel in files:
            attrs = ""
            if self.metadata:
                digest = hashlib.sha256(wheel.metadata).hexdigest()
                attrs = (
                    f' data-requires-python="&gt;=3.8" data-dist-info-metadata="sha256={digest}" '
                    f'data-core-metadata="sha256={digest}"'
                )
            anchors.append(
                f'    <a href="{html.escape(self.file_url(wheel))}#sha256={wheel.sha256}"{attrs}>'
                f"{wheel.filename}</a><br/>"
            )
        return (
            "<!DOCTYPE html>\n<html>\n  <body>\n    <h1>Links for "
            + project
            + "</h1>\n"
            + "\n".join(anchors)
            + "\n  </body>\n</html>\n"
        ).encode()

    def root_page(self) -> bytes:
        projects = sorted({w.project for w in self.wheels.values()})
        return (
            "<!DOCTYPE html>\n<html>\n  <body>\n"
            + "".join(f'    <a href="/simple/{p}/">{p}</a><br/>\n' for p in projects)
            + "  </body>\n</html>\n"
        ).encode()

    def autoindex(self) -> bytes:
        """/wheels/ as nginx's autoindex lists a directory (name cut at 50 characters, date, size)."""
        rows = []
        for wheel in self._listed():
            shown = wheel.filename if len(wheel.filename) <= 50 else wheel.filename[:47] + "..&gt;"
            rows.append(
                f'<a href="{wheel.filename}">{shown}</a>{" " * max(1, 51 - len(shown))}29-Nov-2026 19:32 '
                f"{len(wheel.data):>19}"
            )
        return (
            "<html>\r\n<head><title>Index of /wheels/</title></head>\r\n<body>\r\n<h1>Index of /wheels/</h1><hr><pre>"
            '<a href="../">../</a>\r\n' + "\r\n".join(rows) + "\r\n</pre><hr></body>\r\n</html>\r\n"
        ).encode()

    # ------------------------------------------------------------------ serving
    def _resolve(self, path: str) -> tuple[bytes, str] | None:
        path = unquote(path.split("?", 1)[0].split("#", 1)[0])
        if path in ("/simple", "/simple/"):
            return self.root_page(), "text/html"
        match = re.fullmatch(r"/simple/([^/]+)/?", path)
        if match:
            page = self.project_page(canonical(match[1]))
            return (page, "text/html") if page is not None else None
        if path == "/wheels/":
            return self.autoindex(), "text/html"
        match = re.fullmatch(r"/(?:files|wheels)/([^/]+)", path)
        if not match:
            return None
        name = match[1]
        if name.endswith(".metadata"):
            wheel = self.wheels.get(name[: -len(".metadata")])
            if wheel is None or not self.metadata or wheel.filename in self.unlisted:
                return None
            return wheel.metadata, "binary/octet-stream"
        wheel = self.wheels.get(name)
        if wheel is None or name in self.gone or name in self.unlisted:
            return None
        if self.redirect:
            return b"", "redirect:" + self.redirect + name
        return wheel.data, "binary/octet-stream"

    def _handler(self) -> type[http.server.BaseHTTPRequestHandler]:
        source = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:  # quiet
                pass

            def _answer(self, with_body: bool) -> None:
                found = source._resolve(self.path)
                requested_range = self.headers.get("Range")
                if not with_body and not source.head:
                    body, status, headers = b"", 405, {"Allow": "GET"}
                elif found is None:
                    body, status, headers = (
                        b"<html><body><h1>404 Not Found</h1></body></html>",
                        404,
                        {"Content-Type": "text/html"},
                    )
                elif found[1].startswith("redirect:"):
                    body, status, headers = b"", 302, {"Location": found[1][len("redirect:") :]}
                else:
                    data, kind = found
                    body, status, headers = (
                        data,
                        200,
                        {"Content-Type": kind, "Last-Modified": email.utils.formatdate(0, usegmt=True)},
                    )
                    if source.ranges:
                        headers["Accept-Ranges"] = "bytes"
                    match = re.fullmatch(r"bytes=(\d*)-(\d*)", requested_range or "")
                    if source.ranges and match and (match[1] or match[2]):
                        size = len(data)
                        if match[1]:
                            start, end = int(match[1]), min(int(match[2]) if match[2] else size - 1, size - 1)
                        else:
                            start, end = max(0, size - int(match[2])), size - 1
                        body, status = data[start : end + 1], 206
                        headers["Content-Range"] = f"bytes {start}-{end}/{size}"
                headers["Content-Length"] = str(len(body))
                self.send_response(status)
                for key, value in headers.items():
                    self.send_header(key, value)
                self.end_headers()
                if with_body:
                    self.wfile.write(body)
                with source._lock:
                    source.requests.append(
                        Request(self.command, self.path, status, requested_range, len(body) if with_body else 0)
                    )

            def do_GET(self) -> None:  # noqa: N802 (http.server's names)
                self._answer(True)

            def do_HEAD(self) -> None:  # noqa: N802
                self._answer(False)

        return Handler

    def start(self) -> WheelSource:
        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()

    def __enter__(self) -> WheelSource:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def bytes_fetched(self, kind: str | None = None) -> int:
        """Body bytes sent: all, or of one kind ('page', 'metadata', 'wheel')."""

        def kind_of(path: str) -> str:
            path = path.split("#", 1)[0]
            return "metadata" if path.endswith(".metadata") else ("wheel" if path.endswith(".whl") else "page")

        return sum(r.body_bytes for r in self.requests if kind is None or kind_of(r.path) == kind)
