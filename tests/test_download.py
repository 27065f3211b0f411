"""Downloads against a local HTTP server on 127.0.0.1: resume, retries, verification, extraction, skipping."""

from __future__ import annotations

import hashlib
import io
import json
import socket
import threading
import zipfile
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


import pytest

from ladbench.cli import build_parser
from ladbench.data import download as dl
from ladbench.data.coco import build_image_table
from ladbench.stages import download as download_stage


class FixtureServer:
    """Serves in-memory files with HTTP Range support and scripted failures.

    ``drop_after[path] = [n1, n2, ...]``: the k-th request for ``path`` sends only ``n_k``
    bytes of its body and then closes the connection. ``ignore_range`` paths always answer
    200 with the whole file. Every request's path and Range header is logged.
    """

    def __init__(self):
        self.files: dict[str, bytes] = {}
        self.drop_after: dict[str, list[int]] = {}
        self.ignore_range: set[str] = set()
        self.log: list[tuple[str, str | None]] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # keep test output quiet
                pass

            def do_GET(self):
                server.log.append((self.path, self.headers.get("Range")))
                body = server.files.get(self.path)
                if body is None:
                    self.send_error(404)
                    return
                start, status = 0, 200
                requested = self.headers.get("Range")
                if requested and self.path not in server.ignore_range:
                    start = int(requested.removeprefix("bytes=").split("-")[0])
                    if start >= len(body):
                        self.send_response(416)
                        self.send_header("Content-Range", f"bytes */{len(body)}")
                        self.send_header("Content-Length", "0")
                        self.end_headers()
                        return
                    status = 206
                self.send_response(status)
                self.send_header("Content-Length", str(len(body) - start))
                if status == 206:
                    self.send_header("Content-Range", f"bytes {start}-{len(body) - 1}/{len(body)}")
                self.end_headers()
                payload = body[start:]
                drops = server.drop_after.get(self.path)
                if drops:
                    payload = payload[:drops.pop(0)]
                    self.wfile.write(payload)
                    self.wfile.flush()
                    self.close_connection = True
                    self.connection.shutdown(socket.SHUT_RDWR)
                    return
                self.wfile.write(payload)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture()
def server():
    with FixtureServer() as running:
        yield running


