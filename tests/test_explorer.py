"""The instance explorer (ladbench.report.explorer): its numbers are the project's own, its
inputs must belong together, and in a real browser (headless Chromium) its cards, filter
counts, detail view and keyboard work without a console error, on a synthetic study and on
the demo's pages."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

from browser import console_errors, headless_chromium, missing_reason, open_page, select
from explorer_study import build_study
from ladbench import methods
from ladbench.calibration import Calibration, log_softmax
from ladbench.cli import main
from ladbench.inference.cache import read_cache
from ladbench.report.explorer import _unpacked, card_flags, explorer_document, logits_attention_gap, render_page
from ladbench.arrays import eval_arrays

needs_browser = pytest.mark.skipif(missing_reason() is not None, reason=str(missing_reason()))


@pytest.fixture(scope="module")
def study(tmp_path_factory) -> dict[str, str]:
    folder = tmp_path_factory.mktemp("explorer")
    files = build_study(folder)
    page = folder / "page.html"
    main(["explore", "--cache", files["cache"], "--calibration", files["calibration"], "--evaluation", files["evaluation"],
          "--images", files["images"], "--out", str(page)])
    return {**files, "page": str(page)}


def page_document(page: str | Path) -> dict:
    text = Path(page).read_text()
    data = re.search(r'<script id="explorer-data" type="application/json">(.*?)</script>', text, re.S).group(1)
    return json.loads(data.replace("<\\/", "</"))


# --------------------------------------------------------------------------- numbers


def test_every_number_is_the_methods_own_rounded(study):
    document = page_document(study["page"])
    arrays = eval_arrays(read_cache(study["cache"]))
    calibration = Calibration.from_npz(study["calibration"])
    settings = methods.LadSettings.from_record(json.loads(Path(study["evaluation"]).read_text())["settings"])
    got = {name: _unpacked(entry) for name, entry in document["arrays"].items()}
    softmax = lambda x: np.exp(log_softmax(x))  # noqa: E731
    raw = methods.raw_attention(arrays.attn, methods.LadSettings(top_k=settings.top_k, layer_range=settings.layer_range))
    expected = {
        "probability": softmax(arrays.scores),
        "attention_share": raw / raw.sum(-1, keepdims=True),
        "pride": softmax(arrays.scores - calibration.pride_prior),
        "lad": softmax(methods.lad(arrays.scores, arrays.attn, calibration, settings)),
        "layer_share": arrays.attn / arrays.attn.sum(-1, keepdims=True),
    }
    selection = methods.LadSettings(top_k=settings.top_k, layer_range=settings.layer_range)
    expected["purified_share"] = softmax(methods.purified_attention(arrays.attn, calibration.attn_prior, selection))
    every = arrays.attn.mean(-2)
    expected["attention_all"] = every / every.sum(-1, keepdims=True)
    for name, values in expected.items():
        tolerance = 0.5 / 255 if name == "layer_share" else 0.0005
        np.testing.assert_allclose(got[name], values, atol=tolerance + 1e-9, err_msg=name)
    with np.load(Path(study["evaluation"]).with_suffix(".npz")) as predictions:
        for method in ("vanilla", "pride", "lad", "raw_attention", "purified_attention"):
            np.testing.assert_array_equal(got[f"pred_{method}"], predictions[f"pred_{method}"])
    np.testing.assert_array_equal(got["target_pos"], arrays.target_pos)
    np.testing.assert_array_equal(got["order"], arrays.order)
    selected = methods.layer_selection_mask(arrays.attn, methods.LadSettings(top_k=settings.top_k, layer_range=settings.layer_range))
    np.testing.assert_array_equal(got["selected"].astype(bool), selected)
    assert len(document["thumbnails"]) == len(set(document["image_ids"])) == 12 * 4   # each distinct image once
    assert document["kind_label"] and "mechanics" in document["title"]


def test_the_gap_is_the_target_attention_share_minus_the_target_probability():
    share = np.array([[0.7, 0.1, 0.1, 0.1], [0.25, 0.25, 0.25, 0.25]])
    probability = np.array([[0.1, 0.6, 0.2, 0.1], [0.1, 0.1, 0.1, 0.7]])
    np.testing.assert_allclose(logits_attention_gap(share, probability, np.array([0, 3])), [0.6, -0.45])


def test_card_flags_name_the_divergence():
    target = np.array([0, 1, 2])
    flags = card_flags({"pred_vanilla": np.array([0, 0, 1]), "pred_raw_attention": np.array([0, 1, 0]),
                        "pred_purified_attention": np.array([1, 1, 2])}, target)
    np.testing.assert_array_equal(flags["right_vanilla"], [True, False, False])
    np.testing.assert_array_equal(flags["divergence_raw_attention"], [False, True, False])
    np.testing.assert_array_equal(flags["divergence_purified_attention"], [False, True, True])


def test_the_page_is_self_contained(study):
    text = Path(study["page"]).read_text()
    assert "default-src 'none'" in text                       # the page may not load anything
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", text)
    assert not re.search(r"url\(\s*['\"]?https?:", text) and "@import" not in text
    assert "<b>&</b>" not in text.split('id="explorer-data"')[0]   # the caption is data, never markup


def test_refuses_a_calibration_the_evaluation_did_not_use(study, tmp_path, capsys):
    other = tmp_path / "dcal5_seed1.npz"
    main(["calibrate", "--cache", study["cache"], "--n-cal", "5", "--seed", "1", "--out", str(other)])
    with pytest.raises(SystemExit):
        main(["explore", "--cache", study["cache"], "--calibration", str(other), "--evaluation", study["evaluation"],
              "--out", str(tmp_path / "p.html")])
    error = capsys.readouterr().err.strip()
    assert "is not the calibration" in error and str(other) in error and len(error.splitlines()) == 1
    assert not (tmp_path / "p.html").exists()


def _edit(evaluation: Path, edit: str) -> None:
    """The issue's edits of an evaluation beside a page: a shown number, a prediction (the
    .npz re-saved by numpy), the digest stripped, and a JSON and an .npz of two runs (what a
    kill between two separate writes left)."""
    npz = evaluation.with_suffix(".npz")
    doc = json.loads(evaluation.read_text())
    with np.load(npz) as data:
        arrays = dict(data)
    if edit == "acc_mean":
        doc["methods"]["lad"]["acc_mean"] = 95.9
        evaluation.write_text(json.dumps(doc))
    elif edit == "stripped":
        del doc["content_sha256"]
        doc["model"] = "another model"
        evaluation.write_text(json.dumps(doc))
    elif edit == "pred":
        arrays["pred_lad"] = arrays["target_pos"]
        np.savez(npz, **arrays)
    else:                                            # the same JSON beside the .npz of another run, itself intact
        from ladbench.atomic import write_json_with_arrays
        arrays.pop("content_sha256")
        arrays["pred_lad"] = arrays["target_pos"]
        old = evaluation.read_text()
        write_json_with_arrays(evaluation, {key: value for key, value in doc.items()
                                            if key not in ("content_sha256", "arrays_sha256")}, arrays)
        evaluation.write_text(old)


@pytest.mark.parametrize("edit", ["acc_mean", "stripped", "pred", "two runs"])
def test_every_reader_refuses_an_edited_or_mismatched_evaluation(study, tmp_path, capsys, edit):
    import shutil
    evaluation = tmp_path / "evaluation.json"
    shutil.copy(study["evaluation"], evaluation)
    shutil.copy(Path(study["evaluation"]).with_suffix(".npz"), evaluation.with_suffix(".npz"))
    main(["explore-index", "--pages", "p.html", "--evaluations", str(evaluation), "--out", str(tmp_path / "i.html")])
    _edit(evaluation, edit)
    named = str(evaluation.with_suffix(".npz") if edit in ("pred", "two runs") else evaluation)
    calls = {"explore": ["--cache", study["cache"], "--calibration", study["calibration"], "--evaluation",
                         str(evaluation), "--out", str(tmp_path / "p2.html")],
             "explore-index": ["--pages", "p.html", "--evaluations", str(evaluation), "--out", str(tmp_path / "i2.html")],
             "report": ["confusion", "--predictions", str(evaluation.with_suffix(".npz")), "--out",
                        str(tmp_path / "c.png")]}
    for command, argv in calls.items():
        with pytest.raises(SystemExit):
            main([command, *argv])
        error = capsys.readouterr().err.strip().splitlines()
        assert len(error) == 1 and error[0].startswith(f"ladbench {command}: error: {named}: "), error
        assert "`ladbench evaluate`" in error[0], error
    assert not any(tmp_path.glob("*2.html")) and not (tmp_path / "c.png").exists()


def test_without_an_image_table_the_page_names_the_images(study):
    document = explorer_document(study["cache"], study["calibration"], study["evaluation"])
    assert document["thumbnails"] == [] and len(document["image_ids"]) == 48
    assert document["inputs"]["benchmark"] == study["benchmark"]     # the path the cache records
    assert "explorer-data" in render_page(document)


# --------------------------------------------------------------------------- in a browser


def facet_counts(groups: dict[str, dict[str, np.ndarray]], choice: dict[str, str]) -> dict[str, dict[str, int]]:
    """What the page must show next to every option: the cards that pass every OTHER group's
    choice and match the option (numpy, from the files)."""
    passing = {g: options[choice.get(g, "any")] for g, options in groups.items()}
    counts = {}
    for g, options in groups.items():
        others = np.logical_and.reduce([passing[h] for h in groups if h != g] + [np.ones_like(passing[g])])
        counts[g] = {option: int((others & mask).sum()) for option, mask in options.items()}
    return counts


def filter_groups(evaluation: str | Path) -> dict[str, dict[str, np.ndarray]]:
    """The page's filters as masks over its cards (instance-major), from the evaluation's files."""
    names = json.loads(Path(evaluation).read_text())["methods"]
    with np.load(Path(evaluation).with_suffix(".npz")) as npz:
        target = npz["target_pos"]
        predictions = {f"pred_{m}": npz[f"pred_{m}"] for m in names}
    flags = {name: value.ravel() for name, value in card_flags(predictions, target).items()}
    every = np.ones(target.size, dtype=bool)
    groups = {f"filter-right-{m}": {"any": every, "right": flags[f"right_{m}"], "wrong": ~flags[f"right_{m}"]} for m in names}
    divergence = {m: flags[f"divergence_{m}"] for m in ("raw_attention", "purified_attention") if f"divergence_{m}" in flags}
    if divergence:
        groups["filter-divergence"] = {"any": every, **divergence}
    groups["filter-target"] = {"any": every, **{str(p): target.ravel() == p for p in range(target.max() + 1)}}
    ordering = np.tile(np.arange(target.shape[1]), target.shape[0])
    groups["filter-ordering"] = {"any": every, **{str(t): ordering == t for t in range(target.shape[1])}}
    return groups


def shown_counts(driver, groups) -> tuple[dict[str, dict[str, int]], int]:
    from selenium.webdriver.common.by import By

    counts = {g: {option.get_attribute("value"): int(option.get_attribute("data-count"))
                  for option in driver.find_elements(By.CSS_SELECTOR, f"#{g} option")} for g in groups}
    return counts, int(driver.find_element(By.ID, "match-count").get_attribute("data-count"))


def check_page(driver, page: str | Path, evaluation: str | Path, cache: str | Path, choices: list[dict[str, str]]) -> None:
    """Cards against the evaluation, every filter's counts against numpy, one instance's detail,
    keyboard, and no console error."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    doc = json.loads(Path(evaluation).read_text())
    open_page(driver, page)
    cards = doc["n_instances"] * doc["n_orderings"]
    select(driver, "page-size", "all")
    shown = driver.find_elements(By.CSS_SELECTOR, "#cards .card")
    assert len(shown) == cards
    pairs = {(int(c.get_attribute("data-instance")), int(c.get_attribute("data-ordering"))) for c in shown}
    assert pairs == {(i, t) for i in range(doc["n_instances"]) for t in range(doc["n_orderings"])}

    groups = filter_groups(evaluation)
    current: dict[str, str] = {}
    for choice in [{}, *choices]:
        for group in groups:
            if current.get(group, "any") != choice.get(group, "any"):
                select(driver, group, choice.get(group, "any"))
        current = choice
        counts, matching = shown_counts(driver, groups)
        expected = facet_counts(groups, choice)
        assert counts == expected, choice
        assert matching == expected["filter-ordering"][choice.get("filter-ordering", "any")]
        assert len(driver.find_elements(By.CSS_SELECTOR, "#cards .card")) == matching
    driver.find_element(By.ID, "reset").click()

    first, second = driver.find_elements(By.CSS_SELECTOR, "#cards .card")[:2]
    driver.execute_script("arguments[0].focus()", first)
    first.send_keys(Keys.ARROW_DOWN)
    assert driver.switch_to.active_element == second
    second.send_keys(Keys.ENTER)
    dialog = driver.find_element(By.ID, "detail")
    assert dialog.get_attribute("open") is not None
    rows = driver.find_elements(By.CSS_SELECTOR, "#heat-map tr[data-layer]")
    assert len(rows) == read_cache(str(cache)).attrs["n_layers"]
    assert len(driver.find_elements(By.CSS_SELECTOR, "#detail-body .orderings > div")) == doc["n_orderings"]
    driver.switch_to.active_element.send_keys(Keys.ESCAPE)
    assert dialog.get_attribute("open") is None
    assert console_errors(driver) == []


