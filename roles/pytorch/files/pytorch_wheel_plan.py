"""gpufleet pytorch role, play 1: the exact wheel set pip would install, and whether each of its files can be fetched.

Run by the interpreter the environment is (or will be) made with, in a throwaway directory that holds
pip as a zip (lookup gpufleet.fleet.pip_zipapp):

    python -I -c <this> '<JSON config>'      the requirement lines on stdin

config: {"pip": "<dir>/pip.pyz", "pip_args": [the install's source and extra options],
         "min_python": "3.9", "timeout": 60}

or, on a host whose interpreter and platform are another's that resolved the set already (the action
gpufleet.fleet.wheel_plan resolves once per such group), without pip:

    python -I -c <this> '{"resolved": true, "pip_args": [...], "timeout": 60}'
        that host's {"pip", "report_version", "install"} as JSON on stdin: step 1 is skipped, step 2 is this host's

1. pip resolves the requirements as the install would, without installing or downloading them:
   ``pip install --dry-run --ignore-installed --report`` (https://pip.pypa.io/en/stable/reference/installation-report/),
   wheels only (nothing is built), no cache, its temporary files in the throwaway directory (TMPDIR). It reads
   the index pages and each file's PEP 658 metadata, or, where an index has none (a wheelhouse, an older
   index), the wheel's zip directory and METADATA through HTTP range requests (--use-feature=fast-deps). A
   source that offers neither would make pip download the whole wheel: pip is stopped at the first such
   download, and the output says which file.
2. Each distinct file URL of the resolution, and each index and find-links URL of pip_args (pip says
   nothing of an index it cannot reach: it finds no files there), is asked for with HEAD (redirects followed; GET of one
   byte where HEAD is refused), through --proxy, --cert, --client-cert and
   --trusted-host of pip_args as pip uses them, else the environment's proxy variables.

Prints one JSON line; the controller judges it (the gpufleet.fleet.wheel_plan filter):
  {"python": "3.11.2", "machine": "x86_64", "skipped": "" or why nothing ran,
   "pip": {"rc": 0, "stdout": [last lines], "stderr": [last lines], "collecting": [pip's "Collecting ..." lines],
           "stopped_download": "" or the URL of the wheel pip began to download},
   "report_version": "1", "install": [{"name", "version", "url", "requested", "requires_dist", "sha256"}],
   "fetch": [{"url", "status", "final_url", "error"}], "sources": [the same, of the index and find-links URLs]}
Written for every Python the role supports (3.8 on): standard library only.
"""

import json
import os
import re
import ssl
import subprocess
import sys
import threading
import urllib.error
import urllib.parse
import urllib.request
from concurrent.futures import ThreadPoolExecutor

# pip's line for a file it downloads whole (not a .metadata file): "  Downloading http://.../x.whl (2.0 MB)".
WHOLE_WHEEL = re.compile(r"^\s*Downloading (\S+?\.whl)(?: \(|$)")
KEEP_LINES = 40


def option_values(args, name):
    """The values of pip option ``name`` in ``args`` (--name VALUE and --name=VALUE)."""
    values = []
    for index, arg in enumerate(args):
        if arg == name and index + 1 < len(args):
            values.append(args[index + 1])
        elif arg.startswith(name + "="):
            values.append(arg[len(name) + 1 :])
    return values


class KeepMethod(urllib.request.HTTPRedirectHandler):
    """Follow a redirect with the same method (urllib turns a redirected HEAD into a GET of the whole file),
    noting each place it leads to (a host that does not answer is the last one)."""

    def __init__(self, trail):
        urllib.request.HTTPRedirectHandler.__init__(self)
        self.trail = trail

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        new = urllib.request.HTTPRedirectHandler.redirect_request(self, req, fp, code, msg, headers, newurl)
        if new is not None:
            new.method = req.get_method()
            self.trail.append(newurl)
        return new


def opener(pip_args, host, trail):
    """A urllib opener for ``host`` that goes the way pip's options send pip."""
    handlers = [KeepMethod(trail)]
    proxies = option_values(pip_args, "--proxy")
    if proxies:
        handlers.append(urllib.request.ProxyHandler({"http": proxies[-1], "https": proxies[-1]}))
    trusted = option_values(pip_args, "--trusted-host")
    context = tls_context(
        (option_values(pip_args, "--cert") or [None])[-1],
        (option_values(pip_args, "--client-cert") or [None])[-1],
        host in trusted or host.rsplit(":", 1)[0] in trusted,
    )
    handlers.append(urllib.request.HTTPSHandler(context=context))
    return urllib.request.build_opener(*handlers)


TLS_CONTEXTS = {}
TLS_LOCK = threading.Lock()


def tls_context(cafile, client_cert, trusted):
    """The TLS context of pip's --cert, --client-cert and --trusted-host, made once per distinct combination (under a
    lock: the HEADs run eight at a time). Loading the CA bundle costs ~30 ms of CPU, which each of a wheel set's ~20
    HEADs paid before (issue 30)."""
    with TLS_LOCK:
        key = (cafile, client_cert, trusted)
        if key not in TLS_CONTEXTS:
            context = ssl.create_default_context(cafile=cafile)
            if client_cert:
                context.load_cert_chain(client_cert)
            if trusted:
                context.check_hostname = False
                context.verify_mode = ssl.CERT_NONE
            TLS_CONTEXTS[key] = context
        return TLS_CONTEXTS[key]


