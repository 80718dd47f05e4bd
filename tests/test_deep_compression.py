"""The Deep Compression pipeline on a tiny model and data, the paper's figures, and the quick benchmark."""
import json

import pytest
import torch
from torch import nn

from conftest import needs_mnist
from course_lib import bench
from course_lib.compression import pipeline as P
from course_lib.compression import storage as S
from course_lib.compression.kmeans import SharedWeights
from course_lib.data import TensorLoader
from course_lib.env import seed_everything
from course_lib.models import LeNet5, LeNet300, count_parameters
from course_lib.loop import evaluate


class Tiny(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(1, 4, 3)
        self.fc1 = nn.Linear(4 * 6 * 6, 32)
        self.fc2 = nn.Linear(32, 3)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(torch.relu(self.conv(x)).flatten(1))))


def blobs(n=600, seed=0):
    """Three classes of 8x8 images, each a noisy copy of its own random template."""
    g = torch.Generator().manual_seed(seed)
    templates = torch.randn(3, 1, 8, 8, generator=g)
    y = torch.randint(0, 3, (n,), generator=g)
    return templates[y] + 0.8 * torch.randn(n, 1, 8, 8, generator=g), y


CONFIG = {"keep": {"conv": 0.5, "fc1": 0.2, "fc2": 0.6}, "weight_bits": {"conv": 3, "fc1": 4, "fc2": 2},
          "index_bits": {"conv": 2, "fc1": 3, "fc2": 3}}


@pytest.fixture(scope="module")
def compressed():
    seed_everything(0)
    x, y = blobs()
    train = TensorLoader(x[:400], y[:400], batch_size=50, seed=0)
    val = TensorLoader(x[400:], y[400:], batch_size=200, shuffle=False)
    model = Tiny()
    P.train(model, train, 5, lr=3e-3)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    result = P.deep_compress(model, train, val, **CONFIG, prune_rounds=2, prune_epochs=2, share_epochs=2, lr=3e-3)
    return model, before, val, result


def test_the_trained_model_is_left_untouched(compressed):
    model, before, _, _ = compressed
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in before.items())


def test_every_layer_keeps_its_fraction_and_shares_its_values(compressed):
    _, _, _, r = compressed
    for name, keep in CONFIG["keep"].items():
        weight = r.model.get_submodule(name).weight
        assert int((weight != 0).sum()) == weight.numel() - round((1 - keep) * weight.numel())
        assert torch.equal(weight != 0, r.pruned.get_submodule(name).weight != 0)   # the masks held
        assert weight[weight != 0].unique().numel() <= 2 ** CONFIG["weight_bits"][name] - 1
    assert [round(k, 3) for k in r.rounds[0]["kept"].values()] != [round(k, 3) for k in r.rounds[-1]["kept"].values()]
    assert len(r.rounds) == 2


def test_the_decoded_model_is_the_fine_tuned_shared_model(compressed):
    _, _, val, r = compressed
    for name in CONFIG["keep"]:
        shared = r.shared.get_submodule(name)
        assert isinstance(shared, SharedWeights)
        assert torch.equal(r.model.get_submodule(name).weight, shared.weight().detach())
    assert r.compressed_accuracy == evaluate(r.model, val)[1] == pytest.approx(r.shared_accuracy)
    assert r.compressed_accuracy > 0.8 and r.baseline_accuracy > 0.8
    assert [n for n, p in r.shared.named_parameters() if p.requires_grad] == \
        [f"{n}.centroids" for n in CONFIG["keep"]]


def test_the_ratios_come_from_the_stored_bits(compressed):
    _, _, _, r = compressed
    bits = {name: S.layer_bits(layer) for name, layer in r.layers.items()}
    assert bits == r.bits
    assert r.total["dense"] == 32 * count_parameters(Tiny())
    assert r.file_ratio == r.total["dense"] / sum(b["pqh"] for b in bits.values())
    weights = 32 * sum(b["weights"] for b in bits.values())
    assert r.ratio == pytest.approx(weights / sum(b["pqh"] - b["bias"] for b in bits.values()))
    assert r.kept == sum(b["nonzero"] for b in bits.values()) / sum(b["weights"] for b in bits.values())


def test_share_layers_uses_at_most_the_survivors():
    layer = nn.Linear(10, 2)
    mask = torch.zeros(2, 10)
    mask[0, :3] = 1
    shared = P.share_layers(nn.Sequential(layer), {"0": mask}, {"0": 8})
    assert shared[0].k == 3 and (shared[0].indices >= 0).sum() == 3


