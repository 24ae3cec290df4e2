"""The benchmark's one origin: nginx serving the data set as plain HTTP, path-style S3 and a Hub-shaped API.

Role: write the static answers the three faces need (per-bucket ListObjectsV2 XML, per-repo revision and
tree JSON), write an nginx configuration around them, and run nginx in the foreground as a child process
on a loopback port (``worker_processes 1``: the other core is the client's; ``sendfile on``;
``access_log off``). nginx comes from Debian's ``nginx-light``; :func:`ensure_debian_packages` installs it
with apt-get when missing and running as root, or says exactly what to install.

Faces (one server, one port):

* plain HTTP: ``GET /plain/<bucket>/<file>``.
* S3, path-style, anonymous: ``GET/HEAD /<bucket>/<key>`` with Range; ``GET /<bucket>`` (any query) is an
  exact-match location returning the bucket's pre-built ListObjectsV2 XML. ETags are nginx's own
  (``"<mtime hex>-<size hex>"``) and the listing carries the same values, so ``If-Match`` (the agent pins
  every range to the listed ETag) and listing-vs-HEAD comparisons agree. nginx ETags are not MD5s (they
  contain ``-``, so S3 clients treat them as multipart and do not check them as MD5); HEAD answers carry
  ``x-amz-checksum-sha256`` + ``x-amz-checksum-type: FULL_OBJECT`` instead, the strongest checksum an S3
  store publishes. HEAD carries them, and a whole GET (no ``Range``) sent with ``x-amz-checksum-mode: ENABLED``, as
  S3 does (the agent's one-request path for small objects reads them there); a ranged GET never does: a
  whole-object checksum on a part would make botocore validate the part against the whole.
* Hub: ``/api/models/bench/<bucket>[/revision/<rev>]`` (model info with the commit ``sha``),
  ``/api/models/bench/<bucket>/tree/<rev>`` (files with size, blob ``oid`` and, for ``*.safetensors``,
  ``lfs.oid`` = sha256), and ``/bench/<bucket>/resolve/<rev>/<file>`` with ``X-Repo-Commit`` plus, for LFS
  files, ``X-Linked-Etag`` (the sha256) and ``X-Linked-Size`` — what huggingface_hub's metadata HEAD reads
  (``HF_HUB_DISABLE_XET=1``: no Xet headers, so it downloads over plain HTTP).
"""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
import json
import os
import pwd
import shutil
import socket
import subprocess
import time
from pathlib import Path

from bench.download_data import BUCKETS, DataSet

HUB_ORG = "bench"


def ensure_debian_packages(packages: dict[str, str]) -> list[str]:
    """Install missing Debian packages (``{binary: package}``) when root; return the packages still missing."""
    missing = [pkg for binary, pkg in packages.items() if shutil.which(binary) is None]
    if missing and os.geteuid() == 0 and shutil.which("apt-get"):
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        install = ["apt-get", "install", "-y", "-qq", *missing]
        if subprocess.run(install, env=env, capture_output=True).returncode != 0:
            subprocess.run(["apt-get", "update", "-qq"], env=env, capture_output=True)
            subprocess.run(install, env=env, capture_output=True)
    return [pkg for binary, pkg in packages.items() if shutil.which(binary) is None]


def nginx_etag(path: Path) -> str:
    """The ETag nginx sends for a static file: ``"<mtime seconds hex>-<size hex>"``."""
    st = path.stat()
    return f'"{int(st.st_mtime):x}-{st.st_size:x}"'


def hub_commit(data: DataSet, bucket: str) -> str:
    listing = "".join(f"{f.path}\0{f.sha256}\n" for f in data.bucket(bucket))
    return hashlib.sha1(f"{bucket}\n{listing}".encode(), usedforsecurity=False).hexdigest()