@needs_browser
def test_the_page_in_a_browser(study):
    groups = filter_groups(study["evaluation"])
    assert groups["filter-divergence"]["raw_attention"].any()          # the planted divergence is there to find
    choices = [{"filter-divergence": "raw_attention"}, {"filter-right-lad": "right", "filter-target": "0"},
               {"filter-right-vanilla": "wrong", "filter-ordering": "2", "filter-right-pride": "right"}]
    with headless_chromium() as driver:
        check_page(driver, study["page"], study["evaluation"], study["cache"], choices)
        # sorted by the gap, the first card is the row with the largest (rounded) gap
        gap = _unpacked(page_document(study["page"])["arrays"]["gap"]).ravel()
        select(driver, "sort", "gap-desc")
        from selenium.webdriver.common.by import By
        first = driver.find_element(By.CSS_SELECTOR, "#cards .card")
        assert int(first.get_attribute("data-card")) == int(np.argmax(gap))
        # the index: one row linking the page, with its divergence count, filterable by setting
        index = Path(study["page"]).parent / "index.html"
        main(["explore-index", "--pages", study["page"], "--evaluations", study["evaluation"], "--out", str(index)])
        open_page(driver, index)
        row = driver.find_element(By.CSS_SELECTOR, "#pages tr[data-setting]")
        assert row.find_element(By.TAG_NAME, "a").get_attribute("href") == Path(study["page"]).resolve().as_uri()
        assert str(int(groups["filter-divergence"]["raw_attention"].sum())) in row.text
        assert [o.text for o in driver.find_elements(By.CSS_SELECTOR, "#filter-setting option")] == ["any (1)", "random (1)"]
        assert console_errors(driver) == []