def test_bad_configs_are_refused():
    model = Tiny()
    x, y = blobs(20)
    loader = TensorLoader(x, y, batch_size=10)
    with pytest.raises(ValueError, match="one entry per Linear/Conv2d layer"):
        P.deep_compress(model, loader, loader, {"fc1": 0.5}, CONFIG["weight_bits"], CONFIG["index_bits"])
    with pytest.raises(ValueError, match=r"fractions in \(0, 1\]"):
        P.deep_compress(model, loader, loader, {**CONFIG["keep"], "fc1": 0.0}, CONFIG["weight_bits"],
                        CONFIG["index_bits"])
    with pytest.raises(ValueError, match="prune_rounds"):
        P.deep_compress(model, loader, loader, **CONFIG, prune_rounds=0)
    with pytest.raises(ValueError, match="lenet300"):
        P.paper_config("alexnet")


def test_the_papers_figures_are_consistent_with_each_other_and_our_models():
    for name, model in (("lenet300", LeNet300()), ("lenet5", LeNet5())):
        paper, config = P.PAPER[name], P.paper_config(name)
        assert set(config["keep"]) == {n for n, m in model.named_modules() if isinstance(m, (nn.Linear, nn.Conv2d))}
        t1 = paper["table1"]
        assert abs(t1["kb_ref"] / t1["kb_compressed"] - t1["ratio"]) < 1           # 1070 / 27 = 39.6 ~ 40x
        assert abs(t1["kb_ref"] - 4 * count_parameters(model) / 1000) < 5           # KB = 1000 bytes of fp32
        assert abs(1 / paper["layers"]["total"].rate_pqh - t1["ratio"]) < 1         # Table 2/3 total = Table 1
    assert P.paper_config("lenet300")["keep"] == {"fc1": 0.08, "fc2": 0.09, "fc3": 0.26}
    assert P.paper_config("lenet5")["weight_bits"] == {"conv1": 8, "conv2": 8, "fc1": 5, "fc2": 5}
    assert set(P.paper_config("lenet5")["index_bits"].values()) == {5}


def test_tables_show_our_numbers_beside_the_papers(compressed):
    _, _, _, r = compressed
    fake = P.DeepCompressionResult(**{**r.__dict__, "bits": {"fc1": r.bits["fc1"]}})
    rows = P.paper_rows({"lenet300": r})
    assert [row["stage"] for row in rows] == ["reference", "pruned (2015)", "pruned + shared", "+ Huffman"]
    assert rows[-1]["ratio ours"] == f"{r.ratio:.1f}x" and rows[-1]["ratio paper"] == "40x"
    assert rows[-1]["error % ours"] == f"{100 * (1 - r.compressed_accuracy):.2f}"
    layer_rows = P.layer_rows("lenet300", fake)
    assert [row["layer"] for row in layer_rows] == ["fc1", "total"]
    assert layer_rows[0]["kept % (P)"].startswith("8 / ")
    with pytest.raises(ValueError, match="keyed by"):
        P.paper_rows({"alexnet": r})


@pytest.mark.slow
@needs_mnist
def test_quick_benchmark_keys(capsys):
    assert bench.main(["compression", "--quick", "--json"]) == 0
    out = capsys.readouterr().out
    summary = json.loads(out.strip().splitlines()[-1])
    keys = {"benchmark", "lenet300_ratio", "lenet300_file_ratio", "lenet300_drop_pp", "lenet300_baseline_accuracy",
            "lenet5_ratio", "lenet5_file_ratio", "lenet5_drop_pp", "lenet5_baseline_accuracy", "int8_api",
            "int8_speedup", "int8_size_ratio", "int8_drop_pp", "structured_speedup", "data", "quick"}
    assert keys <= set(summary) and summary["quick"] is True and summary["benchmark"] == "compression"
    assert summary["lenet300_ratio"] > summary["lenet300_file_ratio"] > 20 and summary["lenet5_ratio"] > 20
    assert summary["data"].startswith("1,000 of the ") and summary["int8_size_ratio"] > 3
    assert "Table 2" in out and "Table 3" in out and "ratio paper" in out


def test_codebooks_fillers_streams_and_per_layer_bits_as_lecture_14_shows_them(compressed):
    from collections import Counter

    from course_lib.compression import huffman
    _, _, _, r = compressed
    for name, layer in r.layers.items():
        assert layer.codebook.numel() == 2 ** CONFIG["weight_bits"][name]          # code 0 (the 0.0) included
        codes, gaps = huffman.decode(layer.codes), huffman.decode(layer.gaps)
        assert codes.count(0) == layer.fillers and len(codes) == len(gaps) == layer.entries
        for symbols, stream in ((codes, layer.codes), (gaps, layer.gaps)):
            entropy = huffman.entropy(Counter(symbols))
            assert entropy - 1e-9 <= stream.nbits / len(symbols) < entropy + 1
        b = r.bits[name]
        assert b["pqh"] == b["codes_huffman"] + b["gaps_huffman"] + b["tables"] + b["codebook"] + b["bias"] + b["count"]
        assert b["codes_huffman"] == layer.codes.nbits and b["entries"] == b["nonzero"] + b["fillers"]
    assert r.total["pqh"] == sum(b["pqh"] for b in r.bits.values())