def _listing_xml(data: DataSet, bucket: str) -> str:
    rows = []
    for f in data.bucket(bucket):
        path = data.origin / bucket / f.path
        mtime = dt.datetime.fromtimestamp(int(path.stat().st_mtime), tz=dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.000Z")
        etag = nginx_etag(path).replace('"', "&quot;")
        rows.append(
            f"<Contents><Key>{f.path}</Key><LastModified>{mtime}</LastModified><ETag>{etag}</ETag>"
            f"<Size>{f.size}</Size><StorageClass>STANDARD</StorageClass></Contents>"
        )
    return (
        '<?xml version="1.0" encoding="UTF-8"?>\n'
        '<ListBucketResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/">'
        f"<Name>{bucket}</Name><Prefix></Prefix><KeyCount>{len(rows)}</KeyCount><MaxKeys>1000</MaxKeys>"
        f"<IsTruncated>false</IsTruncated>{''.join(rows)}</ListBucketResult>\n"
    )


def _hub_info(data: DataSet, bucket: str) -> dict[str, object]:
    repo = f"{HUB_ORG}/{bucket}"
    return {
        "_id": hub_commit(data, bucket)[:24],
        "id": repo,
        "modelId": repo,
        "sha": hub_commit(data, bucket),
        "private": False,
        "disabled": False,
        "gated": False,
        "downloads": 0,
        "likes": 0,
        "tags": [],
        "lastModified": "2026-11-29T00:00:00.000Z",
        "createdAt": "2026-11-29T00:00:00.000Z",
        "siblings": [{"rfilename": f.path} for f in data.bucket(bucket)],
    }


def _hub_tree(data: DataSet, bucket: str) -> list[dict[str, object]]:
    tree: list[dict[str, object]] = []
    for f in data.bucket(bucket):
        entry: dict[str, object] = {"type": "file", "oid": f.git_sha1, "size": f.size, "path": f.path}
        if f.lfs:
            entry["lfs"] = {"oid": f.sha256, "size": f.size, "pointerSize": 134}
        tree.append(entry)
    return tree


def nginx_config(data: DataSet, work: Path, port: int) -> str:
    meta, state = work / "meta", work / "nginx"
    s3_checksum, hub_etag, hub_size, commits = [], [], [], []
    for bucket in BUCKETS:
        commits.append(f"    {bucket} {hub_commit(data, bucket)};")
        for f in data.bucket(bucket):
            b64 = base64.b64encode(bytes.fromhex(f.sha256)).decode()
            for mode in ("on", "off"):  # HEAD always carries them; a GET only whole and with checksum mode on
                s3_checksum.append(f'    "{mode} HEAD /{bucket}/{f.path}" "{b64}";')
            s3_checksum.append(f'    "on GET /{bucket}/{f.path}" "{b64}";')
            if f.lfs:
                hub_etag.append(f'    "{bucket}/{f.path}" "\\"{f.sha256}\\"";')
                hub_size.append(f'    "{bucket}/{f.path}" "{f.size}";')
    user = f"user {pwd.getpwuid(os.geteuid()).pw_name};" if os.geteuid() == 0 else ""
    nl = "\n"
    return f"""{user}
worker_processes 1;
pid {state}/nginx.pid;
error_log {state}/error.log warn;
events {{ worker_connections 1024; }}
http {{
  types {{ application/json json; application/xml xml; text/plain txt md; }}
  default_type application/octet-stream;
  sendfile on;
  tcp_nopush on;
  access_log off;
  keepalive_requests 100000;
  keepalive_timeout 65;
  client_body_temp_path {state}/body;
  proxy_temp_path {state}/proxy;
  fastcgi_temp_path {state}/fastcgi;
  uwsgi_temp_path {state}/uwsgi;
  scgi_temp_path {state}/scgi;
  map "$http_x_amz_checksum_mode|$http_range" $s3_mode {{ default "off"; "ENABLED|" "on"; }}
  map "$s3_mode $request_method $uri" $s3_sha256 {{
    default "";
{nl.join(s3_checksum)}
  }}
  map $s3_sha256 $s3_checksum_type {{ "" ""; default "FULL_OBJECT"; }}
  # Keyed on the resolve location's captures: try_files rewrites $uri to the file's path.
  map "$hub_bucket/$hub_path" $hub_linked_etag {{
    default "";
{nl.join(hub_etag)}
  }}
  map "$hub_bucket/$hub_path" $hub_linked_size {{
    default "";
{nl.join(hub_size)}
  }}
  map $hub_bucket $hub_commit {{
    default "";
{nl.join(commits)}
  }}
  server {{
    listen 127.0.0.1:{port};
    root {data.origin};
    location / {{
      add_header x-amz-checksum-sha256 $s3_sha256;
      add_header x-amz-checksum-type $s3_checksum_type;
    }}
    location ~ ^/(?<s3_bucket>w[123])$ {{
      default_type application/xml;
      root {meta};
      try_files /s3/$s3_bucket.xml =404;
    }}
    location /plain/ {{ alias {data.origin}/; }}
    location ~ ^/api/models/{HUB_ORG}/(?<hub_bucket>w[123])(/revision/.*)?$ {{
      default_type application/json;
      root {meta};
      try_files /hub/$hub_bucket/info.json =404;
    }}
    location ~ ^/api/models/{HUB_ORG}/(?<hub_bucket>w[123])/tree/ {{
      default_type application/json;
      root {meta};
      try_files /hub/$hub_bucket/tree.json =404;
    }}
    location ~ ^/{HUB_ORG}/(?<hub_bucket>w[123])/resolve/[^/]+/(?<hub_path>.+)$ {{
      try_files /$hub_bucket/$hub_path =404;
      add_header X-Repo-Commit $hub_commit always;
      add_header X-Linked-Etag $hub_linked_etag;
      add_header X-Linked-Size $hub_linked_size;
    }}
  }}
}}
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class NginxOrigin:
    """nginx in the foreground on ``127.0.0.1:<port>``; ``with NginxOrigin(data, work) as origin:``."""

    def __init__(self, data: DataSet, work: Path, port: int | None = None) -> None:
        self.data = data
        self.work = work
        self.port = port or free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def version(self) -> str:
        out = subprocess.run(["nginx", "-v"], capture_output=True, text=True)
        return (out.stderr or out.stdout).strip().removeprefix("nginx version: ")

    def write_static(self) -> None:
        meta = self.work / "meta"
        for bucket in BUCKETS:
            (meta / "s3").mkdir(parents=True, exist_ok=True)
            (meta / "s3" / f"{bucket}.xml").write_text(_listing_xml(self.data, bucket))
            (meta / "hub" / bucket).mkdir(parents=True, exist_ok=True)
            (meta / "hub" / bucket / "info.json").write_text(json.dumps(_hub_info(self.data, bucket)))
            (meta / "hub" / bucket / "tree.json").write_text(json.dumps(_hub_tree(self.data, bucket)))

    def start(self) -> None:
        missing = ensure_debian_packages({"nginx": "nginx-light"})
        if missing:
            raise RuntimeError("nginx is missing: run `apt-get install -y nginx-light` as root (Debian)")
        self.write_static()
        state = self.work / "nginx"
        state.mkdir(parents=True, exist_ok=True)
        conf = state / "nginx.conf"
        conf.write_text(nginx_config(self.data, self.work, self.port))
        log = (state / "stderr.log").open("wb")
        self.proc = subprocess.Popen(
            ["nginx", "-p", str(state), "-e", str(state / "error.log"), "-c", str(conf), "-g", "daemon off;"],
            stdout=log,
            stderr=log,
        )
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"nginx exited: {(state / 'error.log').read_text()[-2000:]}")
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
                return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError("nginx did not listen within 10 s")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self.proc = None

    def __enter__(self) -> NginxOrigin:
        self.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.stop()
