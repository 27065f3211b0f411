"""Nothing silently changed: every byte the tables depend on is covered by a content digest
(HDF5 caches and features: every dataset, text and attribute; JSON outputs: benchmark, image
table, evaluation, analysis). A changed file is refused with one line naming it and the
command that rebuilds it; a hand-made file without a digest is read with a one-line warning;
a damaged file is one line, wherever the damage lies. And nothing lost: a chunk write cut by
a kill or a full disk costs that chunk only; a second writer of an output refuses at once."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
import textwrap

import h5py
import numpy as np
import pytest

from ladbench import hdf5
from ladbench.atomic import LockedError, read_signed_json, signed
from ladbench.cli import main
from ladbench.hdf5 import HDF5FileError, ResumableFile, writing
from ladbench.inference.cache import CacheLayout, CacheWriter, plan_rows, read_cache, read_cache_attributes
from test_inputs import LAYERS, benchmark, calibrate, refused, write_cache


def test_a_change_fletcher32_cannot_see_is_refused(tmp_path, capsys):
    """Fletcher-32 sums 16-bit words modulo 65535: a word turned from 0x0000 to 0xFFFF passes
    it. One ``order`` entry 0 -> -1 is such a change (it would move a target silently)."""
    cache = write_cache(tmp_path / "a.h5")
    with h5py.File(cache, "r") as h5:
        info = h5["order"].id.get_chunk_info(0)
        order = h5["order"][()]
    with open(cache, "r+b") as handle:
        handle.seek(info.byte_offset)
        raw = bytearray(handle.read(info.size))
        word = order.reshape(-1).tolist().index(0) * 2            # the first entry 0 (little-endian int16)
        raw[word:word + 2] = b"\xff\xff"
        handle.seek(info.byte_offset)
        handle.write(raw)
    with h5py.File(cache, "r") as h5:                                # HDF5's own checksum passes it
        assert (h5["order"][()] == -1).sum() == 1
    refused(capsys, lambda: calibrate(cache, tmp_path / "c.npz"), cache, "changed since it was written",
            "dataset order", "rerun the workflow (or `ladbench infer`)")


def _greedy_cache(path) -> str:
    plan = plan_rows(benchmark(4))
    writer = CacheWriter.open(str(path), plan, CacheLayout(4, LAYERS, n_heads=2, greedy=True),
                              {"config_sha256": "g", "n_candidates": 4, "model_kind": "tiny-random"})
    rows = np.arange(len(plan))
    writer.write(rows, {"greedy_text": np.array([str(r % 4 + 1) for r in rows], dtype=object),
                        "greedy_tokens": np.ones((len(rows), 2), np.int32)})
    writer.finish({})
    return str(path)


@pytest.mark.parametrize("change, what", [
    (lambda h5: h5["greedy_text"].__setitem__(0, "3"), "dataset greedy_text"),      # a reply: Table 1's Vanilla
    (lambda h5: h5.attrs.__setitem__("model_kind", "pretrained"), "its attributes"),  # the demo label
    (lambda h5: h5.attrs.__setitem__("rows_per_s", 99.0), "its attributes"),          # Table 2
    (lambda h5: h5.__delitem__("seconds"), "dataset seconds"),
])
def test_changed_texts_attributes_or_datasets_are_refused(tmp_path, change, what):
    cache = _greedy_cache(tmp_path / "g.h5")
    read_cache(cache)
    with h5py.File(cache, "r+") as h5:
        change(h5)
    for read in (read_cache, read_cache_attributes):
        if read is read_cache or what == "its attributes":
            with pytest.raises(HDF5FileError, match=f"g.h5: inference cache: changed since it was written .*{what}"):
                read(cache)


def test_a_file_without_a_digest_is_read_with_one_warning(tmp_path, capsys):
    cache = write_cache(tmp_path / "a.h5")
    with h5py.File(cache, "r+") as h5:
        del h5.attrs[hdf5.DIGEST_ATTR]
    first = read_cache(cache)
    read_cache_attributes(cache)
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"WARNING: {cache}: inference cache without a content_sha256")
    assert first["scores"].shape[0] == first["done"].shape[0]


def test_a_file_from_before_the_digest_still_has_its_reply_texts_checked(tmp_path, capsys):
    """A format-2 cache written before content_sha256 carries text_sha256, the digest of its
    replies (docs/formats.md §4): a reply changed since is refused; one that is not, read."""
    from ladbench.inference.cache import text_sha256
    plan = plan_rows(benchmark(4))
    path = str(tmp_path / "g.h5")
    writer = CacheWriter.open(path, plan, CacheLayout(4, LAYERS, n_heads=2, generative=True, n_samples=2),
                              {"config_sha256": "g", "n_candidates": 4})
    rows = np.arange(len(plan))
    texts = np.array([[f"{r % 4 + 1}", "2"] for r in rows], dtype=object)
    writer.write(rows, {"text": texts, "parsed": (rows % 4).astype(np.int16)})
    writer.finish({})
    with h5py.File(path, "r+") as h5:
        del h5.attrs[hdf5.DIGEST_ATTR]
        h5.attrs["text_sha256"] = text_sha256(texts.astype(str))
    assert read_cache(path)["text"][5, 0] == "2"
    with h5py.File(path, "r+") as h5:
        h5["text"][5, 0] = "3"                                          # one sample's answer
    with pytest.raises(HDF5FileError, match="g.h5: inference cache: corrupted .the reply texts do not match text_sha256"):
        read_cache(path)
    assert "without a content_sha256" in capsys.readouterr().err


def test_damage_anywhere_is_one_line_or_changes_nothing(tmp_path):
    """Bytes of a cache flipped one at a time (300 places drawn over the whole file; every
    place was walked once by hand, 9,496 of them, in 150 s): each read either refuses with one
    line (HDF5FileError) or returns exactly the original content: never another exception,
    never a hang (a damaged variable-length string could make HDF5 loop: none are stored)."""
    good = write_cache(tmp_path / "a.h5")
    original = read_cache(good)
    data = (tmp_path / "a.h5").read_bytes()
    damaged = tmp_path / "b.h5"
    outcomes = set()
    for offset in sorted(np.random.default_rng(22).choice(len(data), 300, replace=False)):
        flipped = bytearray(data)
        flipped[offset] ^= 0xFF
        damaged.write_bytes(flipped)
        for read in (read_cache, read_cache_attributes):
            try:
                content = read(str(damaged))
            except HDF5FileError as error:
                assert "\n" not in str(error) and str(damaged) in str(error)
                outcomes.add(str(error).split(": ")[2].split(" (")[0])
                continue
            if read is read_cache:
                for key, values in original.arrays.items():
                    assert np.array_equal(content[key], values, equal_nan=values.dtype.kind == "f"), (offset, key)
    assert {"damaged", "corrupted"} <= outcomes, outcomes


# ------------------------------------------------------------------------ JSON outputs
def _json_outputs(tmp_path):
    from ladbench.benchmark import load_benchmark
    from ladbench.data.coco import load_image_table
    from ladbench.records import read_analysis, read_evaluation
    table = {"dataset": "scenes", "image_root": str(tmp_path), "images": [
        {"image_id": 1, "file_name": "a.png", "caption": "a red circle", "categories": []}]}
    return [(load_benchmark, benchmark(4), "a red", "ladbench benchmark"),
            (load_image_table, table, "a red", "ladbench captions"),
            (read_evaluation, {"model": "m", "methods": {"vanilla": {"acc_mean": 25.9}}}, "25.9", "ladbench evaluate"),
            (read_analysis, {"model": "m", "readouts": [{"metrics": {"acc_mean": 25.9}}]}, "25.9", "ladbench analyze")]


def test_changed_json_outputs_are_refused_naming_the_rebuild(tmp_path):
    for i, (read, doc, _, command) in enumerate(_json_outputs(tmp_path)):
        if read.__name__ == "load_benchmark":
            doc["eval"][0]["caption"] = "a red circle"
        path = tmp_path / f"{i}.json"
        path.write_text(json.dumps(signed(doc), indent=1))
        assert read(path) == {**doc, **read(path)} and "content_sha256" not in read(path)
        text = path.read_text()
        path.write_text(json.dumps(json.loads(text)))                      # another layout: the same content
        read(path)
        changed = text.replace("25.9", "95.9").replace("a red", "a blue")
        assert changed != text
        path.write_text(changed)
        with pytest.raises(ValueError, match=f"{path}: .*changed since it was written.*`{command}`"):
            read(path)


def test_hand_made_json_is_read_with_one_warning(tmp_path, capsys):
    path = tmp_path / "evaluation.json"
    path.write_text(json.dumps({"model": "m"}))
    assert read_signed_json(path, "evaluation file", "rerun") == {"model": "m"}
    assert read_signed_json(path, "evaluation file", "rerun") == {"model": "m"}
    assert capsys.readouterr().err.splitlines() == [
        f"WARNING: {path}: evaluation file without a content_sha256 (made by hand or by an older ladbench); read as "
        "it is, unchecked"]


# --------------------------------------------------------------- writes cut short, writers
def _writer(tmp_path) -> tuple[CacheWriter, int]:
    plan = plan_rows(benchmark(4))
    return CacheWriter.open(str(tmp_path / "c.h5"), plan, CacheLayout(4, LAYERS, n_heads=2),
                            {"config_sha256": "x", "n_candidates": 4}), len(plan)


def _scores(rows) -> dict:
    return {"scores": np.tile(np.asarray(rows, np.float32)[:, None], (1, 4))}


def test_a_full_disk_during_a_chunk_write_costs_that_chunk_only(tmp_path, monkeypatch):
    writer, n_rows = _writer(tmp_path)
    writer.write([0, 1], _scores([0, 1]))
    real_sign = hdf5.sign

    def disk_full(h5):
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(hdf5, "sign", disk_full)
    with pytest.raises(OSError, match=r"chunk-00000002.h5: cannot write 2 rows \(the disk is full.*rows written before "
                                      r"are kept"):
        writer.write([2, 3], _scores([2, 3]))
    monkeypatch.setattr(hdf5, "sign", real_sign)
    assert sorted(os.listdir(writer.path)) == ["chunk-00000001.h5", "inputs.h5"]      # no half-written file
    reopened, _ = _writer(tmp_path)
    assert reopened.pending_rows().tolist() == list(range(2, n_rows))
    reopened.write(range(2, n_rows), _scores(range(2, n_rows)))
    reopened.finish({})
    assert read_cache(str(tmp_path / "c.h5"))["scores"][:, 0].tolist() == list(range(n_rows))


def test_what_a_kill_inside_a_chunk_write_leaves_is_cleared_and_the_rest_kept(tmp_path, caplog):
    writer, n_rows = _writer(tmp_path)
    writer.write([0, 1], _scores([0, 1]))
    writer.write([2, 3], _scores([2, 3]))
    chunks = sorted(os.listdir(writer.path))
    # the temporary file of the chunk in flight, half written when the kill came
    (tmp_path / "c.h5.partial" / "chunk-00000003.h5.4242.tmp").write_bytes(b"\x89HDF\r\n\x1a\n" + b"\0" * 50)
    # and a chunk file damaged on disk after it was written: its rows are computed again
    damaged = tmp_path / "c.h5.partial" / chunks[1]
    damaged.write_bytes(damaged.read_bytes()[:200])
    reopened, _ = _writer(tmp_path)
    assert "chunk-00000002.h5: chunk of a work folder: truncated" in caplog.text
    assert reopened.pending_rows().tolist() == list(range(2, n_rows))
    assert sorted(os.listdir(reopened.path)) == ["chunk-00000001.h5", "inputs.h5"]


FINISH_ON_A_FULL_DISK = textwrap.dedent("""
    import resource, signal, sys
    from ladbench.inference.cache import CacheWriter
    from ladbench.hdf5 import partial_path
    import ladbench.hdf5
    writer = ladbench.hdf5.ResumableFile(sys.argv[1])
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)           # a write past the limit fails, as on a full disk
    resource.setrlimit(resource.RLIMIT_FSIZE, (4096, resource.RLIM_INFINITY))
    try:
        writer.finish({})
    except OSError as error:
        print(error)