#: Inputs that left the page blank (issue #35): comment- and script-like text in captions, and
#: `<!--` in the output folder (the page records its input paths).
PAYLOADS = ("<!--<script>", "a <script>alert(1)</script> b", "</script><!--", "<!-- x", "\u2028<SCRIPT")


@pytest.fixture(scope="module")
def hostile_study(tmp_path_factory) -> dict[str, str]:
    folder = tmp_path_factory.mktemp("explorer") / "out <!--<script>"
    files = build_study(folder, instances=5, caption_texts=PAYLOADS)
    page, index = folder / "page.html", folder / "index.html"
    main(["explore", "--cache", files["cache"], "--calibration", files["calibration"], "--evaluation", files["evaluation"],
          "--images", files["images"], "--out", str(page)])
    main(["explore-index", "--pages", str(page), "--evaluations", files["evaluation"], "--out", str(index)])
    return {**files, "page": str(page), "index": str(index)}


def test_script_like_inputs_are_data_in_the_page(hostile_study):
    text = Path(hostile_study["page"]).read_text()
    data = re.search(r'<script id="explorer-data" type="application/json">(.*?)</script>', text, re.S).group(1)
    assert "<" not in data and ">" not in data
    captions = json.loads(data)["captions"]
    assert [caption.split(" ", 4)[4] for caption in captions] == [PAYLOADS[i % len(PAYLOADS)] for i in range(5)]
    assert "<!--<script>" in json.loads(data)["inputs"]["cache"]


