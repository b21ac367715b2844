"""A real HTTP server that answers the Hugging Face Hub's endpoints huggingface_hub calls, for repositories made
of local files: tests point ``HF_ENDPOINT`` at it instead of mocking huggingface_hub.

What huggingface_hub asks (read in its source, huggingface_hub 2.x):
- ``hf_hub_download``: ``HEAD /{repo}/resolve/{revision}/{file}`` (needs ``X-Repo-Commit``, ``ETag`` and
  ``Content-Length``), then ``GET`` of the same URL (a ``Range`` header resumes a partial file);
- ``model_info``: ``GET /api/models/{repo}/revision/{revision}`` (its ``sha`` and ``siblings``, with ``?blobs=True``
  each file's size);
- ``snapshot_download``: that, and ``GET /api/models/{repo}/tree/{commit}?recursive=True`` (every file with its
  size), then ``hf_hub_download`` of each file;
- errors come back as the hub sends them: a status and the ``X-Error-Code`` / ``X-Error-Message`` headers
  huggingface_hub turns into RepositoryNotFoundError, GatedRepoError, RevisionNotFoundError, EntryNotFoundError.

``LocalHub.requests`` records every (method, path) asked, so a test can count what was downloaded.
"""
from __future__ import annotations

import hashlib
import json
import re
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlsplit

LFS_SUFFIXES = (".safetensors", ".bin")  # stored in git-lfs on the hub: their ETag is the content's sha256


@dataclass
class HubRepo:
    """One model repository at one commit: file name -> content."""

    files: dict[str, bytes]
    gated: bool = False  # only a request with ``token`` gets its files (a gated repo the user was granted)
    private: bool = False  # only a request with ``token`` sees it at all; others get 401 as from the hub
    token: str | None = None
    commit: str = field(init=False)

    def __post_init__(self):
        digest = hashlib.sha1()
        for name in sorted(self.files):
            digest.update(name.encode() + b"\0" + self.files[name])
        self.commit = digest.hexdigest()

    @classmethod
    def from_folder(cls, folder: Path, **kwargs) -> "HubRepo":
        """A saved model's files as a hub repository holds them (hidden files, such as tuner's completion marker of a
        cache, are not part of a model)."""
        return cls({path.relative_to(folder).as_posix(): path.read_bytes() for path in sorted(folder.rglob("*"))
                    if path.is_file() and not any(part.startswith(".") for part in path.relative_to(folder).parts)},
                   **kwargs)

    def etag(self, name: str) -> str:
        content = self.files[name]
        if name.endswith(LFS_SUFFIXES):
            return hashlib.sha256(content).hexdigest()
        return hashlib.sha1(b"blob %d\0" % len(content) + content).hexdigest()  # git's blob id

    def tree(self, recursive: bool) -> list[dict]:
        """``GET .../tree/REV``: every file (``recursive``), or the top level's files and folders."""
        entries, folders = [], set()
        for name, content in sorted(self.files.items()):
            if not recursive and "/" in name:
                folders.add(name.split("/")[0])
                continue
            entry = {"type": "file", "path": name, "size": len(content), "oid": self.etag(name)}
            if name.endswith(LFS_SUFFIXES):
                entry["lfs"] = {"oid": self.etag(name), "size": len(content), "pointerSize": 134}
            entries.append(entry)
        return entries + [{"type": "directory", "path": folder, "oid": "0" * 40} for folder in sorted(folders)]

    def siblings(self, blobs: bool) -> list[dict]:
        """``siblings`` of the model's info: names, and with ``?blobs=True`` sizes and LFS details as the hub gives."""
        if not blobs:
            return [{"rfilename": name} for name in sorted(self.files)]
        return [{"rfilename": entry["path"], "size": entry["size"], "blobId": entry["oid"],
                 **({"lfs": {"size": entry["size"], "sha256": entry["lfs"]["oid"], "pointerSize": 134}}
                    if "lfs" in entry else {})} for entry in self.tree(recursive=True)]


