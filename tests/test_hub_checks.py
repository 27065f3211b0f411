"""The start-up checks of a hub model not downloaded yet (ladbench.model_checks): its
``config.json`` alone fetched into the Hugging Face cache by ``ladbench where`` and by the
workflow's start of a run, never by a dry run; one failed connection ends the fetching with
one warning. No network here: the download and the hub's answer are stand-ins."""
from __future__ import annotations

import json

import pytest

from ladbench import model_checks
from ladbench.cli import main
from ladbench.config import ConfigError
from test_inputs import refused
from test_user_errors import demo_config

current_lane = pytest.mark.current_lane("family auto runs on the current lane")
LAD = {"top_k": 2, "k_beyond_range": "lower", "windowed_layers": "refuse", "layers_beyond_depth": "clip"}
COMMIT = "0123456789abcdef0123456789abcdef01234567"


def hub_model(path: str, family: str = "qwen2_5_vl", revision: str = "main") -> dict:
    return {"family": family, "path": path, "revision": revision, "tiny": False}


def study(tmp_path, **models) -> dict:
    return {"output_dir": str(tmp_path), "lad": dict(LAD), "models": models}


class Hub(dict):
    """The hub as ``repo_id -> config.json`` (an exception: what fetching it raises); ``calls``:
    each download asked for, ``(repo_id, revision)``."""

    def __init__(self, folder):
        super().__init__()
        self.folder, self.calls = folder, []

    def download(self, repo_id, revision):
        self.calls.append((repo_id, revision))
        if isinstance(self[repo_id], Exception):
            raise self[repo_id]
        file = self.folder / repo_id / "config.json"
        file.parent.mkdir(parents=True, exist_ok=True)
        file.write_text(json.dumps(self[repo_id]))
        return str(file)


@pytest.fixture
def hub(tmp_path, monkeypatch):
    """A hub that answers, with no network: its downloads do not fill the Hugging Face cache."""
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(model_checks, "hub_unreachable", lambda: None)
    stand_in = Hub(tmp_path / "fetched")
    monkeypatch.setattr(model_checks, "download_config", stand_in.download)
    return stand_in


class _Answered(Exception):
    """An error after the server answered (gated, missing): it carries the response."""

    def __init__(self, status_code: int):
        super().__init__(f"{status_code} Client Error")
        self.response = type("Response", (), {"status_code": status_code})()


@current_lane
def test_a_refused_architecture_on_the_hub_is_refused_before_any_job(hub, tmp_path, capsys):
    """Mllama's config.json, fetched alone: one line naming models.<key> and the cause, from
    ``ladbench where`` and from the workflow's start of a run; its start-up (the Snakefile read,
    a dry run) reads the cache only and fetches nothing."""
    from ladbench.workflow import start_run
    hub["meta-llama/Llama-3.2-11B-Vision-Instruct"] = {"model_type": "mllama"}
    config = study(tmp_path, llama_vision=hub_model("meta-llama/Llama-3.2-11B-Vision-Instruct", "auto"))
    assert model_checks.check_models(config, "s.yaml") == [] and hub.calls == []       # not fetched: unchecked
    with pytest.raises(ConfigError, match=r"^s\.yaml: models\.llama_vision: family auto cannot run architecture "
                                          r"'mllama': images enter the decoder through cross-attention layers"):
        model_checks.check_models(config, "s.yaml", fetch=True)
    assert hub.calls == [("meta-llama/Llama-3.2-11B-Vision-Instruct", "main")]
    with pytest.raises(ConfigError, match=r"^s\.yaml: models\.llama_vision: family auto cannot run architecture "
                                          r"'mllama'"):
        start_run(config, ["s.yaml"])
    path = demo_config(tmp_path, lambda c: c["models"].update(
        llama_vision={"family": "auto", "path": "meta-llama/Llama-3.2-11B-Vision-Instruct"}))
    refused(capsys, lambda: main(["where", "--configfile", path]),
            "models.llama_vision: family auto cannot run architecture 'mllama': images enter the decoder")


