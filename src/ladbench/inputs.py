"""Do a stage's input files belong together? And the record of what an output was made from.

A cache names its inputs in its attributes (``config_sha256``, ``benchmark_name``,
``benchmark_sha256``, the model and prompt). Calibration, evaluation and analysis outputs
copy that identity (:func:`cache_identity`), so any later stage can check that the files
it is given were made from the same model, prompt variant and N, and refuse otherwise
with one line naming both files (:class:`MismatchError`). A calibration fitted on another
benchmark is accepted only when the caller declares a calibration transfer.
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping

from ladbench.atomic import file_digest
from ladbench.names import benchmark_parts

# Cache attributes that must agree between a calibration's cache and the cache it is applied
# to: the same model (name, weights, code), prompt and answer format, N and layer count.
SAME_MODEL_AND_PROMPT = ("model", "model_path", "revision", "family", "variant", "identifiers", "score_mode",
                         "prompt_sha256", "n_candidates", "n_layers")
BENCHMARK_KEYS = ("benchmark_name", "benchmark_sha256")


class MismatchError(ValueError):
    """Input files that do not belong together; the message names both."""


def cache_identity(path: str, attrs: Mapping[str, Any]) -> dict[str, Any]:
    """What an output records about the cache it was made from."""
    keys = ("config_sha256", *BENCHMARK_KEYS, *SAME_MODEL_AND_PROMPT, "variant_name")
    return {"path": str(path), **{key: attrs.get(key) for key in keys}}


def what_it_is(attrs: Mapping[str, Any]) -> dict[str, Any]:
    """What an output made from a cache is, at its top level (the report reads it from there,
    never from the file's path): the model, the benchmark (name, dataset, setting), the
    cache variant (the config's name) and its prompt and identifiers."""
    benchmark = attrs.get("benchmark_name")
    dataset, setting, _ = benchmark_parts(benchmark) if benchmark else (None, None, None)
    return {"model": attrs.get("model"), "model_kind": attrs.get("model_kind"), "benchmark": benchmark,
            "dataset": dataset, "setting": setting,
            "variant": attrs.get("variant_name"), "prompt": attrs.get("variant"),
            "identifiers": attrs.get("identifiers")}


def _differences(a: Mapping[str, Any], b: Mapping[str, Any], keys: Iterable[str]) -> list[str]:
    return [f"{key} {a.get(key)!r} vs {b.get(key)!r}" for key in keys if a.get(key) != b.get(key)]


def check_calibrations(cache_path: str, cache_attrs: Mapping[str, Any], calibrations: Iterable[tuple[str, Any]],
                       transfer: bool = False) -> dict[str, Any] | None:
    """Refuse calibrations not fitted on a cache of the same model, prompt variant and N as
    ``cache_path``, or on another benchmark unless ``transfer``; all of them must come from one
    cache. Returns the transfer record (``None`` for a same-benchmark calibration)."""
    cache = cache_identity(cache_path, cache_attrs)
    first: tuple[str, Mapping[str, Any]] | None = None
    for path, calibration in calibrations:
        source = calibration.source
        if not source:
            raise MismatchError(f"{path}: the calibration does not record the cache it was fitted on "
                                "(made by an older ladbench); rerun `ladbench calibrate`")
        wrong = _differences(source, cache, SAME_MODEL_AND_PROMPT)
        if wrong:
            raise MismatchError(f"{path} does not belong with {cache_path}: {'; '.join(wrong)} (calibration vs "
                                "cache); calibrate from a cache of the same model and prompt variant")
        if first is None:
            first = (path, source)
        elif source.get("config_sha256") != first[1].get("config_sha256"):
            raise MismatchError(f"{path} and {first[0]} were fitted on different caches ({source.get('path')}, "
                                f"{first[1].get('path')}); give the calibration draws of one cache")
        if source.get("benchmark_sha256") != cache["benchmark_sha256"] and not transfer:
            raise MismatchError(
                f"{path} was fitted on benchmark {source.get('benchmark_name')} but {cache_path} is of "
                f"{cache['benchmark_name']}; pass --transfer to evaluate a calibration transfer")
    if first is None or first[1].get("benchmark_sha256") == cache["benchmark_sha256"]:
        return None
    return {"calibrated_on": first[1].get("benchmark_name"), "benchmark_sha256": first[1].get("benchmark_sha256")}


def calibration_record(path: str, calibration: Any) -> dict[str, Any]:
    """What an evaluation records about one calibration file."""
    return {"path": str(path), "sha256": file_digest(path), "cache_config_sha256": calibration.source.get("config_sha256")}


def check_made_from_caches(documents: Mapping[tuple, Mapping[str, Any]], caches: Mapping[tuple, Mapping[str, Any]],
                           what: str) -> None:
    """Refuse evaluation or analysis documents (keyed by (model, benchmark, variant, ...)) made
    from another cache than the one now given for that key: they are stale. Documents that
    record no inputs (older versions) are not checked."""
    for key, document in documents.items():
        recorded = (document.get("inputs") or {}).get("cache") or {}
        attrs = caches.get(tuple(key[:3]))
        if not recorded or attrs is None or recorded.get("config_sha256") == attrs.get("config_sha256"):
            continue
        raise MismatchError(
            f"the {what} of {'/'.join(key)} was made from {recorded.get('path')} (config_sha256 "
            f"{recorded.get('config_sha256')}), but the cache given for it has {attrs.get('config_sha256')}; "
            f"rerun the {what} (the workflow does when its cache changed)")


def check_features_table(features_path: str, feature_attrs: Mapping[str, Any], table_path: str, table: dict) -> None:
    """Refuse CLIP features computed from another image table (other ids, files or captions)."""
    from ladbench.data.coco import table_fingerprint

    if feature_attrs.get("table_sha256") != table_fingerprint(table):
        raise MismatchError(f"{features_path} was computed from another image table than {table_path} (table_sha256 "
                            "differs); rebuild the features (`ladbench features`)")


def check_benchmark_table(bench_path: str, bench: Mapping[str, Any], table_path: str, table: Mapping[str, Any]) -> None:
    """Refuse a benchmark built from another dataset than the image table's, or (when it
    records its table's fingerprint, ``images_sha256``) from another image table."""
    from ladbench.data.coco import table_fingerprint

    if bench.get("dataset") != table.get("dataset"):
        raise MismatchError(f"{bench_path} is a benchmark of dataset {bench.get('dataset')!r} but {table_path} is the "
                            f"image table of {table.get('dataset')!r}")
    if bench.get("images_sha256") not in (None, table_fingerprint(table)):
        raise MismatchError(f"{bench_path} was drawn from another image table than {table_path} (images_sha256 "
                            "differs); rebuild the benchmark (`ladbench benchmark`)")