class LocalHub(ThreadingHTTPServer):
    """``with LocalHub({"org/demo": HubRepo(...)}) as hub:`` serves on 127.0.0.1 at ``hub.url`` until the block ends."""

    daemon_threads = True

    def __init__(self, repos: dict[str, HubRepo]):
        super().__init__(("127.0.0.1", 0), _Handler)
        self.repos = repos
        self.requests: list[tuple[str, str]] = []
        self._thread = threading.Thread(target=self.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def downloads(self) -> list[str]:
        """The files whose content was sent (GET of a resolve URL), in order."""
        return [path.split("/resolve/", 1)[1].split("/", 1)[1] for method, path in self.requests
                if method == "GET" and "/resolve/" in path]

    def __enter__(self) -> "LocalHub":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.shutdown()
        self.server_close()


REPO = r"(?P<repo>[^/]+/[^/]+)"
API_INFO = re.compile(rf"^/api/models/{REPO}(?:/revision/(?P<revision>[^/]+))?$")
API_TREE = re.compile(rf"^/api/models/{REPO}/tree/(?P<revision>[^/]+)$")
RESOLVE = re.compile(rf"^/{REPO}/resolve/(?P<revision>[^/]+)/(?P<file>.+)$")


class _Handler(BaseHTTPRequestHandler):
    server: LocalHub
    protocol_version = "HTTP/1.1"

    def log_message(self, *args) -> None:  # quiet: the test reads ``requests``
        pass

    def do_HEAD(self) -> None:
        self._answer(head=True)

    def do_GET(self) -> None:
        self._answer(head=False)

    def _answer(self, head: bool) -> None:
        url = urlsplit(self.path)
        path, self.query = unquote(url.path), parse_qs(url.query)
        self.server.requests.append((self.command, path))
        for pattern, action in ((API_TREE, self._tree), (API_INFO, self._info), (RESOLVE, self._file)):
            match = pattern.match(path)
            if match:
                repo = self._repo(match["repo"], match["revision"])
                if repo is not None:
                    action(repo, match, head)
                return
        self._error(404, "NotFound", "no such endpoint")

    def _repo(self, repo_id: str, revision: str | None) -> HubRepo | None:
        """The repository when this request may read it; otherwise the hub's answer has been sent."""
        repo = self.server.repos.get(repo_id)
        authorised = repo is not None and self.headers.get("Authorization") == f"Bearer {repo.token}"
        if repo is None or (repo.private and not authorised):
            # the hub does not tell a missing repository from a private one it hides
            status = 401 if self.headers.get("Authorization") is None else 404
            self._error(status, "RepoNotFound", "Repository not found")
            return None
        if repo.gated and not authorised:
            self._error(401, "GatedRepo", f"Access to model {repo_id} is restricted. You must have access to it "
                                          "and be authenticated to access it. Please log in.")
            return None
        if revision not in (None, "main", repo.commit):
            self._error(404, "RevisionNotFound", f"Invalid rev id: {revision}")
            return None
        return repo

    def _info(self, repo: HubRepo, match, head: bool) -> None:
        self._json({"id": match["repo"], "sha": repo.commit, "private": repo.private, "gated": repo.gated,
                    "siblings": repo.siblings(self._flag("blobs"))}, head)

    def _tree(self, repo: HubRepo, match, head: bool) -> None:
        self._json(repo.tree(self._flag("recursive")), head)

    def _flag(self, name: str) -> bool:
        return self.query.get(name, ["False"])[0].lower() in ("true", "1")

    def _file(self, repo: HubRepo, match, head: bool) -> None:
        name = match["file"]
        if name not in repo.files:
            self._error(404, "EntryNotFound", f"{name} does not exist on \"{match['revision']}\"")
            return
        content, status = repo.files[name], 200
        headers = {"ETag": f'"{repo.etag(name)}"', "X-Repo-Commit": repo.commit, "Accept-Ranges": "bytes"}
        wanted = re.match(r"bytes=(\d+)-$", self.headers.get("Range", ""))
        if wanted and not head:
            start = int(wanted.group(1))
            headers["Content-Range"] = f"bytes {start}-{len(content) - 1}/{len(content)}"
            content, status = content[start:], 206
        self._send(status, content, headers, head, "application/octet-stream")

    def _json(self, data, head: bool) -> None:
        self._send(200, json.dumps(data).encode(), {}, head, "application/json")

    def _error(self, status: int, code: str, message: str) -> None:
        body = json.dumps({"error": message}).encode()
        self._send(status, body, {"X-Error-Code": code, "X-Error-Message": message}, self.command == "HEAD",
                   "application/json")

    def _send(self, status: int, body: bytes, headers: dict[str, str], head: bool, content_type: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for key, value in headers.items():
            self.send_header(key, value)
        self.end_headers()
        if not head:
            self.wfile.write(body)