def test_a_page_that_would_not_render_is_refused(hostile_study, tmp_path, monkeypatch, capsys):
    """The explorer checks its own output: with the old escaping (only ``</`` escaped) these
    inputs gave a blank page that `ladbench explore` called a success."""
    from ladbench.report import explorer
    monkeypatch.setattr(explorer, "_script_json", lambda document: json.dumps(document).replace("</", "<\\/"))
    out = tmp_path / "p.html"
    with pytest.raises(SystemExit):
        main(["explore", "--cache", hostile_study["cache"], "--calibration", hostile_study["calibration"],
              "--evaluation", hostile_study["evaluation"], "--out", str(out)])
    error = capsys.readouterr().err.strip().splitlines()
    assert error == [f"ladbench explore: error: {out}: the page would not render its cards (a script holds '<!--', "
                     "'<script' or '</script'); not written"]
    assert not out.exists()


@needs_browser
def test_script_like_inputs_render_in_a_browser(hostile_study):
    """Headless Chromium: every card is there, the captions read as written, no script ran."""
    from selenium.webdriver.common.by import By

    with headless_chromium() as driver:
        open_page(driver, hostile_study["page"])
        select(driver, "page-size", "all")
        assert len(driver.find_elements(By.CSS_SELECTOR, "#cards .card")) == 5 * 3
        text = driver.find_element(By.ID, "cards").text
        for payload in PAYLOADS:
            assert payload.strip("\u2028") in text, payload
        assert driver.execute_script("return document.querySelectorAll('script').length") == 2
        assert console_errors(driver) == []
        open_page(driver, hostile_study["index"])
        assert len(driver.find_elements(By.CSS_SELECTOR, "#pages tr[data-setting]")) == 1
        assert console_errors(driver) == []


