"""A local model folder checked as an input like any other, before any library reads it.

``ModelAdapter.load`` calls :func:`check_model_folder` first, for every family: each JSON file
must parse (deep nesting, bad bytes and garbage are refused here, not as a RecursionError or a
tokenizers panic later); ``tokenizer.json`` must be a tokenizer; the text decoder's sizes in
``config.json`` must be plausible and match the weights (a vocabulary of 2^33 or 4,000 layers
would be allocated before anything else could notice); every ``*.safetensors`` file must hold
exactly the bytes its header promises (a truncated file is refused before safetensors maps it).
Each refusal is one line naming the file. Only headers are read from the weights: the check
costs milliseconds whatever the model's size. A hub id (not a local folder) is left to the hub
client, which checks what it downloads.
"""
from __future__ import annotations

import json
import math
import os
import re
import struct
from typing import Any

from ladbench.windows import text_config

#: plausible bounds of a decoder's sizes (largest released models are far inside them): a value
#: outside is a damaged or hostile config, refused before the model is allocated
SIZE_BOUNDS = {"vocab_size": 1 << 22, "hidden_size": 1 << 16, "intermediate_size": 1 << 20,
               "num_hidden_layers": 1024, "num_attention_heads": 1 << 12, "num_key_value_heads": 1 << 12,
               "head_dim": 1 << 12}
#: largest safetensors header read (real headers of sharded 100B models are a few MB)
MAX_HEADER_BYTES = 100 << 20
#: bytes per element of each safetensors dtype
_DTYPE_BYTES = {"BOOL": 1, "U8": 1, "I8": 1, "F8_E4M3": 1, "F8_E5M2": 1, "F8_E8M0": 1, "I16": 2, "U16": 2,
                "F16": 2, "BF16": 2, "I32": 4, "U32": 4, "F32": 4, "I64": 8, "U64": 8, "F64": 8}
#: files that hold a chat template, in the order the processor and tokenizer read them
CHAT_TEMPLATE_FILES = ("chat_template.jinja", "chat_template.json", "processor_config.json", "tokenizer_config.json")


class ModelFolderError(ValueError):
    """A model folder's file is damaged or hostile; the message names the file, on one line."""


def check_model_folder(model_path: str) -> None:
    """Refuse a damaged or hostile local model folder in one line naming the file (module docstring)."""
    if not os.path.isdir(model_path):
        return
    documents = {name: read_json(os.path.join(model_path, name))
                 for name in sorted(os.listdir(model_path)) if name.endswith(".json")}
    if "tokenizer.json" in documents:
        _check_tokenizer(os.path.join(model_path, "tokenizer.json"))
    weights = {name: safetensors_header(os.path.join(model_path, name))
               for name in sorted(os.listdir(model_path)) if name.endswith(".safetensors")}
    if isinstance(documents.get("config.json"), dict):
        _check_sizes(os.path.join(model_path, "config.json"), documents["config.json"], weights)


def read_json(path: str) -> Any:
    """A JSON file's content; one line naming the file when it is not UTF-8 JSON (or nests beyond
    what Python can parse)."""
    try:
        with open(path, "rb") as handle:
            return json.loads(handle.read().decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise ModelFolderError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start}); restore the file "
                               "from the model's source") from None
    except json.JSONDecodeError as exc:
        raise ModelFolderError(f"{path}: not valid JSON ({exc.msg}, line {exc.lineno} column {exc.colno}); "
                               "restore the file from the model's source") from None
    except RecursionError:
        raise ModelFolderError(f"{path}: JSON nested too deeply to read; restore the file from the "
                               "model's source") from None


def _check_tokenizer(path: str) -> None:
    from tokenizers import Tokenizer
    try:
        Tokenizer.from_file(path)
    except Exception as exc:           # noqa: BLE001 (tokenizers raises a bare Exception for any bad file)
        reason = " ".join(str(exc).split())[:200]
        raise ModelFolderError(f"{path}: not a tokenizer the tokenizers library can read ({reason}); restore the "
                               "file from the model's source") from None