def test_a_failed_connection_ends_the_fetching_with_one_warning(hub, tmp_path):
    """The first download fails without an answer: the other models are not tried, and one
    warning names all three as checked at load."""
    hub["a/one"] = ConnectionError("Name or service not known")
    hub["a/two"] = hub["a/three"] = {"model_type": "qwen2_5_vl"}
    config = study(tmp_path, one=hub_model("a/one"), two=hub_model("a/two"), three=hub_model("a/three"))
    warnings = model_checks.check_models(config, "s.yaml", fetch=True)
    assert hub.calls == [("a/one", "main")]
    assert warnings == ["models.one, models.two, models.three: config.json not fetched from the hub (a/one at main: "
                        "ConnectionError; the hub stopped answering (ConnectionError)): checked when their infer job "
                        "loads them, not at start-up"]


def test_no_answer_from_the_hub_tries_no_download(hub, tmp_path, monkeypatch):
    """The hub's one probe fails: no model is tried (no retries of each download on a dead network);
    with HF_HUB_OFFLINE set, the hub is not even asked."""
    asked = []
    monkeypatch.setattr(model_checks, "hub_unreachable", lambda: asked.append(1) or "no answer from X within 3 s")
    hub["a/one"] = hub["a/two"] = {"model_type": "qwen2_5_vl"}
    config = study(tmp_path, one=hub_model("a/one"), two=hub_model("a/two"))
    assert model_checks.check_models(config, "s.yaml", fetch=True) == [
        "models.one, models.two: config.json not fetched from the hub (no answer from X within 3 s): checked when "
        "their infer job loads them, not at start-up"]
    assert asked == [1] and hub.calls == []
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert "(HF_HUB_OFFLINE is set)" in model_checks.check_models(config, "s.yaml", fetch=True)[0]
    assert asked == [1] and hub.calls == []


def test_a_model_the_server_refuses_does_not_stop_the_others(hub, tmp_path):
    """A gated repository answers 401: that model is left to its infer job, the next is fetched."""
    hub["gated/one"] = _Answered(401)
    hub["a/two"] = {"model_type": "qwen2_5_vl"}
    config = study(tmp_path, one=hub_model("gated/one"), two=hub_model("a/two", revision=COMMIT))
    warnings = model_checks.check_models(config, "s.yaml", fetch=True)
    assert hub.calls == [("gated/one", "main"), ("a/two", COMMIT)]          # the revision passed through
    assert [w for w in warnings if "not fetched" in w] == [
        "models.one: config.json not fetched from the hub (gated/one at main: _Answered 401): checked when their "
        "infer job loads them, not at start-up"]


def test_only_hub_models_missing_from_the_cache_are_fetched(hub, tmp_path):
    """A local folder and a tiny model (built or not) are never fetched; the run's start checks
    only the models the Snakefile's read could not, so its warnings are not said twice."""
    folder = tmp_path / "local"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "a_local_test_type", "num_hidden_layers": 4}))
    hub["a/two"] = {"model_type": "qwen2_5_vl"}
    config = study(tmp_path, local=dict(hub_model(str(folder)), layer_range=[0, 9]),
                   tiny={"family": "qwen2_5_vl", "tiny": True}, two=hub_model("a/two", revision=COMMIT))
    past_the_depth = "models.local: its layer range 0:9 runs past its 4 decoder layers: LAD searches layers 0-3"
    assert model_checks.check_models(config, "s.yaml") == [past_the_depth] and hub.calls == []
    assert past_the_depth in model_checks.check_models(config, "s.yaml", fetch=True)
    assert hub.calls == [("a/two", COMMIT)]
    assert past_the_depth not in model_checks.check_hub_models(config, "s.yaml")
    assert hub.calls == [("a/two", COMMIT)] * 2             # the stand-in does not fill the cache: asked again


def test_the_download_is_config_json_alone_at_the_revision_into_the_cache(monkeypatch):
    """What a user with a network runs: huggingface_hub's download of config.json at the model's
    revision (into the cache the model's download reads), and one probe with the short timeout."""
    import huggingface_hub
    from huggingface_hub import utils
    asked = {}
    monkeypatch.setattr(huggingface_hub, "hf_hub_download", lambda *args, **kw: asked.update(args=args, kw=kw) or "f")
    assert model_checks.download_config("org/model", COMMIT) == "f"
    assert asked == {"args": ("org/model", "config.json"),
                     "kw": {"revision": COMMIT, "etag_timeout": model_checks.HUB_TIMEOUT_S}}

    class Session:
        def head(self, url, timeout):
            asked.update(url=url, timeout=timeout)
            raise ConnectionError("no route")
    monkeypatch.setattr(utils, "get_session", lambda: Session())
    assert model_checks.hub_unreachable().endswith(f"within {model_checks.HUB_TIMEOUT_S} s: ConnectionError")
    assert asked["timeout"] == model_checks.HUB_TIMEOUT_S and asked["url"].startswith("http")


