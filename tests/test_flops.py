import pytest
import torch
from torch import nn

from course_lib.flops import count_flops, mfu, training_flops_per_image
from course_lib.models import Net, build_model


def net_flops_by_hand() -> dict:
    """Net's FLOPs per image, counted from the layer shapes as FlopCounterMode counts them.

    Multiply-adds (MACs) of the forward, per image:
      conv1  1->10, k5, 28x28 -> 24x24:  10*24*24 outputs x  1*5*5 = 144,000
      conv2 10->20, k5, 12x12 ->  8x8 :  20* 8* 8 outputs x 10*5*5 = 320,000
      fc1   320 -> 50                 :  320*50                    =  16,000
      fc2    50 -> 10                 :   50*10                    =     500
    2 FLOPs per MAC (a multiply and an add); bias adds, ReLU, pooling, dropout and the loss are
    elementwise and not counted. Backward: every layer computes the gradient of its weight (the
    forward's MACs again) and the gradient of its input (again the forward's MACs), except conv1,
    whose input is the image: nobody needs its gradient, so autograd does not compute it. Hence
    training = 3 x forward - 1 x conv1.
    """
    macs = {"conv1": 10 * 24 * 24 * 1 * 5 * 5, "conv2": 20 * 8 * 8 * 10 * 5 * 5, "fc1": 320 * 50, "fc2": 50 * 10}
    forward = 2 * sum(macs.values())
    return {"forward": forward, "training": 3 * forward - 2 * macs["conv1"]}


def test_net_training_flops_match_the_hand_count():
    hand = net_flops_by_hand()
    assert hand == {"forward": 961_000, "training": 2_595_000}
    assert training_flops_per_image(Net()) == pytest.approx(hand["training"], rel=0.01)
    x = torch.randn(8, 1, 28, 28)
    with torch.no_grad():
        assert count_flops(lambda: Net()(x)) / 8 == pytest.approx(hand["forward"], rel=0.01)


@pytest.mark.parametrize("name", ["net", "lenet300", "lenet5"])
def test_training_flops_do_not_depend_on_batch_size_or_device(name):
    model = build_model(name)
    per_image = training_flops_per_image(model, batch_size=4)
    assert per_image == training_flops_per_image(model, batch_size=32) > 0
    with torch.device("meta"):
        assert training_flops_per_image(build_model(name), batch_size=4) == per_image


def test_lenet300_training_is_three_forwards_but_the_first_input_gradient():
    # 784*300 + 300*100 + 100*10 MACs; fc1's input is the image: no input gradient
    macs = (784 * 300, 300 * 100, 100 * 10)
    assert training_flops_per_image(build_model("lenet300")) == 2 * (3 * sum(macs) - macs[0])


def test_counting_leaves_the_model_untouched():
    model = Net()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    rng = torch.get_rng_state()
    training_flops_per_image(model.eval())
    assert all(p.grad is None for p in model.parameters()) and not model.training
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert torch.equal(rng, torch.get_rng_state())          # no random numbers drawn (dropout runs on meta)


def test_mfu_is_achieved_over_peak():
    assert mfu(2e6, images_per_second=1000, peak_flops=1e10) == pytest.approx(0.2)


@pytest.mark.parametrize("args, name", [((0, 1, 1), "flops_per_image"), ((1, -1, 1), "images_per_second"),
                                        ((1, 1, 0), "peak_flops"), ((1, 1, None), "peak_flops")])
def test_mfu_bad_input(args, name):
    with pytest.raises(ValueError, match=name):
        mfu(*args)


def test_bad_arguments_are_refused_by_name():
    with pytest.raises(TypeError, match="fn"):
        count_flops(42)
    with pytest.raises(TypeError, match="model"):
        training_flops_per_image("net")
    with pytest.raises(ValueError, match="batch_size"):
        training_flops_per_image(nn.Linear(784, 10), batch_size=0)
