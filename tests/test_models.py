import pytest
import torch

from course_lib.models import MODELS, LeNet5, LeNet300, Net, build_model, count_parameters


@pytest.mark.parametrize("name,count", [("net", 21_840), ("lenet300", 266_610), ("lenet5", 431_080)])
def test_parameter_counts(name, count):
    assert count_parameters(build_model(name)) == count


@pytest.mark.parametrize("name", sorted(MODELS))
def test_logits_shape_for_a_batch_and_a_single_image(name):
    model = build_model(name).eval()
    assert model(torch.randn(3, 1, 28, 28)).shape == (3, 10)
    assert model(torch.randn(1, 1, 28, 28)).shape == (1, 10)


def test_net_has_the_classic_layers():
    keys = [k for k in Net().state_dict()]
    assert keys == ["conv1.weight", "conv1.bias", "conv2.weight", "conv2.bias",
                    "fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"]
    net = Net()
    assert (net.conv1.out_channels, net.conv2.out_channels, net.fc1.in_features, net.fc1.out_features) == (10, 20, 320, 50)


def test_net_dropout_only_in_training():
    net = Net()
    x = torch.randn(8, 1, 28, 28)
    net.eval()
    assert torch.equal(net(x), net(x))
    net.train()
    torch.manual_seed(0)
    assert not torch.equal(net(x), net(x))


def test_lenet_layer_sizes_match_the_paper():
    assert [m.out_features for m in (LeNet300().fc1, LeNet300().fc2, LeNet300().fc3)] == [300, 100, 10]
    m = LeNet5()
    assert (m.conv1.out_channels, m.conv2.out_channels, m.fc1.in_features, m.fc1.out_features) == (20, 50, 800, 500)


def test_unknown_model_is_refused_by_name():
    with pytest.raises(ValueError, match="model must be one of .*lenet300"):
        build_model("resnet")


def test_count_trainable_only():
    model = Net()
    model.fc2.requires_grad_(False)
    assert count_parameters(model, trainable_only=True) == 21_840 - 510


def test_max_diff_of_modules_tensor_lists_and_tensors():
    import math

    from course_lib.models import max_diff

    a, b = LeNet300(), LeNet300()
    b.load_state_dict(a.state_dict())
    assert max_diff(a, b) == 0.0
    with torch.no_grad():
        b.fc2.bias[3] += 0.25
    assert max_diff(a, b) == 0.25
    assert max_diff([p.detach() for p in a.parameters()], list(b.parameters())) == 0.25
    assert max_diff(torch.tensor([1.0, 2.0]), torch.tensor([1.5, 1.0])) == 1.0
    assert max_diff([torch.zeros(2).numpy()], [torch.ones(2).numpy()]) == 1.0   # numpy arrays (pipeline workers)
    assert max_diff([torch.zeros(0)], [torch.zeros(0)]) == 0.0 and max_diff([], []) == 0.0
    assert math.isnan(max_diff([torch.zeros(1), torch.tensor([float("nan")])], [torch.ones(1), torch.zeros(1)]))


def test_max_diff_refuses_mismatches():
    from course_lib.models import max_diff

    with pytest.raises(ValueError, match="parameters.*2 and 1"):
        max_diff([torch.zeros(1), torch.zeros(1)], [torch.zeros(1)])
    with pytest.raises(ValueError, match=r"shapes \(3,\) and \(1,\)"):
        max_diff(torch.zeros(3), torch.zeros(1))                 # broadcasting would hide this
    with pytest.raises(ValueError, match="None"):
        max_diff([torch.zeros(1)], [None])                         # a parameter that got no gradient