def fetch(url, pip_args, timeout):
    """HEAD ``url``: {"url", "status", "final_url", "error"} (status 0: no answer)."""
    host = urllib.parse.urlsplit(url).netloc
    result = {"url": url, "status": 0, "final_url": url, "error": ""}
    for method, headers in (("HEAD", {}), ("GET", {"Range": "bytes=0-0"})):
        request = urllib.request.Request(
            url, method=method, headers=dict(headers, **{"User-Agent": "gpufleet-wheel-plan"})
        )
        trail = [url]
        try:
            with opener(pip_args, host, trail).open(request, timeout=timeout) as response:
                result.update(status=response.status, final_url=response.geturl(), error="")
        except urllib.error.HTTPError as error:
            result.update(status=error.code, final_url=error.geturl() or trail[-1], error=str(error.reason))
            if method == "HEAD" and error.code in (405, 501):
                continue
        except (urllib.error.URLError, OSError, ValueError) as error:
            result.update(status=0, final_url=trail[-1], error=str(getattr(error, "reason", error)))
        return result
    return result


def run_pip(config, requirements, workdir):
    report = os.path.join(workdir, "report.json")
    lines = os.path.join(workdir, "requirements.txt")
    with open(lines, "w") as handle:
        handle.write(requirements)
    # -u: pip's lines arrive as it writes them (a whole-wheel download is stopped at its first line).
    command = [
        sys.executable,
        "-I",
        "-u",
        config["pip"],
        "install",
        "--dry-run",
        "--ignore-installed",
        "--no-cache-dir",
        "--progress-bar",
        "off",
        "--only-binary=:all:",
        "--use-feature=fast-deps",
        "--report",
        report,
    ]
    command += list(config.get("pip_args") or []) + ["-r", lines]
    env = dict(
        os.environ, TMPDIR=workdir, PIP_CONFIG_FILE=os.devnull, PIP_DISABLE_PIP_VERSION_CHECK="1", PIP_NO_INPUT="1"
    )
    process = subprocess.Popen(
        command,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
        cwd=workdir,
        universal_newlines=True,
    )
    stderr = []
    reader = threading.Thread(target=lambda: stderr.extend(process.stderr))
    reader.start()
    stdout, collecting, stopped = [], [], ""
    for line in process.stdout:
        line = line.rstrip("\n")
        stdout.append(line)
        if line.startswith("Collecting "):
            collecting.append(line)
        whole = WHOLE_WHEEL.match(line)
        if whole and not stopped:
            stopped = whole.group(1)
            process.terminate()
    process.wait()
    reader.join()
    result = {
        "rc": process.returncode,
        "stdout": stdout[-KEEP_LINES:],
        "stderr": [line.rstrip("\n") for line in stderr][-KEEP_LINES:],
        "collecting": collecting,
        "stopped_download": stopped,
    }
    data = None
    if process.returncode == 0 and not stopped and os.path.exists(report):
        with open(report) as handle:
            data = json.load(handle)
    return result, data


def installs(report):
    """The report's items, reduced to what the plan needs."""
    items = []
    for item in report.get("install", []):
        info = item.get("download_info") or {}
        hashes = (info.get("archive_info") or {}).get("hashes") or {}
        metadata = item.get("metadata") or {}
        items.append(
            {
                "name": metadata.get("name", ""),
                "version": metadata.get("version", ""),
                "url": info.get("url", ""),
                "requested": bool(item.get("requested")),
                "requires_dist": metadata.get("requires_dist") or [],
                "sha256": hashes.get("sha256", ""),
            }
        )
    return items


def fetch_all(urls, pip_args, timeout):
    """fetch() of each URL, eight at a time."""
    with ThreadPoolExecutor(max_workers=8) as pool:
        return list(pool.map(lambda url: fetch(url, pip_args, timeout), urls))


def main(argv):
    config = json.loads(argv[1])
    stdin = sys.stdin.read()
    timeout = float(config.get("timeout") or 60)
    out = {
        "python": "%d.%d.%d" % sys.version_info[:3],
        "machine": os.uname().machine,
        "skipped": "",
        "pip": {},
        "report_version": "",
        "install": [],
        "fetch": [],
        "sources": [],
    }
    minimum = tuple(int(p) for p in (config.get("min_python") or "0.0").split("."))
    pip_args = config.get("pip_args") or []
    if config.get("resolved"):
        resolved = json.loads(stdin)
        for name in ("pip", "report_version", "install"):
            out[name] = resolved[name]
        out["fetch"] = fetch_all(sorted({item["url"] for item in out["install"] if item["url"]}), pip_args, timeout)
    elif sys.version_info[:2] < minimum:
        out["skipped"] = "pip %s runs on Python %s or newer, %s is %d.%d" % (
            config.get("pip_version", ""),
            config.get("min_python"),
            sys.executable,
            sys.version_info[0],
            sys.version_info[1],
        )
    else:
        out["pip"], report = run_pip(config, stdin, os.path.dirname(config["pip"]))
        if report is not None:
            out["report_version"] = str(report.get("version", ""))
            out["install"] = installs(report)
            out["fetch"] = fetch_all(sorted({item["url"] for item in out["install"] if item["url"]}), pip_args, timeout)
    if not out["skipped"]:
        sources = [
            url
            for name in ("--index-url", "-i", "--extra-index-url", "--find-links", "-f")
            for url in option_values(pip_args, name)
            if url.startswith(("http://", "https://"))
        ]
        out["sources"] = [fetch(url, pip_args, timeout) for url in sources]
    print(json.dumps(out, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
