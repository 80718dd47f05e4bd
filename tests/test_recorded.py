"""course_lib.recorded: GPU output kept on CUDA, shown (with its label) where there is none."""
import json

import pytest

from course_lib import recorded


def test_a_recorder_keeps_what_a_cell_prints_and_saves_it(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv(recorded.ENV_VAR, raising=False)
    rec = recorded.Recorder("04_single_gpu")
    with rec.cell("bandwidth"):
        print("host -> GPU, pinned: 25.0 GB/s")
    rec.put("rates", {"DataLoader": 1000.0})
    rec.meta["data"] = "the offline 5k stand-in"
    assert "pinned: 25.0" in capsys.readouterr().out          # still printed as usual
    assert rec.save() is None and not list(tmp_path.iterdir())  # no folder named: nothing written
    monkeypatch.setenv(recorded.ENV_VAR, str(tmp_path))
    path = rec.save()
    assert path == tmp_path / "04_single_gpu.json"
    record = json.loads(path.read_text())
    assert record["cells"] == {"bandwidth": "host -> GPU, pinned: 25.0 GB/s\n"}
    assert record["values"] == {"rates": {"DataLoader": 1000.0}}
    assert {"device", "date", "torch", "cuda", "course_lib"} <= set(record["meta"])

    assert recorded.show("04_single_gpu", "bandwidth", folder=tmp_path)
    shown = capsys.readouterr().out
    assert "pinned: 25.0 GB/s" in shown and f"recorded on {record['meta']['device']}" in shown
    assert "data: the offline 5k stand-in" in shown
    assert recorded.values("04_single_gpu", "rates", folder=tmp_path) == {"DataLoader": 1000.0}


def test_a_missing_recording_is_a_note_not_an_error(tmp_path, capsys):
    assert recorded.show("99_nothing", "cell", folder=tmp_path) is False
    assert "No GPU recording of 'cell'" in capsys.readouterr().out
    assert recorded.values("99_nothing", "cell", folder=tmp_path) is None
    assert recorded.load("99_nothing", folder=tmp_path) is None


@pytest.mark.parametrize("name", ["", "../x", ".hidden", 4, None])
def test_bad_names_are_refused(name):
    with pytest.raises(ValueError, match="lecture"):
        recorded.Recorder(name)
    with pytest.raises(ValueError, match="name"):
        recorded.show("04_single_gpu", name)


def test_values_must_be_storable():
    with pytest.raises(TypeError):
        recorded.Recorder("04_single_gpu").put("model", object())


@pytest.mark.parametrize("lecture, cells, values", [
    ("04_single_gpu", {"bandwidth", "non_blocking", "resident", "synchronize", "autocast"}, {"rates"}),
    ("11_mixed_precision", {"gpu_training", "cli_fp16"}, {"images_per_second", "peak_mib"}),
])
def test_the_shipped_recordings_cover_every_gpu_cell_and_name_a_gpu(lecture, cells, values):
    """What lectures 04 and 11 show on a CPU: recorded on CUDA, with every cell they ask for."""
    record = recorded.load(lecture)
    assert record is not None, f"course_lib/recorded/{lecture}.json is missing: run tools/gpu_check.sh on a GPU"
    assert record["meta"]["cuda"] and not record["meta"]["quick"]
    assert cells <= set(record["cells"]) and values <= set(record["values"])
    assert all(text.strip() for text in record["cells"].values())