def make_zip(members: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, data in members.items():
            archive.writestr(name, data)
    return buffer.getvalue()


def random_bytes(n: int, seed: int = 0) -> bytes:
    import numpy as np
    return np.random.default_rng(seed).integers(0, 256, size=n, dtype=np.uint8).tobytes()


FAST = dict(retries=3, backoff=0.01, timeout=5, show_progress=False)


def test_interrupted_transfer_resumes_with_range(server, tmp_path):
    body = make_zip({"data/blob.bin": random_bytes(300_000)})
    server.files["/a.zip"] = body
    server.drop_after["/a.zip"] = [50_000, 70_000]  # two drops, then a clean answer
    out = dl.fetch(server.url + "/a.zip", tmp_path / "a.zip", md5=hashlib.md5(body).hexdigest(), **FAST)
    assert out.read_bytes() == body
    assert [r for _, r in server.log] == [None, "bytes=50000-", "bytes=120000-"]
    assert not (tmp_path / "a.zip.part").exists()


def test_partial_file_from_an_earlier_run_is_continued(server, tmp_path):
    body = make_zip({"x.txt": random_bytes(40_000, 1)})
    server.files["/b.zip"] = body
    (tmp_path / "b.zip.part").write_bytes(body[:12_345])
    dl.fetch(server.url + "/b.zip", tmp_path / "b.zip", **FAST)
    assert (tmp_path / "b.zip").read_bytes() == body
    assert server.log == [("/b.zip", "bytes=12345-")]


def test_server_without_range_support_restarts_from_zero(server, tmp_path):
    body = make_zip({"x.txt": random_bytes(40_000, 2)})
    server.files["/c.zip"] = body
    server.ignore_range.add("/c.zip")
    (tmp_path / "c.zip.part").write_bytes(b"garbage-prefix")
    dl.fetch(server.url + "/c.zip", tmp_path / "c.zip", **FAST)
    assert (tmp_path / "c.zip").read_bytes() == body


def test_checksum_mismatch_is_rejected_and_deleted(server, tmp_path):
    body = make_zip({"x.txt": b"hello"})
    server.files["/d.zip"] = body
    with pytest.raises(dl.DownloadError, match="MD5 .* != expected"):
        dl.fetch(server.url + "/d.zip", tmp_path / "d.zip", md5="0" * 32, **FAST)
    assert not (tmp_path / "d.zip").exists() and not (tmp_path / "d.zip.part").exists()


def test_corrupted_zip_is_rejected_without_a_checksum(server, tmp_path):
    body = bytearray(make_zip({"x.bin": random_bytes(20_000, 3)}))
    body[200] ^= 0xFF  # inside the compressed member data: only the CRC check can notice
    server.files["/e.zip"] = bytes(body)
    with pytest.raises(dl.DownloadError, match="e.zip"):
        dl.fetch(server.url + "/e.zip", tmp_path / "e.zip", **FAST)
    assert not (tmp_path / "e.zip").exists() and not (tmp_path / "e.zip.part").exists()


def test_wrong_size_is_rejected(server, tmp_path):
    server.files["/f.zip"] = make_zip({"x": b"1"})
    with pytest.raises(dl.DownloadError, match="expected 999"):
        dl.fetch(server.url + "/f.zip", tmp_path / "f.zip", size=999, **FAST)


def test_missing_file_is_not_retried(server, tmp_path):
    with pytest.raises(dl.DownloadError, match="HTTP 404"):
        dl.fetch(server.url + "/nope.zip", tmp_path / "nope.zip", **FAST)
    assert len(server.log) == 1


def test_offline_error_says_what_to_download_and_where(tmp_path):
    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with pytest.raises(dl.DownloadError) as err:
        dl.download_dataset("coco", tmp_path / "coco", url_base=f"http://127.0.0.1:{port}", **FAST)
    message = str(err.value)
    assert f"http://127.0.0.1:{port}/val2014.zip" in message
    assert str(tmp_path / "coco" / "val2014.zip") in message and "by hand" in message


def coco_fixture(server) -> tuple[dl.Resource, ...]:
    images = {f"val2014/COCO_val2014_{i:012d}.jpg": random_bytes(500, i) for i in (1, 2)}
    images["__MACOSX/val2014/._junk"] = b"junk"
    captions = {"images": [{"id": i, "file_name": f"COCO_val2014_{i:012d}.jpg"} for i in (1, 2)],
                "annotations": [{"image_id": 2, "id": 1, "caption": "two"}, {"image_id": 1, "id": 2, "caption": "one"}]}
    instances = {"images": captions["images"], "annotations": [{"id": 1, "image_id": 1, "category_id": 3}],
                 "categories": [{"id": 3, "name": "c"}]}
    annotations = {"annotations/captions_val2014.json": json.dumps(captions).encode(),
                   "annotations/instances_val2014.json": json.dumps(instances).encode(),
                   "annotations/captions_train2014.json": b"{}"}
    server.files["/val2014.zip"] = make_zip(images)
    server.files["/annotations_trainval2014.zip"] = make_zip(annotations)
    official = {r.file_name: r for r in dl.DATASETS["coco"]}
    return tuple(dl.Resource(name, official[name].url, official[name].provides,
                             md5=hashlib.md5(server.files["/" + name]).hexdigest()) for name in official)


def test_coco_end_to_end_then_skipped(server, tmp_path):
    resources = coco_fixture(server)
    server.drop_after["/val2014.zip"] = [300]
    outputs = dl.download_dataset("coco", tmp_path / "coco", url_base=server.url, resources=resources, **FAST)
    assert outputs == dl.dataset_outputs("coco", (tmp_path / "coco").resolve())
    assert sorted(p.name for p in outputs["images_dir"].iterdir()) == [
        "COCO_val2014_000000000001.jpg", "COCO_val2014_000000000002.jpg"]
    assert outputs["captions_json"].is_file() and outputs["instances_json"].is_file()
    assert not (tmp_path / "coco" / "annotations" / "captions_train2014.json").exists()  # only what is needed
    assert sorted(p.name for p in (tmp_path / "coco").iterdir()) == ["annotations", "val2014"]  # archives removed
    table = build_image_table(outputs["captions_json"], outputs["instances_json"], outputs["images_dir"], "coco")
    assert [(r["caption"], r["categories"]) for r in table["images"]] == [("one", [3]), ("two", [])]
    requests = len(server.log)
    dl.download_dataset("coco", tmp_path / "coco", url_base=server.url, resources=resources, **FAST)
    assert len(server.log) == requests  # everything present: nothing fetched


def test_flickr8k_end_to_end_converts_captions(server, tmp_path):
    server.files["/Flickr8k_Dataset.zip"] = make_zip({
        "Flicker8k_Dataset/b.jpg": b"b", "Flicker8k_Dataset/a.jpg": b"a", "__MACOSX/Flicker8k_Dataset/._a.jpg": b"x"})
    server.files["/Flickr8k_text.zip"] = make_zip({
        "Flickr8k.token.txt": b"a.jpg#1\tsecond a\na.jpg#0\tfirst a\nb.jpg#0\tfirst b\n",
        "Flickr_8k.trainImages.txt": b"a.jpg\n"})
    resources = tuple(dl.Resource(r.file_name, r.url, r.provides) for r in dl.DATASETS["flickr8k"])
    outputs = dl.download_dataset("flickr8k", tmp_path / "f8k", url_base=server.url, resources=resources, **FAST)
    table = build_image_table(outputs["captions_json"], None, outputs["images_dir"], "flickr8k")
    assert [r["caption"] for r in table["images"]] == ["first a", "first b"]


def test_existing_local_copy_needs_no_network(tmp_path):
    dest = tmp_path / "coco"
    for path in dl.dataset_outputs("coco", dest).values():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.mkdir() if path.name == "val2014" else path.write_text("{}")
    # url_base points nowhere: any request would fail
    dl.download_dataset("coco", dest, url_base="http://127.0.0.1:9", retries=0, backoff=0, show_progress=False)


def test_nested_archive_layout_is_found(tmp_path):
    archive = tmp_path / "x.zip"
    archive.write_bytes(make_zip({"top/Flicker8k_Dataset/a.jpg": b"a", "top/readme.txt": b"r"}))
    dl.extract(archive, tmp_path / "out", ("Flicker8k_Dataset",))
    assert (tmp_path / "out" / "Flicker8k_Dataset" / "a.jpg").read_bytes() == b"a"
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["Flicker8k_Dataset"]


def test_official_sources_and_cli(tmp_path):
    assert dl.DATASETS["coco"][0].url == "http://images.cocodataset.org/zips/val2014.zip"
    assert dl.DATASETS["coco"][1].url == "http://images.cocodataset.org/annotations/annotations_trainval2014.zip"
    parser = build_parser(only="download")
    args = parser.parse_args(["download", "--dataset", "flickr8k", "--dest", str(tmp_path), "--url-base", "http://x",
                              "--retries", "0", "--keep-archives", "--no-checksum"])
    assert args.func is download_stage.run and args.retries == 0 and args.keep_archives and args.no_checksum