#: a plugin (the config's ``plugins``) that stands in for the hub inside Snakemake's own process
FAKE_HUB = '''
import json, os
from ladbench import model_checks

def download(repo_id, revision):
    with open(os.environ["FAKE_HUB_LOG"], "a") as log:
        log.write(f"{repo_id} {revision}\\n")
    file = os.path.join(os.path.dirname(os.environ["FAKE_HUB_LOG"]), "config.json")
    with open(file, "w") as f:
        json.dump({"model_type": "a_test_type", "num_hidden_layers": 4, "sliding_window": 16}, f)
    return file

model_checks.hub_unreachable = lambda: None
model_checks.download_config = download
'''


@pytest.mark.slow
def test_a_run_fetches_and_refuses_before_any_job_and_a_dry_run_fetches_nothing(tmp_path):
    """The workflow on the demo plus a hub model whose config.json (fetched) has a sliding window
    on every layer of its given range: a dry run plans it without asking the hub; a run asks the
    hub once, at its start, and stops in one line naming the key before any job."""
    import subprocess

    import yaml
    from workflow_runner import DEMO_CONFIG, environment, snakemake_command
    (tmp_path / "plugin").mkdir()
    (tmp_path / "plugin" / "fake_hub.py").write_text(FAKE_HUB)
    config = yaml.safe_load(DEMO_CONFIG.read_text())
    config.update(output_dir=str(tmp_path / "study"), plugins=["fake_hub"])
    config["models"]["windowed"] = {"family": "qwen2_5_vl", "path": "org/windowed", "layer_range": [0, 3]}
    configfile = tmp_path / "config.yaml"
    configfile.write_text(yaml.safe_dump(config))
    log = tmp_path / "fetched.log"
    env = {"PYTHONPATH": str(tmp_path / "plugin"), "FAKE_HUB_LOG": str(log), "HF_HUB_OFFLINE": "0"}
    (tmp_path / "work").mkdir()
    command = snakemake_command(tmp_path / "work", "--cores", "1", configfile=configfile)
    dry = subprocess.run(command + ["--dry-run"], capture_output=True, text=True, env=environment(env), timeout=600)
    assert dry.returncode == 0 and "rule infer:" in dry.stdout + dry.stderr and not log.exists()
    run = subprocess.run(command, capture_output=True, text=True, env=environment(env), timeout=600)
    output = run.stdout + run.stderr
    assert run.returncode != 0 and "models.windowed.layer_range: layers 0-3 of the range have a sliding window of 16 " \
                                   "tokens" in output, output[-3000:]
    assert "Traceback" not in output and log.read_text() == "org/windowed main\n"
    assert not (tmp_path / "study" / "data").exists()                          # no job ran


def test_layers_windowed_over_generated_tokens_only_count_as_seeing_the_prompt(tmp_path):
    """Unlimited-OCR's ``reference_sliding_attention``: a window over generated tokens only, the
    prompt seen whole. Its layers are attention layers without a window for the readout, so the
    start-up checks read its range (they skip hybrid decoders, read when loaded)."""
    from ladbench.windows import layer_windows
    folder = tmp_path / "ocr"
    folder.mkdir()
    text = {"num_hidden_layers": 4, "sliding_window": 16, "layer_types": ["reference_sliding_attention"] * 4}
    (folder / "config.json").write_text(json.dumps({"model_type": "a_local_test_type", **text}))
    assert layer_windows(text) == [0, 0, 0, 0]
    config = study(tmp_path, ocr=dict(hub_model(str(folder)), layer_range=[0, 9]))
    assert model_checks.check_models(config, "s.yaml") == [
        "models.ocr: its layer range 0:9 runs past its 4 decoder layers: LAD searches layers 0-3"]