""")


def test_a_full_disk_while_finishing_keeps_the_work(tmp_path):
    writer, n_rows = _writer(tmp_path)
    writer.write(range(n_rows), _scores(range(n_rows)))
    out = subprocess.run([sys.executable, "-c", FINISH_ON_A_FULL_DISK, str(tmp_path / "c.h5")], capture_output=True,
                         text=True, check=True).stdout.strip()
    assert out.startswith(f"{tmp_path / 'c.h5'}: cannot write the finished file (the disk is full") and "kept" in out
    assert not (tmp_path / "c.h5").exists() and [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")] == []
    ResumableFile(str(tmp_path / "c.h5")).finish({})                  # space again: finished from the kept work
    assert read_cache(str(tmp_path / "c.h5"))["done"].all()


def test_a_second_writer_of_an_output_refuses_at_once_naming_the_first(tmp_path, capsys):
    out = tmp_path / "c.h5"
    with writing(out, "inference cache"):
        with pytest.raises(LockedError, match=rf"{out}: inference cache being written: locked by pid {os.getpid()} "):
            with writing(out, "inference cache"):
                pass
        args = ["infer", "--benchmark", "b.json", "--images", "i.json", "--out", str(out), "--model-name", "m",
                "--family", "qwen2_5_vl", "--model-path", str(tmp_path), "--device", "cpu"]
        refused(capsys, lambda: main(args), str(out), "being written: locked by pid")
    with writing(out, "inference cache"):                                # released: free again
        pass
    assert not (tmp_path / "c.h5.lock").exists()


# ------------------------------------------------------------------------ same inputs, same identity
def test_a_model_folder_is_identified_by_its_content_not_its_place_or_training_time(tmp_path):
    """The organism records how long it trained (training.train_seconds): that changes from
    run to run and must not change the caches' identity; where the folder lies must not either."""
    from ladbench.inference.runner import model_fingerprint

    def folder(name, **metadata):
        path = tmp_path / name / "organism"
        path.mkdir(parents=True)
        (path / "config.json").write_text('{"hidden_size": 8}')
        (path / "model.safetensors").write_bytes(b"weights")
        (path / "ladbench_tiny.json").write_text(json.dumps(
            {"kind": "tiny-organism", "seed": 2, "training": {"loss": 0.5, "train_seconds": 10.0}, **metadata}))
        return str(path)

    first = model_fingerprint(folder("a"))
    assert model_fingerprint(folder("b", training={"loss": 0.5, "train_seconds": 97.3})) == first
    assert model_fingerprint(folder("c", seed=3)) != first
    assert model_fingerprint(folder("d", training={"loss": 0.6, "train_seconds": 10.0})) != first


def test_a_chunk_damaged_on_disk_is_found_when_finishing_and_its_rows_computed_again(tmp_path):
    writer, n_rows = _writer(tmp_path)
    writer.write([0, 1], _scores([0, 1]))
    writer.write(range(2, n_rows), _scores(range(2, n_rows)))
    first = tmp_path / "c.h5.partial" / "chunk-00000001.h5"
    with h5py.File(first, "r+") as h5:                  # results changed after the chunk was written
        h5["scores"][0, 0] = 42.0
    with pytest.raises(HDF5FileError, match="chunk-00000001.h5: chunk of a work folder: changed since it was written"
                                            ".*rerun: the file is removed and its rows computed again"):
        writer.finish({})
    assert not first.exists() and not (tmp_path / "c.h5").exists()
    reopened, _ = _writer(tmp_path)
    assert reopened.pending_rows().tolist() == [0, 1]