@needs_browser
@pytest.mark.slow
def test_the_demo_explorer_pages_in_a_browser(demo_run):
    from selenium.webdriver.common.by import By

    out = demo_run / "results" / "demo" / "report" / "explorer"
    pages = sorted(p for p in out.rglob("*.html") if p.name != "index.html")
    assert len(pages) == 2          # tiny_qwen2_5_vl x 2 benchmarks x the vanilla cache (instruction has no calibration)
    with headless_chromium() as driver:
        for page in pages:
            inputs = page_document(page)["inputs"]        # the page names the files it was made from
            choices = [{"filter-divergence": "raw_attention"}, {"filter-right-lad": "wrong", "filter-target": "1"}]
            check_page(driver, page, demo_run / inputs["evaluation"], demo_run / inputs["cache"], choices)
            assert "mechanics, not results" in driver.find_element(By.ID, "kind-banner").text
        open_page(driver, out / "index.html")
        rows = driver.find_elements(By.CSS_SELECTOR, "#pages tr[data-setting]")
        assert sorted(r.find_element(By.TAG_NAME, "a").get_attribute("href").rsplit("/", 1)[1] for r in rows) == \
            sorted(p.name for p in pages)
        select(driver, "filter-setting", "adversarial")
        assert driver.find_element(By.ID, "match-count").get_attribute("data-count") == "1"
        assert console_errors(driver) == []
