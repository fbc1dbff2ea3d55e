"""Workload spec validation: every bad input names the field, the value and the fix."""

from pathlib import Path

import pytest

from predictor.spec.workload import SpecError, load_spec, parse_spec

ROOT = Path(__file__).resolve().parents[1]


def _spec(**over):
    data = {"model": {"family": "gpt", "hidden": 1024, "layers": 4, "heads": 16, "seq_len": 512, "vocab": 50304},
            "training": {"global_batch": 16}, "cluster": {"device": "a100-80gb", "nodes": 1, "gpus_per_node": 8}}
    for section, values in over.items():
        data[section] = {**data[section], **values}
    return data


def test_examples_load():
    gpt = load_spec(ROOT / "examples" / "gpt3-175b-a100x1024.yaml")
    assert (gpt.model.hidden, gpt.model.layers, gpt.model.heads) == (12288, 96, 96)
    assert gpt.cluster.gpus == 1024
    bert = load_spec(ROOT / "examples" / "bert-cpu2.yaml")
    assert bert.cluster.device == "cpu" and bert.cluster.gpus == 2


def test_yaml_syntax_error_names_line(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("model:\n  preset: gpt3-175b\ntraining: [global_batch: 8\ncluster:\n  device: cpu\n")
    with pytest.raises(SpecError, match=r"YAML syntax error at line \d+"):
        load_spec(path)


def test_unknown_device_lists_known_ones():
    with pytest.raises(SpecError, match=r"cluster.*unknown device 'a200'.*a100-80gb"):
        parse_spec(_spec(cluster={"device": "a200"}))


def test_heads_must_divide_hidden():
    with pytest.raises(SpecError, match=r"heads=12 must divide hidden=1000"):
        parse_spec(_spec(model={"hidden": 1000, "heads": 12}))


@pytest.mark.parametrize("value", [0, -4])
def test_non_positive_batch(value):
    with pytest.raises(SpecError, match=r"training\.global_batch.*greater than 0.*got " + str(value)):
        parse_spec(_spec(training={"global_batch": value}))


def test_unknown_key_and_missing_dims():
    with pytest.raises(SpecError, match=r"training\.batch"):
        parse_spec(_spec(training={"batch": 3}))
    with pytest.raises(SpecError, match=r"needs seq_len"):
        parse_spec({**_spec(), "model": {"family": "gpt", "hidden": 64, "layers": 2, "heads": 4, "vocab": 100}})


def test_missing_file_is_a_spec_error(tmp_path):
    with pytest.raises(SpecError, match="cannot read spec"):
        load_spec(tmp_path / "nope.yaml")


def test_a_relative_device_profile_is_relative_to_the_spec_file(tmp_path, monkeypatch):
    import shutil

    (tmp_path / "specs").mkdir()
    shutil.copy(ROOT / "predictor/data/cpu/device.json", tmp_path / "specs" / "mine.json")
    text = (ROOT / "examples/bert-cpu2.yaml").read_text() + "  device_profile: mine.json\n"
    (tmp_path / "specs" / "bert.yaml").write_text(text)
    monkeypatch.chdir(tmp_path)  # not the spec's folder
    spec = load_spec("specs/bert.yaml")
    assert Path(spec.cluster.device_profile).samefile(tmp_path / "specs" / "mine.json")


def test_one_model_source_and_overrides():
    """A preset or an HF config may be overridden key by key; two sources, or a module with a family, are refused."""
    spec = parse_spec({**_spec(), "model": {"preset": "gpt3-125m", "layers": 2}})
    assert spec.model.layers == 2 and spec.model.hidden == parse_spec({**_spec(), "model": {"preset": "gpt3-125m"}}).model.hidden
    for model, named in (({"preset": "gpt3-125m", "module": "m:f"}, "preset and module"),
                         ({"family": "gpt", "module": "m:f"}, "module and family"),
                         ({}, "give one of: family")):
        with pytest.raises(SpecError, match=named):
            parse_spec({**_spec(), "model": model})