def safetensors_header(path: str) -> dict[str, Any]:
    """The tensors of a ``.safetensors`` file (name -> dtype, shape, offsets), after checking that
    the file holds exactly the bytes its header promises (a truncated or padded file is refused)."""
    size = os.path.getsize(path)
    with open(path, "rb") as handle:
        prefix = handle.read(8)
        length = struct.unpack("<Q", prefix)[0] if len(prefix) == 8 else -1
        if not 0 < length <= min(size - 8, MAX_HEADER_BYTES):
            raise _damaged(path, f"its header length ({length}) does not fit its {size} bytes")
        raw = handle.read(length)
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError):
        raise _damaged(path, "its header is not valid JSON") from None
    if not isinstance(header, dict):
        raise _damaged(path, "its header is not a table of tensors")
    header.pop("__metadata__", None)
    data_bytes, end = size - 8 - length, 0
    for name, entry in header.items():
        try:
            begin, stop = (int(x) for x in entry["data_offsets"])
            expected = math.prod(int(d) for d in entry["shape"]) * _DTYPE_BYTES[entry["dtype"]]
        except (KeyError, TypeError, ValueError):
            raise _damaged(path, f"its header's entry for {name!r} is malformed") from None
        if not 0 <= begin <= stop or stop - begin != expected:
            raise _damaged(path, f"tensor {name!r} of shape {entry['shape']} does not match its byte range")
        end = max(end, stop)
    if end != data_bytes:
        raise _damaged(path, f"its header describes {end} bytes of tensors but the file holds {data_bytes} "
                             "(truncated or appended to)")
    return header


def _damaged(path: str, reason: str) -> ModelFolderError:
    return ModelFolderError(f"{path}: damaged weights file: {reason}; download or copy it again")



def _check_sizes(path: str, config: dict[str, Any], weights: dict[str, dict[str, Any]]) -> None:
    """Plausible sizes everywhere in the config, and the text decoder's matching its weights."""
    for key, value in _size_fields(config):
        bound = SIZE_BOUNDS[key.rpartition(".")[2]]
        if not 1 <= value <= bound:
            raise ModelFolderError(f"{path}: {key} = {value} is outside 1..{bound}; the config is damaged or "
                                   "not this model's")
    text = text_config(config)
    vocab, hidden, layers = (text.get(k) for k in ("vocab_size", "hidden_size", "num_hidden_layers"))
    tensors = {name: entry for header in weights.values() for name, entry in header.items()}
    embeddings = [name for name in sorted(tensors) if name.endswith("embed_tokens.weight")]
    if not embeddings or not isinstance(vocab, int) or not isinstance(hidden, int):
        return
    # the text decoder's is the one of the config's shape (a model may hold other token embeddings)
    embedding = next((name for name in embeddings if list(tensors[name]["shape"]) == [vocab, hidden]), None)
    if embedding is None:
        shape = list(tensors[embeddings[0]]["shape"])
        raise ModelFolderError(f"{path}: vocab_size x hidden_size = {vocab} x {hidden} but the weights' "
                               f"{embeddings[0]} is {' x '.join(map(str, shape))}; the config is not these weights'")
    prefix = re.escape(embedding[: -len("embed_tokens.weight")]) + r"layers\.(\d+)\."
    held = {int(m.group(1)) for name in tensors if (m := re.match(prefix, name))}
    if isinstance(layers, int) and held and layers > len(held):
        raise ModelFolderError(f"{path}: num_hidden_layers = {layers} but the weights hold {len(held)} decoder "
                               "layers; the config is not these weights'")


def _size_fields(node: Any, where: str = "") -> list[tuple[str, int]]:
    """``(dotted key, value)`` of every integer size field (``SIZE_BOUNDS``) anywhere in the config."""
    found = []
    if isinstance(node, dict):
        for key, value in node.items():
            dotted = f"{where}{key}"
            if key in SIZE_BOUNDS and isinstance(value, int) and not isinstance(value, bool):
                found.append((dotted, value))
            found += _size_fields(value, dotted + ".")
    return found


def chat_template_file(model_path: str) -> str:
    """The file a local folder's chat template comes from (the folder itself for a hub id)."""
    for name in CHAT_TEMPLATE_FILES:
        path = os.path.join(model_path, name)
        if os.path.isfile(path) and (name.endswith(".jinja") or "chat_template" in _quiet_json(path)):
            return path
    return model_path


def _quiet_json(path: str) -> dict[str, Any]:
    try:
        content = read_json(path)
    except ModelFolderError:
        return {}
    return content if isinstance(content, dict) else {}
